"""Table Storage backend (`azure-data-tables`).

Claim = `create_entity` (409 = exists). Takeover, completion and release are
etag-conditional. Table Storage has no TTL: every read checks the expiry (`codec.EXPIRES`)
and `sweep` / `purge_expired` delete expired rows in entity-group transactions,
one page at a time within a time budget, resuming next run where they stopped.
Atomic path = one entity-group transaction (same PartitionKey, <= 100 entities), sent
through `table_batch` (the SDK's requests and pipeline, a lean multipart codec).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, Self

from azure.core import MatchConditions
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential, TokenCredential
from azure.data.tables import (
    EdmType,
    EntityProperty,
    TableClient,
    TableEntity,
    TableTransactionError,
    UpdateMode,
)

from shared.exceptions import OperationFailedError, RecordExistsError, StoreRequestError
from shared.outbox import PENDING_SINCE
from shared.records import IdempotencyRecord, RecordState
from shared.stores.base import (
    MAX_TRANSACTION_OPERATIONS,
    Document,
    IdempotencyStore,
    Request,
    WriteOp,
    changed_statuses,
    check_transaction_size,
    send_request,
    store_call,
    transaction_failure,
    written_documents,
)
from shared.stores.codec import (
    EXPIRES,
    LEASE,
    STATE,
    TIME_FIELDS,
    VERSION,
    bound_millis,
    check_flat,
    is_record,
    pending_names,
    record_fields,
    record_from_fields,
)
from shared.stores.sweep import (
    DEFAULT_BUDGET_SECONDS,
    DEFAULT_PAGE_SIZE,
    Deadline,
    StaleHandler,
    SweepReport,
    Timer,
    is_expired,
    is_stale,
)
from shared.stores.table_batch import Codec, submit_transaction

BACKEND = "Table Storage"
_SYSTEM = ("PartitionKey", "RowKey", "Timestamp", "etag")
_INT32 = range(-(2**31), 2**31)
IF_UNCHANGED = MatchConditions.IfNotModified
#: Where a sweep keeps its continuation (PartitionKey, RowKey): the library's key encoding
#: starts a key with "~" only for a 64-digit hash, and the entity is no record (no codec.VERSION).
SWEEP_CURSOR = ("~maintenance", "sweep")
_CURSOR_VERSION = 1
# A marker of any format version (its version is an Int32 >= 1); business rows have none.
_IS_RECORD = f"{VERSION} gt 0"
logger = logging.getLogger(__name__)


def etag_of(metadata: dict[str, Any] | None) -> str | None:
    return (metadata or {}).get("etag")


_ETAG_TIME = "W/\"datetime'"


def etag_time(etag: str | None) -> float | None:
    """When the service wrote an entity, from its etag (`W/"datetime'2026-01-02T03%3A04%3A05.
    1234567Z'"`: the entity's Timestamp, to 100 ns), or None for another form. Under a
    microsecond: every write answers its etag, so this costs no request."""
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


class TableMapping:
    """Record <-> entity and WriteOp -> transaction operation mapping, shared by the sync
    and async stores."""

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
        """The marker with its new etag; what `operations` wrote goes to `written`."""
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
        """The transaction of an atomic commit: the marker (create, or replace of an expired
        one) first."""
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
        so the chunks become empty strings (read as none) and the pending time 0 (the
        sweeper's filter wants > 0); every other property stays as it is."""
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

    # -- the requests, built once for the sync and the async store (`Request`) -------------
    _submit: Callable[..., Any]  # the face's $batch sender: (client, batch, *, codec)
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


class TableIdempotencyStore(TableMapping, IdempotencyStore):
    """Dedup records and business entities in one Azure Table.

    Build it from the table endpoint and a credential (identity in Azure), from
    a connection string (local runs), or around an existing `TableClient`. A
    client the store creates is its own and `close` closes it; a client passed
    in (`table_client=`, `from_table_client`) stays its caller's.
    `batch_codec`: "lean" (default) sends entity-group transactions through
    `table_batch`'s codec, falling back to the SDK's own path by itself when the
    installed SDK does not fit it; "sdk" always takes the SDK's path.
    """

    name = "table"

    def __init__(self, endpoint: str, credential: TokenCredential | AzureNamedKeyCredential |
                 AzureSasCredential | None = None, *, table_name: str,
                 table_client: TableClient | None = None, create_table: bool = False,
                 batch_codec: Codec = "lean", **client_options: Any) -> None:
        self._batch_codec = batch_codec
        self._owned: TableClient | None = None  # the client this store created, if any
        if table_client is None:
            table_client = self._owned = TableClient(endpoint, table_name, credential=credential,
                                                     **client_options)
        self._client = table_client
        if create_table:
            self.ensure_table()

    @classmethod
    def from_connection_string(cls, conn_str: str, *, table_name: str,
                               create_table: bool = False, batch_codec: Codec = "lean",
                               **client_options: Any) -> TableIdempotencyStore:
        client = TableClient.from_connection_string(conn_str, table_name, **client_options)
        store = cls(client.url, table_name=table_name, table_client=client, create_table=create_table,
                    batch_codec=batch_codec)
        store._owned = client  # closed with the store
        return store

    def ensure_table(self) -> None:
        """Create the table if it is missing (local runs; in Azure, Bicep creates it)."""
        with contextlib.suppress(RecordExistsError):
            store_call(BACKEND, self._client.create_table,
                       on_status={409: lambda: RecordExistsError(self._client.table_name)})

    @staticmethod
    def _submit(client: TableClient, batch: list[tuple[Any, ...]], *, codec: Codec) -> list[Any]:
        return submit_transaction(client, batch, codec=codec)  # looked up when sent

    def _send[T](self, request: Request[T]) -> T:
        return send_request(BACKEND, self._client, request)

    def _transaction(self, batch: list[tuple[Any, ...]], *, marker_id: str | None) -> list[Any]:
        """One entity-group transaction (the purge's)."""
        return self._send(self._transaction_request(batch, marker_id, lambda results: results))

    # -- records ----------------------------------------------------------------
    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return self._send(self._get_record(partition, record_id))

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self._send(self._put_record_if_absent(record))

    def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self._send(self._replace_record_if_unchanged(record))

    def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        self._send(self._delete_record_if_unchanged(record))

    def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        return self._send(self._record_dispatched(marker))

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        """A filter on `PENDING_SINCE` returning only the keys of pending markers, each
        then read whole. Table Storage has no secondary index: the service evaluates the
        filter over the table's rows; the requests and bytes of the answer, and the reads,
        grow with the pending markers only (see the README's outbox section)."""
        pages = store_call(BACKEND, lambda: self._client.query_entities(
            self._PENDING_FILTER, parameters={"before": bound_millis(since_before)},
            select=list(self._PENDING_SELECT)))
        iterator = iter(pages)
        while True:
            try:
                row = store_call(BACKEND, lambda: next(iterator))
            except StopIteration:
                return
            record = self.get_record(row["PartitionKey"], row["RowKey"])
            if record is not None and record.outbox:
                yield record

    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        clauses = [_IS_RECORD]
        params: dict[str, Any] = {}
        if in_progress_before is not None:
            clauses.append(f"{STATE} eq @state and {LEASE} lt @lease")
            params.update(state=RecordState.IN_PROGRESS.value, lease=bound_millis(in_progress_before))
        if expired_before is not None:
            clauses.append(f"{EXPIRES} lt @expiry")
            params["expiry"] = bound_millis(expired_before)
        query = " and ".join(clauses)
        pages = store_call(BACKEND, lambda: self._client.query_entities(query, parameters=params))
        iterator: Iterator[TableEntity] = iter(pages)
        while True:
            try:
                entity = store_call(BACKEND, lambda: next(iterator))
            except StopIteration:
                return
            if is_record(entity):
                yield self._to_record(entity)

    # -- maintenance: one bounded, resumable scan -----------------------------------
    #: Rows per page of a sweep; one page is what a sweep holds in memory.
    sweep_page_size: int = DEFAULT_PAGE_SIZE

    def purge_expired(self, now: float, *, budget_seconds: float = DEFAULT_BUDGET_SECONDS,
                      page_size: int | None = None) -> int:
        """Delete expired rows page by page (see `sweep`); a row changed meanwhile is kept."""
        return self.sweep(now, budget_seconds=budget_seconds, page_size=page_size).purged

    def sweep(self, now: float, *, stale_before: float | None = None,
              on_stale: StaleHandler | None = None,
              budget_seconds: float = DEFAULT_BUDGET_SECONDS, timer: Timer = time.monotonic,
              page_size: int | None = None) -> SweepReport:
        """Expired rows deleted and stale claims handed to `on_stale`, in one scan, one page
        at a time, until `budget_seconds` run out.

        Table Storage has no secondary index: a filter on a property makes the service
        read every row, so a run covers what its budget allows and saves the continuation
        (a small entity in this table, `SWEEP_CURSOR`) after each page; the next run
        resumes there, and a finished scan starts over. Expired rows of a page go in
        entity-group transactions per partition (<= 100 each) before the next page is
        read, so memory holds one page. The budget is checked before each page: a run
        ends within one page's work (<= `page_size` deletes) after it. A continuation
        the service refuses, or a cursor this code cannot read, restarts the scan from
        the beginning.
        """
        deadline = Deadline(budget_seconds, timer=timer)
        page_size = page_size or self.sweep_page_size
        report = SweepReport(complete=False)
        stale_before = stale_before if on_stale is not None else None
        token, report.restarted = self._read_sweep_cursor()
        refused = False
        query, params = self._sweep_filter(now, stale_before)
        while not deadline.passed():
            try:
                entities, next_token = self._sweep_page(query, params, page_size, token)
            except (StoreRequestError, ValueError) as error:
                if token is None or refused:  # not the stored continuation's fault
                    raise
                refused = True
                logger.warning("sweep continuation refused (%s): the scan of %s restarts",
                               error, self._client.table_name)
                token, report.restarted = None, True
                continue
            report.pages += 1
            report.rows_read += len(entities)
            self._sweep_rows(entities, now, stale_before, on_stale, report)
            token = next_token
            if token is None:
                self._clear_sweep_cursor()
                report.complete = True
                return report
            self._save_sweep_cursor(token, now)
        return report

    @staticmethod
    def _sweep_filter(now: float, stale_before: float | None) -> tuple[str, dict[str, Any]]:
        """The service-side filter: expired, or (when asked) in progress past the cut-off.
        (The SDK substitutes `@name` between spaces only, hence the spaced parentheses.)"""
        params: dict[str, Any] = {"expiry": bound_millis(now)}
        query = f"{_IS_RECORD} and ( {EXPIRES} lt @expiry"
        if stale_before is not None:
            query += f" or ( {STATE} eq @state and {LEASE} lt @lease )"
            params.update(state=RecordState.IN_PROGRESS.value, lease=bound_millis(stale_before))
        return query + " )", params

    def _sweep_page(self, query: str, params: dict[str, Any], page_size: int,
                    token: dict[str, str] | None) -> tuple[list[Any], dict[str, str] | None]:
        """One page of the scan from `token`: its entities and the next continuation."""
        def fetch() -> tuple[list[Any], dict[str, str] | None]:
            pages = self._client.query_entities(query, parameters=params,
                                                results_per_page=page_size
                                                ).by_page(continuation_token=token)
            first: Any = next(pages, None)  # the SDK's pager is untyped
            entities: list[Any] = [] if first is None else list(first)
            return entities, pages.continuation_token or None

        return store_call(BACKEND, fetch)

    def _sweep_rows(self, entities: list[Any], now: float, stale_before: float | None,
                    on_stale: StaleHandler | None, report: SweepReport) -> None:
        """Hand on a page's stale claims, then delete its expired rows per partition."""
        expired: dict[str, list[IdempotencyRecord]] = defaultdict(list)
        for entity in entities:
            if not is_record(entity):
                continue
            record = self._to_record(entity)
            if is_expired(record, now):
                expired[record.partition_key].append(record)
            elif on_stale is not None and stale_before is not None and is_stale(record, stale_before):
                on_stale(record)
                report.stale += 1
        for partition, records in expired.items():
            report.purged += self._delete_expired(partition, records)

    def _delete_expired(self, partition: str, records: list[IdempotencyRecord]) -> int:
        """Etag-conditional deletes in entity-group transactions of <= 100 (one alone is a
        plain delete); a transaction with a row changed meanwhile goes one by one."""
        deleted = 0
        for start in range(0, len(records), MAX_TRANSACTION_OPERATIONS):
            chunk = records[start:start + MAX_TRANSACTION_OPERATIONS]
            if len(chunk) == 1:
                deleted += self._delete_each(chunk)
                continue
            ops = [("delete", {"PartitionKey": partition, "RowKey": r.id},
                    {"etag": r.etag, "match_condition": IF_UNCHANGED}) for r in chunk]
            try:
                self._transaction(ops, marker_id=None)
                deleted += len(chunk)
            except OperationFailedError:  # one row changed meanwhile: go one by one
                deleted += self._delete_each(chunk)
        return deleted

    def _read_sweep_cursor(self) -> tuple[dict[str, str] | None, bool]:
        """(continuation, restarted): None when no scan is under way, or when the stored
        cursor is not one this code wrote (then restarted is True)."""
        entity = store_call(BACKEND, lambda: self._client.get_entity(*SWEEP_CURSOR),
                            none_if_missing=True)
        if entity is None:
            return None, False
        token = {"PartitionKey": entity.get("nextPartitionKey"), "RowKey": entity.get("nextRowKey")}
        if entity.get("version") != _CURSOR_VERSION or not all(
                isinstance(value, str) for value in token.values()):
            logger.warning("unreadable sweep cursor in %s: the scan restarts",
                           self._client.table_name)
            return None, True
        return token, False

    def _save_sweep_cursor(self, token: dict[str, str], now: float) -> None:
        entity = {"PartitionKey": SWEEP_CURSOR[0], "RowKey": SWEEP_CURSOR[1],
                  "version": _CURSOR_VERSION, "nextPartitionKey": token.get("PartitionKey") or "",
                  "nextRowKey": token.get("RowKey") or "", "savedAt": float(now)}
        store_call(BACKEND, lambda: self._client.upsert_entity(entity, mode=UpdateMode.REPLACE))

    def _clear_sweep_cursor(self) -> None:
        store_call(BACKEND, lambda: self._client.delete_entity(*SWEEP_CURSOR), none_if_missing=True)

    # -- documents --------------------------------------------------------------
    def read_document(self, partition: str, document_id: str) -> Document | None:
        return self._send(self._read_document(partition, document_id))

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        return self._send(self._write_documents(partition, operations))

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        return self._send(self._commit(marker, operations, marker_body, written))

    def close(self) -> None:
        """Close the client this store created; a caller's client stays open."""
        if self._owned is not None:
            self._owned.close()
