"""The library's async faces, under the names of the sync ones (as the Azure SDK does):
`shared.aio.Idempotency`, `Transaction`, `PartitionWatermark`, `ParkingLot` and
`PartitionBatchProcessor` run the same flows as their sync namesakes, awaited with
`shared.flow.run_async`, so an `async def` function keeps its event loop free while
Cosmos DB or Table Storage answer. No logic lives here, only names and two adapters that
put a sync store behind the async interface (`ThreadedStore`,
`AsyncInMemoryIdempotencyStore`); the Cosmos and Table async stores are in `shared.stores`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from shared.batch import AsyncPartitionBatchProcessor as PartitionBatchProcessor
from shared.flow import AsyncStore
from shared.flow import AsyncTransaction as Transaction
from shared.idempotency import AsyncIdempotency as Idempotency
from shared.parking import AsyncParkingLot as ParkingLot
from shared.records import IdempotencyRecord
from shared.stores.base import AsyncDocumentStore, Document, WriteOp
from shared.stores.memory import InMemoryIdempotencyStore
from shared.watermark import AsyncPartitionWatermark as PartitionWatermark

__all__ = ["AsyncInMemoryIdempotencyStore", "AsyncStore", "Idempotency", "ParkingLot",
           "PartitionBatchProcessor", "PartitionWatermark", "ThreadedStore", "Transaction"]


class ThreadedStore(AsyncDocumentStore):
    """A sync store behind the async interface, each request on a worker thread.

    For an async app whose stores are given as sync ones (a test double, a
    fault-injecting wrapper, a backend with no async SDK): the event loop stays
    free while the request runs. The real backends have native async stores.
    """

    def __init__(self, store: Any) -> None:
        self.sync = store

    @property
    def name(self) -> str:
        return str(self.sync.name)

    async def _call[T](self, request: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.to_thread(request, *args, **kwargs)

    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return await self._call(self.sync.get_record, partition, record_id)

    async def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return await self._call(self.sync.put_record_if_absent, record)

    async def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return await self._call(self.sync.replace_record_if_unchanged, record)

    async def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        await self._call(self.sync.delete_record_if_unchanged, record)

    async def read_document(self, partition: str, document_id: str) -> Document | None:
        return await self._call(self.sync.read_document, partition, document_id)

    async def write_documents(self, partition: str, operations: Sequence[WriteOp]
                              ) -> list[Document]:
        return await self._call(self.sync.write_documents, partition, operations)

    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None,
                     written: list[Document] | None = None) -> IdempotencyRecord:
        return await self._call(self.sync.commit, marker, operations, marker_body=marker_body,
                                written=written)

    async def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        return await self._call(self.sync.record_dispatched, marker)

    async def close(self) -> None:
        await self._call(self.sync.close)


class AsyncInMemoryIdempotencyStore(ThreadedStore):
    """The in-memory store behind an async face: for tests of async handlers and flows.
    Requests run inline (they never block)."""

    def __init__(self, store: InMemoryIdempotencyStore | None = None) -> None:
        super().__init__(store or InMemoryIdempotencyStore())

    @property
    def requests(self) -> int:
        return self.sync.requests

    async def _call[T](self, request: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return request(*args, **kwargs)
