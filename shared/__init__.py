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
from shared.batch import PartitionBatchProcessor
from shared.config import IdempotencyConfig
from shared.dispatch import ServiceBusDispatcher
from shared.drivers import Transaction
from shared.eventhubs import EventHubConsumer, EventView
from shared.exceptions import IdempotencyError, PoisonMessageError
from shared.http import HttpResult, IdempotencyKeyEndpoint, IdempotentRequest
from shared.idempotency import Idempotency
from shared.keys import DedupKey, request_hash
from shared.parking import ParkingLot
from shared.queues import StorageQueueConsumer
from shared.records import KeyInProgressError, KeyReusedError, OutcomeStatus
from shared.stores import CosmosIdempotencyStore, TableIdempotencyStore
from shared.triggers import MessageView, ServiceBusConsumer
from shared.watermark import PartitionWatermark

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
