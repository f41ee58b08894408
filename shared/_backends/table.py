"""Table Storage backend (`azure-data-tables`).

Claim = `create_entity` (409 = exists); takeover, completion and release are etag-conditional.
Atomic path = one entity-group transaction (same PartitionKey, <= 100 entities), sent through
`table_batch`. Table Storage has no TTL: every read checks the expiry (`codec.EXPIRES`), and
`sweep` / `purge_expired` delete expired rows one page at a time within a time budget,
resuming next run where they stopped. The entity mapping is `table_mapping`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential, TokenCredential
from azure.data.tables import TableClient, UpdateMode

from shared._backends.sdk_requests import send_request, store_call, store_items
from shared._backends.table_batch import Codec, submit_transaction
from shared._backends.table_mapping import BACKEND, IF_UNCHANGED, TableMapping
from shared._core.codec import (
    EXPIRES,
    LEASE,
    STATE,
    VERSION,
    bound_millis,
    is_record,
)
from shared._core.exceptions import OperationFailedError, RecordExistsError, StoreRequestError
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import MAX_TRANSACTION_OPERATIONS, StepStore, StoreStep
from shared._core.sweep import (
    DEFAULT_BUDGET_SECONDS,
    DEFAULT_PAGE_SIZE,
    Deadline,
    StaleHandler,
    SweepReport,
    Timer,
    is_expired,
    is_stale,
)

#: Where a sweep keeps its continuation (PartitionKey, RowKey): the library's key encoding
#: starts a key with "~" only for a 64-digit hash, and the entity is no record (no codec.VERSION).
SWEEP_CURSOR = ("~maintenance", "sweep")
_CURSOR_VERSION = 1
# A marker of any format version (its version is an Int32 >= 1); business rows have none.
_IS_RECORD = f"{VERSION} gt 0"
logger = logging.getLogger(__name__)


class TableIdempotencyStore(TableMapping, StepStore):
    """Dedup records and business entities in one Azure Table.

    `close` closes a client the store created; a client passed in (`table_client=`,
    `from_table_client`) stays its caller's. `batch_codec`: "lean" (default) sends
    transactions through `table_batch`'s codec (which falls back to the SDK's path by itself
    when the installed SDK does not fit); "sdk" always takes the SDK's path.
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

    def perform(self, step: StoreStep) -> Any:
        return send_request(BACKEND, self._client, self.request_for(step))

    def _transaction(self, batch: list[tuple[Any, ...]], *, marker_id: str | None) -> list[Any]:
        """One entity-group transaction (the purge's)."""
        return send_request(BACKEND, self._client,
                            self._transaction_request(batch, marker_id, lambda results: results))

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        """A filter on `PENDING_SINCE` answering the keys of pending markers, each then read
        whole: the service scans the table, but the answer and the reads grow with the
        pending markers only."""
        pages = store_call(BACKEND, lambda: self._client.query_entities(
            self._PENDING_FILTER, parameters={"before": bound_millis(since_before)},
            select=list(self._PENDING_SELECT)))
        for row in store_items(BACKEND, pages):
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
        for entity in store_items(BACKEND, pages):
            if is_record(entity):
                yield self._to_record(entity)

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

        A filter makes the service read every row (no secondary index), so a run covers what
        its budget allows and saves the continuation (`SWEEP_CURSOR`, an entity in this
        table) after each page; the next run resumes there, and a finished scan starts over.
        A page's expired rows are deleted (transactions per partition) before the next is
        read, so memory holds one page; the budget is checked before each page. A
        continuation the service refuses, or an unreadable cursor, restarts the scan.
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
        """Expired, or (when asked) in progress past the cut-off. The SDK substitutes `@name`
        between spaces only, hence the spaced parentheses."""
        params: dict[str, Any] = {"expiry": bound_millis(now)}
        query = f"{_IS_RECORD} and ( {EXPIRES} lt @expiry"
        if stale_before is not None:
            query += f" or ( {STATE} eq @state and {LEASE} lt @lease )"
            params.update(state=RecordState.IN_PROGRESS.value, lease=bound_millis(stale_before))
        return query + " )", params

    def _sweep_page(self, query: str, params: dict[str, Any], page_size: int,
                    token: dict[str, str] | None) -> tuple[list[Any], dict[str, str] | None]:
        """The entities of one page from `token`, and the next continuation."""
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
        """Etag-conditional deletes in transactions of <= 100 (one alone is a plain delete);
        a transaction with a row changed meanwhile goes one by one."""
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
            except OperationFailedError:
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

    def close(self) -> None:
        """Close the client this store created; a caller's client stays open."""
        if self._owned is not None:
            self._owned.close()
