"""Payments from Event Hubs (CloudEvents) posted to account balances in Table Storage, each event
once whatever the host replays. Settings: STORAGE_TABLE_ENDPOINT (identity), or STORAGE_CONNECTION
(a connection string, local runs)."""

import os
import typing
from typing import Any

import azure.functions as func
from azure.identity.aio import DefaultAzureCredential

from shared import DedupKey, EventView, aio, request_hash


def table(name: str) -> aio.TableIdempotencyStore:
    if connection := os.environ.get("STORAGE_CONNECTION"):
        return aio.TableIdempotencyStore.from_connection_string(connection, table_name=name)
    return aio.TableIdempotencyStore(os.environ["STORAGE_TABLE_ENDPOINT"], DefaultAzureCredential(),
                                     table_name=name)


def parse(event: EventView, partition_id: str) -> dict[str, Any]:
    cloud_event = event.cloud_event()
    return {"id": cloud_event.id, "source": cloud_event.source, **cloud_event.data}


async def post(tx: aio.Transaction, payments: list[dict[str, Any]]) -> list[dict[str, int]]:
    """One account's payments, in order: its balance written once, the balance after each kept."""
    account = await tx.read("balance")
    balance = account.body["cents"] if account else 0
    after = []
    for payment in payments:
        balance += int(payment["cents"])
        after.append({"balance": balance})
    if account is None:
        tx.create("balance", {"cents": balance})
    else:
        tx.replace("balance", {"cents": balance}, etag=account.etag)
    return after


processor = aio.PartitionBatchProcessor(
    aio.Idempotency(table("ledger")),
    aio.PartitionWatermark(table("marks"), consumer="payments", event_hub="payments",
                           consumer_group="$Default"),
    aio.ParkingLot(table("parked")), consumer="payments", event_hub="payments", parse=parse,
    identify=lambda p: (DedupKey.from_cloudevent("payments", p["source"], p["id"]),
                        request_hash({"account": p["account"], "cents": p["cents"]})),
    group=lambda p: p["account"], build=post)
payments = aio.EventHubConsumer(processor)
app = func.FunctionApp()


@aio.EventHubConsumer.checked
@app.function_name("payments")
@app.retry(strategy="exponential_backoff", max_retry_count="-1", minimum_interval="00:00:05",
           maximum_interval="00:05:00")
@app.event_hub_message_trigger(arg_name="events", event_hub_name="payments",
                               connection="EventHubConnection", cardinality="many")
async def on_payments(events: typing.List[func.EventHubEvent]) -> None:  # noqa: UP006 - the worker refuses list[...]
    await payments.process(events)
