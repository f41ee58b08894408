"""Table Storage backend (`azure-data-tables`).

Claim = `create_entity` (409 = exists). Takeover, completion and release are
etag-conditional. Table Storage has no TTL: every read checks `idemExpiresAt`
and `purge_expired` deletes expired rows in entity-group batches.
Atomic path = one `submit_transaction` (same PartitionKey, <= 100 entities).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential, TokenCredential
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import EdmType, EntityProperty, TableClient, TableTransactionError, UpdateMode

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
MAX_TRANSACTION_OPERATIONS = 100
_SYSTEM = ("PartitionKey", "RowKey", "Timestamp", "etag")


def _call[T](action: Callable[[], T]) -> T:
    """Run one store request, translating outage-like errors to StoreUnavailableError."""
    try:
        return action()
    except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError,
            TableTransactionError):
        raise
    except HttpResponseError as error:
        if error.status_code in RETRIABLE_STATUS:
            raise StoreUnavailableError(f"Table Storage answered {error.status_code}",
                                        status_code=error.status_code, error=error) from error
        raise StoreRequestError(f"Table Storage rejected the request: {error.message}",
                                status_code=error.status_code) from error
    except AzureError as error:  # connection refused, timeouts, broken responses
        raise StoreUnavailableError(f"Table Storage unreachable: {error}", error=error) from error


def _etag(metadata: dict[str, Any] | None) -> str | None:
    return (metadata or {}).get("etag")


_INT32 = range(-(2**31), 2**31)


def _typed(entity: dict[str, Any]) -> dict[str, Any]:
    """Python ints beyond Int32 are sent as Edm.Int64 (the SDK refuses them otherwise)."""
    return {name: EntityProperty(value, EdmType.INT64)
            if isinstance(value, int) and not isinstance(value, bool) and value not in _INT32
            else value for name, value in entity.items()}


def _plain(entity: Any) -> dict[str, Any]:
    """Entity properties as plain Python values (Int64 arrives as EntityProperty)."""
    return {name: value.value if isinstance(value, EntityProperty) else value
            for name, value in entity.items()}


class TableIdempotencyStore(IdempotencyStore):
    """Dedup records and business entities in one Azure Table."""

    name = "table"

    def __init__(self, endpoint: str, credential: TokenCredential | AzureNamedKeyCredential |
                 AzureSasCredential | None = None, *, table_name: str,
                 create_table: bool = False, **client_options: Any) -> None:
        self._client = TableClient(endpoint, table_name, credential=credential, **client_options)
        if create_table:
            self.ensure_table()

    @classmethod
    def from_connection_string(cls, conn_str: str, *, table_name: str,
                               create_table: bool = False, **client_options: Any
                               ) -> TableIdempotencyStore:
        store = cls.__new__(cls)
        store._client = TableClient.from_connection_string(conn_str, table_name, **client_options)
        if create_table:
            store.ensure_table()
        return store

    @classmethod
    def from_table_client(cls, client: TableClient) -> TableIdempotencyStore:
        store = cls.__new__(cls)
        store._client = client
        return store

    @property
    def client(self) -> TableClient:
        return self._client

    def ensure_table(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            _call(self._client.create_table)

    # -- mapping ----------------------------------------------------------------
    @staticmethod
    def _record_entity(record: IdempotencyRecord,
                       body: dict[str, Any] | None = None) -> dict[str, Any]:
        return _typed({**(body or {}), **record_fields(record),
                       "PartitionKey": record.partition_key, "RowKey": record.id})

    @staticmethod
    def _to_record(entity: Any) -> IdempotencyRecord:
        return record_from_fields(_plain(entity), record_id=entity["RowKey"],
                                  partition=entity["PartitionKey"], etag=_etag(entity.metadata))

    @staticmethod
    def _document_entity(partition: str, op: WriteOp) -> dict[str, Any]:
        check_flat(op.body)
        return _typed({**op.body, "PartitionKey": partition, "RowKey": op.id})

    def _transaction_op(self, partition: str, op: WriteOp) -> tuple[Any, ...]:
        entity = self._document_entity(partition, op)
        conditional = {"etag": op.etag, "match_condition": MatchConditions.IfNotModified}
        if op.kind == "create":
            return ("create", entity)
        if op.kind == "upsert":
            return ("upsert", entity, {"mode": UpdateMode.REPLACE})
        if op.kind == "replace":
            options = {"mode": UpdateMode.REPLACE, **(conditional if op.etag else {})}
            return ("update", entity, options)
        if op.kind == "delete":
            return ("delete", entity, conditional if op.etag else {})
        raise NotImplementedError(f"Table Storage has no {op.kind!r} operation; use replace")

    # -- records ----------------------------------------------------------------
    def create_record(self, record: IdempotencyRecord) -> IdempotencyRecord:
        try:
            metadata = _call(lambda: self._client.create_entity(self._record_entity(record)))
        except ResourceExistsError as error:
            raise RecordExistsError(record.id) from error
        return record.evolve(etag=_etag(metadata))

    def get_record(self, record: IdempotencyRecord) -> IdempotencyRecord | None:
        try:
            entity = _call(lambda: self._client.get_entity(record.partition_key, record.id))
        except ResourceNotFoundError:
            return None
        return self._to_record(entity) if is_record(entity) else None

    def replace_record(self, record: IdempotencyRecord) -> IdempotencyRecord:
        entity = self._record_entity(record)
        try:
            metadata = _call(lambda: self._client.update_entity(
                entity, mode=UpdateMode.REPLACE, etag=record.etag,
                match_condition=MatchConditions.IfNotModified))
        except (ResourceModifiedError, ResourceNotFoundError) as error:
            raise RecordChangedError(record.id) from error
        return record.evolve(etag=_etag(metadata))

    def delete_record(self, record: IdempotencyRecord) -> None:
        try:
            _call(lambda: self._client.delete_entity(
                record.partition_key, record.id, etag=record.etag,
                match_condition=MatchConditions.IfNotModified))
        except (ResourceModifiedError, ResourceNotFoundError) as error:
            raise RecordChangedError(record.id) from error

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None) -> IdempotencyRecord:
        if marker_body:
            check_flat(marker_body)
        partition = marker.partition_key
        entity = self._record_entity(marker, marker_body)
        if marker.etag:
            first: tuple[Any, ...] = ("update", entity, {
                "mode": UpdateMode.REPLACE, "etag": marker.etag,
                "match_condition": MatchConditions.IfNotModified})
        else:
            first = ("create", entity)
        batch = [first, *(self._transaction_op(partition, op) for op in operations)]
        if len(batch) > MAX_TRANSACTION_OPERATIONS:
            raise ValueError(f"an entity-group transaction holds at most "
                             f"{MAX_TRANSACTION_OPERATIONS} operations, got {len(batch)}")
        try:
            results = _call(lambda: self._client.submit_transaction(batch))
        except TableTransactionError as error:
            raise transaction_failure(error.index or 0, error.status_code, marker_id=marker.id,
                                      detail=str(error).splitlines()[0]) from error
        return marker.evolve(etag=_etag(results[0]))

    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        clauses, params = ["idemState ne ''"], {}
        if in_progress_before is not None:
            clauses.append("idemState eq @state and idemLeaseExpiresAt lt @lease")
            params.update(state=RecordState.IN_PROGRESS.value, lease=float(in_progress_before))
        if expired_before is not None:
            clauses.append("idemExpiresAt lt @expiry")
            params["expiry"] = float(expired_before)
        query = " and ".join(clauses)
        pages = _call(lambda: self._client.query_entities(query, parameters=params))
        iterator = iter(pages)
        while True:
            try:
                entity = _call(lambda: next(iterator))
            except StopIteration:
                return
            if is_record(entity):
                yield self._to_record(entity)

    def purge_expired(self, now: float, *, batch_size: int = 100) -> int:
        by_partition: dict[str, list[IdempotencyRecord]] = defaultdict(list)
        for record in self.iter_records(expired_before=now):
            by_partition[record.partition_key].append(record)
        deleted = 0
        for partition, records in by_partition.items():
            for start in range(0, len(records), min(batch_size, MAX_TRANSACTION_OPERATIONS)):
                chunk = records[start:start + batch_size]
                deleted += self._delete_chunk(partition, chunk)
        return deleted

    def _delete_chunk(self, partition: str, chunk: list[IdempotencyRecord]) -> int:
        """Delete a group in one transaction; if one row changed meanwhile, go one by one."""
        ops = [("delete", {"PartitionKey": partition, "RowKey": r.id},
                {"etag": r.etag, "match_condition": MatchConditions.IfNotModified}) for r in chunk]
        try:
            _call(lambda: self._client.submit_transaction(ops))
            return len(chunk)
        except TableTransactionError:
            deleted = 0
            for record in chunk:
                try:
                    self.delete_record(record)
                    deleted += 1
                except RecordChangedError:
                    pass  # taken over or renewed since the query: keep it
            return deleted

    # -- documents --------------------------------------------------------------
    def read_document(self, partition: str, document_id: str) -> Document | None:
        try:
            entity = _call(lambda: self._client.get_entity(partition, document_id))
        except ResourceNotFoundError:
            return None
        body = {k: v for k, v in _plain(entity).items() if k not in _SYSTEM}
        return Document(document_id, partition, body, _etag(entity.metadata))

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        batch = [self._transaction_op(partition, op) for op in operations]
        try:
            results = _call(lambda: self._client.submit_transaction(batch))
        except TableTransactionError as error:
            raise transaction_failure(error.index or 0, error.status_code, marker_id=None) from error
        return [Document(op.id, partition, op.body, _etag(meta))
                for op, meta in zip(operations, results, strict=True)]

    def close(self) -> None:
        self._client.close()
