"""The library's async faces, under the names of the sync ones (as the Azure SDK does): each
runs the same flows as its sync namesake, awaited, so an `async def` function keeps its event
loop free while Cosmos DB, Table Storage or Service Bus answer. Stores here are the async SDKs'
(`azure.cosmos.aio`, `azure.data.tables.aio`); `ThreadedStore` puts a sync store behind the
async interface (a test double, a backend with no async SDK).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shared.batch import AsyncPartitionBatchProcessor as PartitionBatchProcessor
from shared.dispatch_aio import EventHubDispatcher, ServiceBusDispatcher
from shared.flow import AsyncStore
from shared.flow import AsyncTransaction as Transaction
from shared.idempotency import AsyncIdempotency as Idempotency
from shared.parking import AsyncParkingLot as ParkingLot
from shared.queues import AsyncStorageQueueConsumer as StorageQueueConsumer
from shared.records import IdempotencyRecord
from shared.stores.base import AsyncDocumentStore, Document, WriteOp
from shared.stores.cosmos_aio import AsyncCosmosIdempotencyStore as CosmosIdempotencyStore
from shared.stores.memory import InMemoryIdempotencyStore as SyncInMemoryIdempotencyStore
from shared.stores.table_aio import AsyncTableIdempotencyStore as TableIdempotencyStore
from shared.triggers import AsyncEventHubConsumer as EventHubConsumer
from shared.triggers import AsyncIdempotencyKeyEndpoint as IdempotencyKeyEndpoint
from shared.triggers import AsyncServiceBusConsumer as ServiceBusConsumer
from shared.watermark import AsyncPartitionWatermark as PartitionWatermark

__all__ = ["AsyncStore", "CosmosIdempotencyStore", "EventHubConsumer", "EventHubDispatcher",
           "Idempotency", "IdempotencyKeyEndpoint", "InMemoryIdempotencyStore", "ParkingLot",
           "PartitionBatchProcessor", "PartitionWatermark", "ServiceBusConsumer",
           "ServiceBusDispatcher", "StorageQueueConsumer", "TableIdempotencyStore",
           "ThreadedStore", "Transaction"]


#: Threads for sync stores' requests behind the async interface: each request holds one while it
#: waits on the network, so a slow store must not exhaust them (the loop's default executor has
#: only cores + 4); shared by every ThreadedStore of the process.
THREADED_STORE_THREADS = 64
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADED_STORE_THREADS, thread_name_prefix="threaded-store")
        return _pool


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
        context = contextvars.copy_context()  # as asyncio.to_thread: the caller's context goes along
        return await asyncio.get_running_loop().run_in_executor(
            _threads(), functools.partial(context.run, request, *args, **kwargs))

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


class InMemoryIdempotencyStore(ThreadedStore):
    """The in-memory store behind the async interface: for fast tests of async handlers and
    flows. Requests run inline (they never block); `sync` is the in-memory store itself."""

    def __init__(self, store: SyncInMemoryIdempotencyStore | None = None) -> None:
        super().__init__(store or SyncInMemoryIdempotencyStore())

    async def _call[T](self, request: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return request(*args, **kwargs)
