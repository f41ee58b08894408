"""Idempotent message consumers for Azure Functions: the dedup library.

    store = TableIdempotencyStore.from_connection_string(conn, table_name="dedup")
    idem = Idempotency(store)
    outcome = idem.run(DedupKey.from_message_id("my-consumer", msg.message_id),
                       request_hash(body), lambda: send(body))
"""

from shared import aio
from shared.aio import AsyncInMemoryIdempotencyStore
from shared.config import IdempotencyConfig, RedeliveryWindow, validate_retention
from shared.exceptions import (
    ConcurrencyRetriesExhaustedError,
    EffectUncertainError,
    IdempotencyError,
    InvalidKeyError,
    ResultTooLargeError,
    RetentionConfigError,
    StoreRequestError,
    StoreUnavailableError,
)
from shared.flow import AsyncTransaction, Transaction, run_async, run_sync, update_document
from shared.idempotency import AsyncIdempotency, Idempotency
from shared.keys import DedupKey, request_hash, store_safe_id
from shared.records import IdempotencyRecord, Outcome, OutcomeStatus, RecordState
from shared.stores import (
    CosmosIdempotencyStore,
    Document,
    DocumentStore,
    IdempotencyStore,
    InMemoryIdempotencyStore,
    RecordStore,
    TableIdempotencyStore,
    WriteOp,
)
from shared.stores.cosmos_aio import AsyncCosmosIdempotencyStore
from shared.stores.table_aio import AsyncTableIdempotencyStore

__all__ = [
    "AsyncCosmosIdempotencyStore",
    "AsyncIdempotency",
    "AsyncInMemoryIdempotencyStore",
    "AsyncTableIdempotencyStore",
    "AsyncTransaction",
    "ConcurrencyRetriesExhaustedError",
    "CosmosIdempotencyStore",
    "DedupKey",
    "Document",
    "DocumentStore",
    "EffectUncertainError",
    "Idempotency",
    "IdempotencyConfig",
    "IdempotencyError",
    "IdempotencyRecord",
    "IdempotencyStore",
    "InMemoryIdempotencyStore",
    "InvalidKeyError",
    "Outcome",
    "OutcomeStatus",
    "RecordState",
    "RecordStore",
    "RedeliveryWindow",
    "ResultTooLargeError",
    "RetentionConfigError",
    "StoreRequestError",
    "StoreUnavailableError",
    "TableIdempotencyStore",
    "Transaction",
    "WriteOp",
    "aio",
    "request_hash",
    "run_async",
    "run_sync",
    "store_safe_id",
    "update_document",
    "validate_retention",
]
