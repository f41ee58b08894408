"""Dedup store backends behind one interface."""

from shared.stores.base import Document, IdempotencyStore, WriteOp
from shared.stores.cosmos import CosmosIdempotencyStore
from shared.stores.table import TableIdempotencyStore

__all__ = [
    "CosmosIdempotencyStore",
    "Document",
    "IdempotencyStore",
    "TableIdempotencyStore",
    "WriteOp",
]
