"""Cosmos DB backend on `azure.cosmos.aio`: the async face of `CosmosIdempotencyStore`.

The item mapping, batch building and error translation are the sync store's
(`CosmosMapping`, `batch_failure`, `translate_error`); only the requests are awaited.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from azure.cosmos.aio import ContainerProxy
from azure.cosmos.exceptions import CosmosBatchOperationError

from shared.exceptions import RecordExistsError
from shared.records import IdempotencyRecord
from shared.stores.base import Document, WriteOp, async_store_call, check_transaction_size
from shared.stores.codec import is_record
from shared.stores.cosmos import (
    _IF_UNCHANGED,
    BACKEND,
    CosmosMapping,
    batch_failure,
    changed_statuses,
)


class AsyncCosmosIdempotencyStore(CosmosMapping):
    """Dedup records and business documents in one Cosmos container, through the async SDK.

    Built around an `azure.cosmos.aio` container; the caller owns (and closes) its client.
    """

    name = "cosmos"

    def __init__(self, container: ContainerProxy, partition_key_path: str = "/pk") -> None:
        if not partition_key_path.startswith("/") or "/" in partition_key_path[1:]:
            raise ValueError("partition_key_path must be a top-level path such as '/pk'")
        self._pk_field = partition_key_path[1:]
        self._container = container

    async def _batch(self, partition: str, batch: list[tuple[Any, ...]], *,
                     marker_id: str | None) -> list[dict[str, Any]]:
        check_transaction_size(len(batch))

        async def execute() -> list[dict[str, Any]]:
            try:
                return await self._container.execute_item_batch(batch, partition_key=partition)
            except CosmosBatchOperationError as error:
                raise batch_failure(error, marker_id) from error

        return await async_store_call(BACKEND, execute)

    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        document = await async_store_call(
            BACKEND, lambda: self._container.read_item(record_id, partition), none_if_missing=True)
        return self._to_record(document) if document is not None and is_record(document) else None

    async def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        created = await async_store_call(
            BACKEND, lambda: self._container.create_item(self._record_document(record)),
            on_status={409: lambda: RecordExistsError(record.id)})
        return record.evolve(etag=created.get("_etag"))

    async def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        replaced = await async_store_call(BACKEND, lambda: self._container.replace_item(
            record.id, self._record_document(record), etag=record.etag,
            match_condition=_IF_UNCHANGED), on_status=changed_statuses(record.id))
        return record.evolve(etag=replaced.get("_etag"))

    async def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        await async_store_call(BACKEND, lambda: self._container.delete_item(
            record.id, record.partition_key, etag=record.etag, match_condition=_IF_UNCHANGED),
            on_status=changed_statuses(record.id))

    async def read_document(self, partition: str, document_id: str) -> Document | None:
        item = await async_store_call(
            BACKEND, lambda: self._container.read_item(document_id, partition),
            none_if_missing=True)
        return None if item is None else self._document(partition, document_id, item)

    async def write_documents(self, partition: str, operations: Sequence[WriteOp]
                              ) -> list[Document]:
        results = await self._batch(partition, [self._batch_op(partition, op) for op in operations],
                                    marker_id=None)
        return [Document(op.id, partition, op.body, result.get("eTag"))
                for op, result in zip(operations, results, strict=True)]

    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None) -> IdempotencyRecord:
        results = await self._batch(marker.partition_key,
                                    self._commit_batch(marker, operations, marker_body),
                                    marker_id=marker.id)
        return self._committed(marker, results)
