"""Table Storage backend on `azure.data.tables.aio`: the async face of `TableIdempotencyStore`.

The entity mapping, transaction building and error translation are the sync
store's (`TableMapping`, `transaction_error`, `translate_error`); only the requests are awaited.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.credentials_async import AsyncTokenCredential
from azure.data.tables import TableTransactionError, UpdateMode
from azure.data.tables.aio import TableClient

from shared.exceptions import RecordExistsError
from shared.records import IdempotencyRecord
from shared.stores.base import (
    AsyncDocumentStore,
    Document,
    WriteOp,
    async_store_call,
    changed_statuses,
    check_transaction_size,
)
from shared.stores.codec import is_record
from shared.stores.table import BACKEND, IF_UNCHANGED, TableMapping, etag_of, transaction_error
from shared.stores.table_batch import submit_transaction_async


class AsyncTableIdempotencyStore(TableMapping, AsyncDocumentStore):
    """Dedup records and business entities in one Azure Table, through the async SDK.

    Build it like the sync store: from the table endpoint and a credential (an
    `AsyncTokenCredential` in Azure, or a named key / SAS), from a connection
    string, or around an existing `azure.data.tables.aio.TableClient`. No
    request is made in `__init__` (`ensure_table` creates a missing table). A
    client the store creates is its own and `close` closes it; a client passed
    to `from_table_client` stays its caller's. `async with store:` closes it too.
    """

    name = "table"

    def __init__(self, endpoint: str, credential: AsyncTokenCredential | AzureNamedKeyCredential |
                 AzureSasCredential | None = None, *, table_name: str,
                 table_client: TableClient | None = None, **client_options: Any) -> None:
        self._owned: TableClient | None = None  # the client this store created, if any
        if table_client is None:
            table_client = self._owned = TableClient(endpoint, table_name, credential=credential,
                                                     **client_options)
        self._client = table_client

    @classmethod
    def from_connection_string(cls, conn_str: str, *, table_name: str,
                               **client_options: Any) -> AsyncTableIdempotencyStore:
        client = TableClient.from_connection_string(conn_str, table_name, **client_options)
        store = cls.from_table_client(client)
        store._owned = client  # closed with the store
        return store

    async def ensure_table(self) -> None:
        """Create the table if it is missing (local runs; in Azure, Bicep creates it)."""
        with contextlib.suppress(RecordExistsError):
            await async_store_call(BACKEND, self._client.create_table,
                                   on_status={409: lambda: RecordExistsError(self._client.table_name)})

    async def _transaction(self, batch: list[tuple[Any, ...]], *,
                           marker_id: str | None) -> list[Any]:
        check_transaction_size(len(batch))

        async def submit() -> list[Any]:
            try:
                return await submit_transaction_async(self._client, batch)
            except TableTransactionError as error:
                raise transaction_error(error, marker_id) from error

        return await async_store_call(BACKEND, submit)

    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        entity = await async_store_call(
            BACKEND, lambda: self._client.get_entity(partition, record_id), none_if_missing=True)
        return self._to_record(entity) if entity is not None and is_record(entity) else None

    async def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        metadata = await async_store_call(
            BACKEND, lambda: self._client.create_entity(self._record_entity(record)),
            on_status={409: lambda: RecordExistsError(record.id)})
        return record.evolve(etag=etag_of(metadata))

    async def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        entity = self._record_entity(record)
        metadata = await async_store_call(BACKEND, lambda: self._client.update_entity(
            entity, mode=UpdateMode.REPLACE, etag=record.etag, match_condition=IF_UNCHANGED),
            on_status=changed_statuses(record.id))
        return record.evolve(etag=etag_of(metadata))

    async def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        await async_store_call(BACKEND, lambda: self._client.delete_entity(
            record.partition_key, record.id, etag=record.etag, match_condition=IF_UNCHANGED),
            on_status=changed_statuses(record.id))

    async def read_document(self, partition: str, document_id: str) -> Document | None:
        entity = await async_store_call(
            BACKEND, lambda: self._client.get_entity(partition, document_id),
            none_if_missing=True)
        return None if entity is None else self._document(partition, document_id, entity)

    async def write_documents(self, partition: str, operations: Sequence[WriteOp]
                              ) -> list[Document]:
        results = await self._transaction(
            [self._transaction_op(partition, op) for op in operations], marker_id=None)
        return [Document(op.id, partition, op.body, etag_of(meta))
                for op, meta in zip(operations, results, strict=True)]

    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None,
                     written: list[Document] | None = None) -> IdempotencyRecord:
        results = await self._transaction(self._commit_batch(marker, operations, marker_body),
                                          marker_id=marker.id)
        return self._committed(marker, operations, results, written)

    async def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        entity = self._dispatched_entity(marker)
        metadata = await async_store_call(BACKEND, lambda: self._client.update_entity(
            entity, mode=UpdateMode.MERGE, etag=marker.etag, match_condition=IF_UNCHANGED),
            on_status=changed_statuses(marker.id))
        return marker.evolve(etag=etag_of(metadata), outbox=())

    async def close(self) -> None:
        """Close the client this store created; a caller's client stays open."""
        if self._owned is not None:
            await self._owned.close()

    async def __aenter__(self) -> AsyncTableIdempotencyStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()
