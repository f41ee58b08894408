"""Idempotent message consumers for Azure Functions: each side effect once, whatever the broker
redelivers. The names here are what a function app writes with; everything else stays
importable from its module. `shared.aio` has the async variants under the same names, and
`shared.testing` the stand-ins a test of your consumer runs on (the in-memory store).

    orders = ServiceBusConsumer("orders", Idempotency(CosmosIdempotencyStore(
        endpoint, credential, database="app", container="orders")))

    def save(tx: Transaction, order: dict) -> dict:
        tx.create("order", order)
        return {"orderId": order["orderId"]}

    # in the Service Bus trigger (auto_complete_messages=False):
    orders.run_atomic(message, message_actions, save)
"""

from shared import aio
from shared.backends import CosmosIdempotencyStore, TableIdempotencyStore
from shared.backends.dispatch import ServiceBusDispatcher
from shared.core.config import IdempotencyConfig
from shared.core.exceptions import IdempotencyError, PoisonMessageError
from shared.core.keys import DedupKey, request_hash
from shared.core.records import KeyInProgressError, KeyReusedError, OutcomeStatus
from shared.flows.batch import PartitionBatchProcessor
from shared.flows.drivers import Transaction
from shared.flows.idempotency import Idempotency
from shared.flows.parking import ParkingLot
from shared.flows.watermark import PartitionWatermark
from shared.triggers.eventhubs import EventHubConsumer, EventView
from shared.triggers.http import HttpResult, IdempotencyKeyEndpoint, IdempotentRequest
from shared.triggers.queues import StorageQueueConsumer
from shared.triggers.servicebus import MessageView, ServiceBusConsumer

__all__ = [
    "CosmosIdempotencyStore",
    "DedupKey",
    "EventHubConsumer",
    "EventView",
    "HttpResult",
    "Idempotency",
    "IdempotencyConfig",
    "IdempotencyError",
    "IdempotencyKeyEndpoint",
    "IdempotentRequest",
    "KeyInProgressError",
    "KeyReusedError",
    "MessageView",
    "OutcomeStatus",
    "ParkingLot",
    "PartitionBatchProcessor",
    "PartitionWatermark",
    "PoisonMessageError",
    "ServiceBusConsumer",
    "ServiceBusDispatcher",
    "StorageQueueConsumer",
    "TableIdempotencyStore",
    "Transaction",
    "aio",
    "request_hash",
]
