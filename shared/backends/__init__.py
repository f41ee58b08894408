"""Dedup store backends: the record and document interfaces, and three implementations."""

from shared.backends.cosmos import CosmosIdempotencyStore
from shared.backends.memory import InMemoryIdempotencyStore
from shared.backends.table import TableIdempotencyStore
from shared.core.store import (
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
