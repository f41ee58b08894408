"""Idempotent message consumers for Azure Functions: each side effect once, whatever the broker
redelivers. The names here are everything a function app imports: its modules are the
library's implementation. `shared.aio` has the async variants under the same names, and
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
from shared._backends import CosmosIdempotencyStore, TableIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._backends.dispatch import ServiceBusDispatcher
from shared._backends.retry import RetryBudget
from shared._backends.sdk_transport import sync_transport as sdk_transport
from shared._core.cloudevents import CloudEvent, InvalidEventError, parse_cloudevent
from shared._core.config import IdempotencyConfig, RedeliveryWindow
from shared._core.exceptions import (
    DispatchRejectedError,
    EffectUncertainError,
    IdempotencyError,
    InvalidKeyError,
    PoisonMessageError,
)
from shared._core.keys import DedupKey, request_hash, store_safe_id
from shared._core.observability import configure_observability, downstream_headers, sampling_ratio_from
from shared._core.payload import MAX_SAFE_INTEGER, InvalidPayloadError, exact_integer, parse_json_object
from shared._core.records import (
    IdempotencyRecord,
    KeyInProgressError,
    KeyReusedError,
    Outcome,
    OutcomeStatus,
)
from shared._core.settlement import Decision, decision_for_error, transient
from shared._core.store import Document, IdempotencyStore
from shared._core.telemetry import Telemetry
from shared._flows.batch import PartitionBatchProcessor
from shared._flows.cache import DocumentCache
from shared._flows.drivers import Transaction, update_document
from shared._flows.idempotency import Idempotency
from shared._flows.parking import ParkingLot
from shared._flows.watermark import PartitionWatermark
from shared._triggers.eventhubs import EventHubConsumer, EventView
from shared._triggers.http import HttpResult, IdempotencyKeyEndpoint, IdempotentRequest
from shared._triggers.maintenance import Maintenance
from shared._triggers.queue_messages import QueueMessageView
from shared._triggers.queues import StorageQueueConsumer
from shared._triggers.servicebus import MessageView, ServiceBusConsumer

__all__ = [
    "MAX_SAFE_INTEGER",
    "CloudEvent",
    "CosmosIdempotencyStore",
    "Decision",
    "DedupKey",
    "DispatchRejectedError",
    "Document",
    "DocumentCache",
    "EffectUncertainError",
    "EventHubConsumer",
    "EventView",
    "HttpResult",
    "Idempotency",
    "IdempotencyConfig",
    "IdempotencyError",
    "IdempotencyKeyEndpoint",
    "IdempotencyRecord",
    "IdempotencyStore",
    "IdempotentRequest",
    "InvalidEventError",
    "InvalidKeyError",
    "InvalidPayloadError",
    "KeyInProgressError",
    "KeyReusedError",
    "Maintenance",
    "MessageView",
    "Outcome",
    "OutcomeStatus",
    "ParkingLot",
    "PartitionBatchProcessor",
    "PartitionWatermark",
    "PoisonMessageError",
    "QueueMessageView",
    "RedeliveryWindow",
    "RetryBudget",
    "ServiceBusConsumer",
    "ServiceBusDispatcher",
    "StorageQueueConsumer",
    "TableIdempotencyStore",
    "Telemetry",
    "Transaction",
    "aio",
    "configure_observability",
    "decision_for_error",
    "downstream_headers",
    "exact_integer",
    "parse_cloudevent",
    "parse_json_object",
    "record_indexing_policy",
    "request_hash",
    "sampling_ratio_from",
    "sdk_transport",
    "store_safe_id",
    "transient",
    "update_document",
]
