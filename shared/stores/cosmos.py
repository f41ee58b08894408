"""Cosmos DB for NoSQL backend (`azure-cosmos`).

Claim = `create_item` (409 = exists). Atomic path = one transactional batch
(`execute_item_batch`) with the marker first and the business operations
after it, all in the marker's logical partition: all commit or none do, and a
409 at index 0 identifies the duplicate. Markers carry a native `ttl`
(container default TTL -1 turns per-item TTL on) and an `idemExpiresAt` that
every read checks, since expiry runs in the background.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import AzureError
from azure.cosmos import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import (
    CosmosAccessConditionFailedError,
    CosmosBatchOperationError,
    CosmosHttpResponseError,
    CosmosResourceExistsError,
    CosmosResourceNotFoundError,
)

from shared.exceptions import (
    RETRIABLE_STATUS,
    RecordChangedError,
    RecordExistsError,
    StoreRequestError,
    StoreUnavailableError,
)
from shared.records import IdempotencyRecord, RecordState
from shared.stores.base import Document, IdempotencyStore, WriteOp, transaction_failure
from shared.stores.codec import check_flat, is_record, record_fields, record_from_fields

T = TypeVar("T")
MAX_BATCH_OPERATIONS = 100
_SYSTEM = ("_rid", "_self", "_etag", "_attachments", "_ts", "ttl")


def _call[T](action: Callable[[], T]) -> T:
    """Run one store request, translating outage-like errors to StoreUnavailableError."""
    try:
        return action()
    except (CosmosResourceExistsError, CosmosAccessConditionFailedError,
            CosmosResourceNotFoundError, CosmosBatchOperationError):
        raise
    except CosmosHttpResponseError as error:
        if error.status_code in RETRIABLE_STATUS or error.status_code is None:
            raise StoreUnavailableError(f"Cosmos DB answered {error.status_code}",
                                        status_code=error.status_code, error=error) from error
        raise StoreRequestError(f"Cosmos DB rejected the request: {error.message}",
                                status_code=error.status_code) from error
    except AzureError as error:
        raise StoreUnavailableError(f"Cosmos DB unreachable: {error}", error=error) from error


class CosmosIdempotencyStore(IdempotencyStore):
    """Dedup records and business documents in one Cosmos DB container."""

    name = "cosmos"

    def __init__(self, endpoint: str, credential: Any, *, database: str, container: str,
                 partition_key_path: str = "/pk", **client_options: Any) -> None:
        self._cosmos = _call(lambda: CosmosClient(endpoint, credential, **client_options))
        container_proxy = self._cosmos.get_database_client(database).get_container_client(container)
        self._init(container_proxy, partition_key_path)

    @classmethod
    def from_connection_string(cls, conn_str: str, *, database: str, container: str,
                               partition_key_path: str = "/pk", **client_options: Any
                               ) -> CosmosIdempotencyStore:
        client = _call(lambda: CosmosClient.from_connection_string(conn_str, **client_options))
        store = cls.from_container(client.get_database_client(database)
                                   .get_container_client(container), partition_key_path)
        store._cosmos = client
        return store

    @classmethod
    def from_container(cls, container: ContainerProxy, partition_key_path: str = "/pk"
                       ) -> CosmosIdempotencyStore:
        store = cls.__new__(cls)
        store._cosmos = None
        store._init(container, partition_key_path)
        return store

    def _init(self, container: ContainerProxy, partition_key_path: str) -> None:
        if not partition_key_path.startswith("/") or "/" in partition_key_path[1:]:
            raise ValueError("partition_key_path must be a top-level path such as '/pk'")
        self._container = container
        self._pk_field = partition_key_path[1:]

    @property
    def container(self) -> ContainerProxy:
        return self._container

    # -- mapping ----------------------------------------------------------------
    def _record_document(self, record: IdempotencyRecord,
                         body: dict[str, Any] | None = None) -> dict[str, Any]:
        document = {**(body or {}), **record_fields(record),
                    "id": record.id, self._pk_field: record.partition_key}
        if record.expires_at is not None:
            now = record.updated_at
            document["ttl"] = max(1, math.ceil(record.expires_at - now))
        return document

    def _to_record(self, document: dict[str, Any]) -> IdempotencyRecord:
        return record_from_fields(document, record_id=document["id"],
                                  partition=document[self._pk_field], etag=document.get("_etag"))

    def _business_document(self, partition: str, op: WriteOp) -> dict[str, Any]:
        check_flat(op.body)
        return {**op.body, "id": op.id, self._pk_field: partition}

    def _batch_op(self, partition: str, op: WriteOp) -> tuple[Any, ...]:
        condition = {"if_match_etag": op.etag} if op.etag else {}
        if op.kind == "create":
            return ("create", (self._business_document(partition, op),))
        if op.kind == "upsert":
            return ("upsert", (self._business_document(partition, op),))
        if op.kind == "replace":
            return ("replace", (op.id, self._business_document(partition, op)), condition)
        if op.kind == "patch":
            return ("patch", (op.id, list(op.patch)), condition)
        if op.kind == "delete":
            return ("delete", (op.id,), condition)
        raise ValueError(f"unknown operation {op.kind!r}")

    # -- records ----------------------------------------------------------------
    def create_record(self, record: IdempotencyRecord) -> IdempotencyRecord:
        try:
            created = _call(lambda: self._container.create_item(self._record_document(record)))
        except CosmosResourceExistsError as error:
            raise RecordExistsError(record.id) from error
        return record.evolve(etag=created.get("_etag"))

    def get_record(self, record: IdempotencyRecord) -> IdempotencyRecord | None:
        try:
            document = _call(lambda: self._container.read_item(record.id, record.partition_key))
        except CosmosResourceNotFoundError:
            return None
        return self._to_record(document) if is_record(document) else None

    def replace_record(self, record: IdempotencyRecord) -> IdempotencyRecord:
        try:
            replaced = _call(lambda: self._container.replace_item(
                record.id, self._record_document(record), etag=record.etag,
                match_condition=MatchConditions.IfNotModified))
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError) as error:
            raise RecordChangedError(record.id) from error
        return record.evolve(etag=replaced.get("_etag"))

    def delete_record(self, record: IdempotencyRecord) -> None:
        try:
            _call(lambda: self._container.delete_item(
                record.id, record.partition_key, etag=record.etag,
                match_condition=MatchConditions.IfNotModified))
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError) as error:
            raise RecordChangedError(record.id) from error

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None) -> IdempotencyRecord:
        if marker_body:
            check_flat(marker_body)
        partition = marker.partition_key
        document = self._record_document(marker, marker_body)
        if marker.etag:
            first: tuple[Any, ...] = ("replace", (marker.id, document), {"if_match_etag": marker.etag})
        else:
            first = ("create", (document,))
        batch = [first, *(self._batch_op(partition, op) for op in operations)]
        if len(batch) > MAX_BATCH_OPERATIONS:
            raise ValueError(f"a transactional batch holds at most {MAX_BATCH_OPERATIONS} "
                             f"operations, got {len(batch)}")
        try:
            results = _call(lambda: self._container.execute_item_batch(batch, partition_key=partition))
        except CosmosBatchOperationError as error:
            status = error.operation_responses[error.error_index].get("statusCode")
            raise transaction_failure(error.error_index, status, marker_id=marker.id) from error
        etag = results[0].get("eTag") or (results[0].get("resourceBody") or {}).get("_etag")
        return marker.evolve(etag=etag)

    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        clauses, params = ["IS_DEFINED(c.idemState)"], []
        if in_progress_before is not None:
            clauses.append("c.idemState = @state AND c.idemLeaseExpiresAt < @lease")
            params += [{"name": "@state", "value": RecordState.IN_PROGRESS.value},
                       {"name": "@lease", "value": float(in_progress_before)}]
        if expired_before is not None:
            clauses.append("c.idemExpiresAt < @expiry")
            params.append({"name": "@expiry", "value": float(expired_before)})
        query = "SELECT * FROM c WHERE " + " AND ".join(clauses)  # noqa: S608 - fixed clauses, values bound
        pages = _call(lambda: self._container.query_items(
            query, parameters=params, enable_cross_partition_query=True))
        iterator = iter(pages)
        while True:
            try:
                document = _call(lambda: next(iterator))
            except StopIteration:
                return
            yield self._to_record(document)

    def purge_expired(self, now: float, *, batch_size: int = 100) -> int:
        """Cosmos deletes expired markers itself (ttl); this sweeps what is left."""
        deleted = 0
        for record in list(self.iter_records(expired_before=now)):
            try:
                self.delete_record(record)
                deleted += 1
            except RecordChangedError:
                pass
        return deleted

    # -- documents --------------------------------------------------------------
    def read_document(self, partition: str, document_id: str) -> Document | None:
        try:
            item = _call(lambda: self._container.read_item(document_id, partition))
        except CosmosResourceNotFoundError:
            return None
        # A synthetic "/pk" is storage detail; a business partition field (orderId) stays.
        hidden = {"id", "pk"} if self._pk_field == "pk" else {"id"}
        body = {k: v for k, v in item.items() if k not in _SYSTEM and k not in hidden}
        return Document(document_id, partition, body, item.get("_etag"))

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        batch = [self._batch_op(partition, op) for op in operations]
        try:
            results = _call(lambda: self._container.execute_item_batch(batch, partition_key=partition))
        except CosmosBatchOperationError as error:
            status = error.operation_responses[error.error_index].get("statusCode")
            raise transaction_failure(error.error_index, status, marker_id=None) from error
        return [Document(op.id, partition, op.body, result.get("eTag"))
                for op, result in zip(operations, results, strict=True)]

    def close(self) -> None:
        if self._cosmos is not None:
            self._cosmos.close()
