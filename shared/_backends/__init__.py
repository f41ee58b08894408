"""Dedup store backends: the record and document interfaces, and three implementations."""

from shared._backends.cosmos import CosmosIdempotencyStore
from shared._backends.memory import InMemoryIdempotencyStore
from shared._backends.table import TableIdempotencyStore
from shared._core.store import (
    Document,
    DocumentStore,
    IdempotencyStore,
    RecordStore,
    WriteOp,
)

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
