"""Cosmos DB backend on `azure.cosmos.aio`: the async face of `CosmosIdempotencyStore`.

The item mapping, batch building and error translation are the sync store's
(`CosmosMapping`, `batch_failure`, `translate_error`); only the requests are awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import CosmosBatchOperationError

from shared.exceptions import RecordExistsError
from shared.records import IdempotencyRecord
from shared.stores.base import (
    AsyncDocumentStore,
    Document,
    WriteOp,
    async_store_call,
    check_transaction_size,
)
from shared.stores.codec import is_record
from shared.stores.cosmos import (
    BACKEND,
    IF_UNCHANGED,
    CosmosMapping,
    batch_failure,
    changed_statuses,
)


class AsyncCosmosIdempotencyStore(CosmosMapping, AsyncDocumentStore):
    """Dedup records and business documents in one Cosmos container, through the async SDK.

    Build it like the sync store: from the account endpoint and a credential
    (an `AsyncTokenCredential` in Azure, or the account key), from a
    connection string, or around an existing `azure.cosmos.aio` container.
    A client the store creates is its own: it is initialized (the SDK's
    `__aenter__`, which reads the account) on the first request, not in
    `__init__`, and `close` closes it. A container passed to `from_container`
    stays its caller's, who initializes (`async with CosmosClient(...)`) and
    closes it. `async with store:` initializes and closes an owned client.
    """

    name = "cosmos"

    def __init__(self, endpoint: str, credential: Any = None, *, database: str, container: str,
                 partition_key_path: str = "/pk", container_client: ContainerProxy | None = None,
                 **client_options: Any) -> None:
        if not partition_key_path.startswith("/") or "/" in partition_key_path[1:]:
            raise ValueError("partition_key_path must be a top-level path such as '/pk'")
        self._pk_field = partition_key_path[1:]
        self._cosmos: CosmosClient | None = None  # the client this store owns, if any
        self._initialized = False
        self._initializing = asyncio.Lock()  # binds to a loop on first contention only
        if container_client is None:
            self._cosmos = CosmosClient(endpoint, credential, **client_options)  # no I/O here
            container_client = (self._cosmos.get_database_client(database)
                                .get_container_client(container))
        self._container = container_client

    @classmethod
    def from_connection_string(cls, conn_str: str, *, database: str, container: str,
                               partition_key_path: str = "/pk", **client_options: Any
                               ) -> AsyncCosmosIdempotencyStore:
        client = CosmosClient.from_connection_string(conn_str, **client_options)
        store = cls.from_container(client.get_database_client(database).get_container_client(container),
                                   partition_key_path)
        store._cosmos = client  # initialized on first use and closed with the store
        return store

    async def _ready(self) -> None:
        """Initialize an owned client once (account read, session consistency), as
        `async with CosmosClient(...)` would; a caller's client is the caller's to initialize."""
        if self._cosmos is None or self._initialized:
            return
        async with self._initializing:
            if not self._initialized:
                await async_store_call(BACKEND, self._cosmos.__aenter__)
                self._initialized = True

    async def _call(self, action: Callable[[], Awaitable[Any]], *,
                    on_status: dict[int, Callable[[], Exception]] | None = None,
                    none_if_missing: bool = False) -> Any:
        """One request on a ready client; its failure translated by `translate_error`."""
        await self._ready()
        return await async_store_call(BACKEND, action, on_status=on_status,
                                      none_if_missing=none_if_missing)

    async def _batch(self, partition: str, batch: list[tuple[Any, ...]], *,
                     marker_id: str | None) -> list[dict[str, Any]]:
        check_transaction_size(len(batch))

        async def execute() -> list[dict[str, Any]]:
            try:
                return await self._container.execute_item_batch(batch, partition_key=partition)
            except CosmosBatchOperationError as error:
                raise batch_failure(error, marker_id) from error

        return await self._call(execute)

    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        document = await self._call(lambda: self._container.read_item(record_id, partition),
                                    none_if_missing=True)
        return self._to_record(document) if document is not None and is_record(document) else None

    async def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        created = await self._call(
            lambda: self._container.create_item(self._record_document(record)),
            on_status={409: lambda: RecordExistsError(record.id)})
        return record.evolve(etag=created.get("_etag"))

    async def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        replaced = await self._call(lambda: self._container.replace_item(
            record.id, self._record_document(record), etag=record.etag,
            match_condition=IF_UNCHANGED), on_status=changed_statuses(record.id))
        return record.evolve(etag=replaced.get("_etag"))

    async def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        await self._call(lambda: self._container.delete_item(
            record.id, record.partition_key, etag=record.etag, match_condition=IF_UNCHANGED),
            on_status=changed_statuses(record.id))

    async def read_document(self, partition: str, document_id: str) -> Document | None:
        item = await self._call(lambda: self._container.read_item(document_id, partition),
                                none_if_missing=True)
        return None if item is None else self._document(partition, document_id, item)

    async def write_documents(self, partition: str, operations: Sequence[WriteOp]
                              ) -> list[Document]:
        results = await self._batch(partition, [self._batch_op(partition, op) for op in operations],
                                    marker_id=None)
        return [Document(op.id, partition, op.body, result.get("eTag"))
                for op, result in zip(operations, results, strict=True)]

    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None,
                     written: list[Document] | None = None) -> IdempotencyRecord:
        results = await self._batch(marker.partition_key,
                                    self._commit_batch(marker, operations, marker_body),
                                    marker_id=marker.id)
        return self._committed(marker, operations, results, written)

    async def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        patched = await self._call(lambda: self._container.patch_item(
            marker.id, marker.partition_key, self._dispatched_patch(marker), etag=marker.etag,
            match_condition=IF_UNCHANGED), on_status=changed_statuses(marker.id))
        return marker.evolve(etag=patched.get("_etag"), outbox=())

    async def close(self) -> None:
        """Close the client this store created; a caller's client stays open."""
        if self._cosmos is not None:
            await self._cosmos.close()

    async def __aenter__(self) -> AsyncCosmosIdempotencyStore:
        await self._ready()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()
