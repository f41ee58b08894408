"""Dedup store backends: the record and document interfaces, and three implementations."""

from shared.stores.base import (
    Document,
    DocumentStore,
    IdempotencyStore,
    RecordStore,
    WriteOp,
)
from shared.stores.cosmos import CosmosIdempotencyStore
from shared.stores.memory import InMemoryIdempotencyStore
from shared.stores.table import TableIdempotencyStore

__all__ = [
    "CosmosIdempotencyStore",
    "Document",
    "DocumentStore",
    "IdempotencyStore",
    "InMemoryIdempotencyStore",
    "RecordStore",
    "TableIdempotencyStore",
    "WriteOp",
]
