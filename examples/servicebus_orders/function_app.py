"""Orders from a Service Bus queue into Cosmos DB, each once, with an `OrderAccepted` sent on
after the commit (the outbox). Settings: COSMOS_ENDPOINT (COSMOS_KEY only locally), and the
trigger's ServiceBusConnection__fullyQualifiedNamespace (identity) or ServiceBusConnection (a
connection string, local runs), which the outbox sends through too."""

import os
from typing import Any

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus
from azure.identity.aio import DefaultAzureCredential

from shared import aio

credential = DefaultAzureCredential()
store = aio.CosmosIdempotencyStore(
    os.environ["COSMOS_ENDPOINT"], os.environ.get("COSMOS_KEY") or credential,
    database="shop", container="orders",
    connection_verify=os.environ.get("COSMOS_VERIFY_TLS", "true") == "true")  # false: emulator
connection = os.environ.get("ServiceBusConnection")  # noqa: SIM112 - the trigger's setting
outbox = (aio.ServiceBusDispatcher.from_connection_string(connection) if connection else
          aio.ServiceBusDispatcher(os.environ["ServiceBusConnection__fullyQualifiedNamespace"],  # noqa: SIM112
                                   credential))
orders = aio.ServiceBusConsumer("orders", aio.Idempotency(store, dispatcher=outbox),
                                sends_to=["order-events"])
app = func.FunctionApp()


def accept(tx: aio.Transaction, order: dict[str, Any]) -> dict[str, Any]:
    """The order and its event, in the marker's transaction; sent once it has committed."""
    tx.create("order", {"customerId": order["customerId"], "total": order["total"]})
    tx.send("order-events", {"type": "OrderAccepted", "orderId": order["orderId"]})
    return {"orderId": order["orderId"]}


@app.service_bus_queue_trigger(arg_name="message", queue_name="orders",
                               connection="ServiceBusConnection", auto_complete_messages=False)
async def on_order(message: servicebus.ServiceBusReceivedMessage,
                   message_actions: servicebus.ServiceBusMessageActions) -> None:
    await orders.run_atomic(message, message_actions, accept,
                            partition=lambda order: order["orderId"])
