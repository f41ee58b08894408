"""The one boundary between the flows and a store: every request a flow makes is one store step
handed to `store.perform` (awaited by the async driver), and each backend builds every step's
request (`RequestMapping.request_for`) for its sync and its async store."""

from __future__ import annotations

import asyncio
from typing import Any, get_args

import pytest

from shared import DedupKey, Idempotency, aio
from shared._backends.cosmos import CosmosIdempotencyStore
from shared._backends.sdk_requests import Request
from shared._backends.table import TableIdempotencyStore
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import (
    Commit,
    CommitGroup,
    DeleteRecordIfUnchanged,
    GetRecord,
    PutRecordIfAbsent,
    ReadDocument,
    RecordDispatched,
    ReplaceRecordIfUnchanged,
    StoreStep,
    WriteDocuments,
    WriteOp,
)
from shared._flows.steps import Writes
from shared.testing import ThreadedStore
from tests.support.doubles import CountingMemoryStore, single_region_connection


class Performed(CountingMemoryStore):
    """Records the type of each step the drivers hand it, and counts requests as before."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []

    def perform(self, step: StoreStep) -> Any:
        self.steps.append(type(step).__name__)
        return super().perform(step)


def save(tx: Any) -> int:
    found = tx.read("balance")
    tx.upsert("balance", {"amount": 5 + (found.body["amount"] if found else 0)})
    return 5


async def save_async(tx: Any) -> int:
    found = await tx.read("balance")
    tx.upsert("balance", {"amount": 5 + (found.body["amount"] if found else 0)})
    return 5


#: The atomic path builds and commits; the duplicate's commit is refused (its marker is there)
#: and the marker read for the first delivery's outcome.
TWO_DELIVERIES = ["ReadDocument", "Commit", "ReadDocument", "Commit", "GetRecord"]


def test_every_request_of_a_flow_is_one_step_the_store_performs():
    store = Performed()
    idem = Idempotency(store)
    for _ in range(2):  # the second delivery is a duplicate
        idem.run_atomic(DedupKey("ledger", "m-1"), "h", save)
    assert store.steps == TWO_DELIVERIES
    assert len(store.steps) == store.requests  # nothing reached the store around perform


def test_the_async_driver_awaits_the_same_steps():
    store = Performed()
    idem = aio.Idempotency(ThreadedStore(store))

    async def deliver_twice() -> None:
        for _ in range(2):
            await idem.run_atomic(DedupKey("ledger", "m-1"), "h", save_async)

    asyncio.run(deliver_twice())
    assert store.steps == TWO_DELIVERIES
    assert len(store.steps) == store.requests


def every_store_step() -> list[StoreStep]:
    record = IdempotencyRecord(DedupKey("ledger", "m-1"), RecordState.COMPLETED, "h", 0.0, 0.0,
                               partition="p", etag='W/"1"')
    new = record.evolve(record_id="m-2", etag=None)
    writes = Writes("p")
    writes.create("d", {"n": 1})
    steps: list[StoreStep] = [
        GetRecord("p", "m-1"), PutRecordIfAbsent(record), ReplaceRecordIfUnchanged(record),
        DeleteRecordIfUnchanged(record), ReadDocument("p", "d"),
        WriteDocuments("p", (WriteOp("create", "d", {"n": 1}),)),
        Commit(new, writes.operations), CommitGroup((new, record), writes.operations),
        RecordDispatched(record)]
    assert {type(step) for step in steps} == set(get_args(StoreStep)), "a step added: add it here"
    return steps


class StandIn:
    """A client the store never calls: building a request makes no call."""

    id = table_name = url = "stand-in"
    client_connection = single_region_connection()  # what the Cosmos store's account check reads


@pytest.mark.parametrize("backend", [CosmosIdempotencyStore.from_container,
                                     TableIdempotencyStore.from_table_client],
                         ids=["cosmos", "table"])
def test_each_backend_builds_a_request_for_every_store_step(backend: Any):
    mapping = backend(StandIn())
    for step in every_store_step():
        request = mapping.request_for(step)
        assert isinstance(request, Request), type(step).__name__
