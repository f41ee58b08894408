"""Table Storage's mapping, shared by the sync and async stores: a record or a `WriteOp` to an
entity or a transaction operation, an entity back to a record or a `Document`, and each
store request (`Request`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Self

from azure.core import MatchConditions
from azure.data.tables import EdmType, EntityProperty, TableTransactionError, UpdateMode

from shared._backends.sdk_requests import Request, RequestMapping, changed_statuses
from shared._backends.table_batch import Codec
from shared._core.codec import (
    TIME_FIELDS,
    check_flat,
    is_record,
    pending_names,
    record_fields,
    record_from_fields,
)
from shared._core.exceptions import RecordExistsError
from shared._core.outbox import PENDING_SINCE
from shared._core.records import IdempotencyRecord
from shared._core.store import (
    Document,
    WriteOp,
    check_transaction_size,
    transaction_failure,
    written_documents,
)

BACKEND = "Table Storage"
_SYSTEM = ("PartitionKey", "RowKey", "Timestamp", "etag")
_INT32 = range(-(2**31), 2**31)
IF_UNCHANGED = MatchConditions.IfNotModified


def etag_of(metadata: dict[str, Any] | None) -> str | None:
    return (metadata or {}).get("etag")


_ETAG_TIME = "W/\"datetime'"


def etag_time(etag: str | None) -> float | None:
    """When the service wrote an entity, from its etag (`W/"datetime'2026-01-02T03%3A04%3A05.
    1234567Z'"`: the entity's Timestamp), or None for another form."""
    if etag is None or not etag.startswith(_ETAG_TIME):
        return None
    try:
        return datetime.fromisoformat(etag[len(_ETAG_TIME):-2].replace("%3A", ":")).timestamp()
    except ValueError:
        return None


def written_record(record: IdempotencyRecord, metadata: dict[str, Any] | None
                   ) -> IdempotencyRecord:
    """`record` as the service answered its write: its new etag, and the time in it."""
    etag = etag_of(metadata)
    return record.evolve(etag=etag, server_time=etag_time(etag))


def _typed(entity: dict[str, Any]) -> dict[str, Any]:
    """Python ints beyond Int32 are sent as Edm.Int64 (the SDK refuses them otherwise)."""
    return {name: EntityProperty(value, EdmType.INT64)
            if isinstance(value, int) and not isinstance(value, bool) and value not in _INT32
            else value for name, value in entity.items()}


def _plain(entity: Any) -> dict[str, Any]:
    """Entity properties as plain Python values (Int64 arrives as EntityProperty)."""
    return {name: value.value if isinstance(value, EntityProperty) else value
            for name, value in entity.items()}


class TableMapping(RequestMapping):
    """Record <-> entity and WriteOp -> transaction operation mapping."""

    _client: Any  # a table client of the sync or the async SDK

    @classmethod
    def from_table_client(cls, client: Any, **options: Any) -> Self:
        """Around a table client of the caller's (`options`: the store's, e.g. batch_codec)."""
        # cls is a store class: the mapping mixin itself has no __init__ taking these
        return cls(client.url, table_name=client.table_name,  # type: ignore[call-arg]
                   table_client=client, **options)

    @property
    def client(self) -> Any:
        return self._client

    @property
    def sweep_scope(self) -> str:
        """The table's URL: stores of one table share one sweep (and its cursor)."""
        return f"{self._client.url}/{self._client.table_name}"

    @staticmethod
    def _committed(marker: IdempotencyRecord, operations: Sequence[WriteOp],
                   results: list[Any], written: list[Document] | None) -> IdempotencyRecord:
        if written is not None:
            written += written_documents(marker.partition_key, operations,
                                         [etag_of(meta) for meta in results[1:]])
        return written_record(marker, results[0])

    @staticmethod
    def _record_entity(record: IdempotencyRecord, body: dict[str, Any] | None = None, *,
                       written_id: str | None = None) -> dict[str, Any]:
        entity = record_fields(record, written_id=written_id)  # a new dict: ours
        for name in TIME_FIELDS:  # epoch milliseconds, beyond Int32: Edm.Int64
            if name in entity:
                entity[name] = EntityProperty(entity[name], EdmType.INT64)
        if body:
            entity = {**_typed(body), **entity}
        entity["PartitionKey"] = record.partition_key
        entity["RowKey"] = record.id
        return entity

    @staticmethod
    def _to_record(entity: Any) -> IdempotencyRecord:
        return record_from_fields(_plain(entity), record_id=entity["RowKey"],
                                  partition=entity["PartitionKey"], etag=etag_of(entity.metadata))

    @classmethod
    def _transaction_op(cls, partition: str, op: WriteOp) -> tuple[Any, ...]:
        if op.record is not None:  # a further marker of a group commit
            entity = cls._record_entity(op.record, written_id=op.id)  # a new dict: ours
            entity["PartitionKey"] = partition
            entity["RowKey"] = op.id
        else:
            check_flat(op.body)
            entity = _typed({**op.body, "PartitionKey": partition, "RowKey": op.id})
        conditional = {"etag": op.etag, "match_condition": IF_UNCHANGED} if op.etag else {}
        if op.kind == "create":
            return ("create", entity)
        if op.kind == "upsert":
            return ("upsert", entity, {"mode": UpdateMode.REPLACE})
        if op.kind == "replace":
            return ("update", entity, {"mode": UpdateMode.REPLACE, **conditional})
        if op.kind == "delete":
            return ("delete", entity, conditional)
        raise NotImplementedError(f"Table Storage has no {op.kind!r} operation; use replace")

    @classmethod
    def _commit_batch(cls, marker: IdempotencyRecord, operations: Sequence[WriteOp],
                      marker_body: dict[str, Any] | None) -> list[tuple[Any, ...]]:
        """An atomic commit's transaction: the marker (create, or replace of an expired one) first."""
        if marker_body:
            check_flat(marker_body)
        entity = cls._record_entity(marker, marker_body)
        first: tuple[Any, ...] = (
            ("update", entity, {"mode": UpdateMode.REPLACE, "etag": marker.etag,
                                "match_condition": IF_UNCHANGED})
            if marker.etag else ("create", entity))
        return [first, *(cls._transaction_op(marker.partition_key, op) for op in operations)]

    @staticmethod
    def _dispatched_entity(marker: IdempotencyRecord) -> dict[str, Any]:
        """The merge that clears a marker's pending messages: a merge cannot remove a property,
        so the chunks become empty strings (read as none) and the pending time 0 (filters want > 0)."""
        blanks: dict[str, Any] = {name: "" for name in pending_names(marker)}
        if PENDING_SINCE in blanks:
            blanks[PENDING_SINCE] = EntityProperty(0, EdmType.INT64)  # the type it was written in
        return {**blanks, "PartitionKey": marker.partition_key, "RowKey": marker.id}

    _PENDING_FILTER = f"{PENDING_SINCE} gt 0L and {PENDING_SINCE} lt @before"
    _PENDING_SELECT = ("PartitionKey", "RowKey")

    @staticmethod
    def _document(partition: str, document_id: str, entity: Any) -> Document:
        body = {k: v for k, v in _plain(entity).items() if k not in _SYSTEM}
        return Document(document_id, partition, body, etag_of(entity.metadata))

    _submit: Callable[..., Any]  # the variant's $batch sender: (client, batch, *, codec)
    _batch_codec: Codec

    def _transaction_request[T](self, batch: list[tuple[Any, ...]], marker_id: str | None,
                                answer: Callable[[list[Any]], T]) -> Request[T]:
        """One entity-group transaction; a failed operation maps to the store contract."""
        check_transaction_size(len(batch))
        return Request(lambda client: self._submit(client, batch, codec=self._batch_codec),
                       answer, refine=lambda error: transaction_error(error, marker_id)
                       if isinstance(error, TableTransactionError) else None)

    def _get_record(self, partition: str, record_id: str) -> Request[IdempotencyRecord | None]:
        return Request(lambda client: client.get_entity(partition, record_id),
                       lambda entity: self._to_record(entity)
                       if entity is not None and is_record(entity) else None, none_if_missing=True)

    def _put_record_if_absent(self, record: IdempotencyRecord) -> Request[IdempotencyRecord]:
        return Request(lambda client: client.create_entity(self._record_entity(record)),
                       lambda metadata: written_record(record, metadata),
                       on_status={409: lambda: RecordExistsError(record.id)})

    def _replace_record_if_unchanged(self, record: IdempotencyRecord) -> Request[IdempotencyRecord]:
        entity = self._record_entity(record)
        return Request(lambda client: client.update_entity(
            entity, mode=UpdateMode.REPLACE, etag=record.etag, match_condition=IF_UNCHANGED),
            lambda metadata: written_record(record, metadata),
            on_status=changed_statuses(record.id))

    def _record_dispatched(self, marker: IdempotencyRecord) -> Request[IdempotencyRecord]:
        entity = self._dispatched_entity(marker)
        return Request(lambda client: client.update_entity(
            entity, mode=UpdateMode.MERGE, etag=marker.etag, match_condition=IF_UNCHANGED),
            lambda metadata: marker.evolve(etag=etag_of(metadata), outbox=(), server_time=None),
            on_status=changed_statuses(marker.id))

    def _delete_record_if_unchanged(self, record: IdempotencyRecord) -> Request[None]:
        return Request(lambda client: client.delete_entity(
            record.partition_key, record.id, etag=record.etag, match_condition=IF_UNCHANGED),
            lambda _: None, on_status=changed_statuses(record.id))

    def _read_document(self, partition: str, document_id: str) -> Request[Document | None]:
        return Request(lambda client: client.get_entity(partition, document_id),
                       lambda entity: None if entity is None
                       else self._document(partition, document_id, entity), none_if_missing=True)

    def _write_documents(self, partition: str, operations: Sequence[WriteOp]
                         ) -> Request[list[Document]]:
        return self._transaction_request(
            [self._transaction_op(partition, op) for op in operations], None,
            lambda results: [Document(op.id, partition, op.body, etag_of(meta))
                             for op, meta in zip(operations, results, strict=True)])

    def _commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp],
                marker_body: dict[str, Any] | None, written: list[Document] | None
                ) -> Request[IdempotencyRecord]:
        return self._transaction_request(
            self._commit_batch(marker, operations, marker_body), marker.id,
            lambda results: self._committed(marker, operations, results, written))


def transaction_error(error: TableTransactionError, marker_id: str | None) -> Exception:
    """The store-contract error for a failed entity-group transaction."""
    return transaction_failure(error.index or 0, error.status_code, marker_id=marker_id,
                               detail=str(error).splitlines()[0])
