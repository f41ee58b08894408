"""The two persistence interfaces every dedup backend implements, and what they share.

`RecordStore` is the dedup flow's whole view of storage: four record
operations by location, each a single conditional request (the Powertools
idempotency utility draws the same line). `DocumentStore` holds business
documents and commits them atomically in one partition, optionally with a
marker record first: the atomic path. Backends implement both; the flows
(`shared.flow`, `shared.idempotency`) know nothing of any backend.

Business documents are backend-neutral: an id, a partition and a flat body,
mapped to a Cosmos document (`id` + partition key field) or a Table entity
(`PartitionKey` + `RowKey`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from azure.core.exceptions import AzureError, HttpResponseError

from shared.exceptions import (
    RETRIABLE_STATUS,
    IdempotencyError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
    StoreRequestError,
    StoreUnavailableError,
)
from shared.records import IdempotencyRecord
from shared.stores.sweep import (
    DEFAULT_BUDGET_SECONDS,
    Deadline,
    StaleHandler,
    SweepReport,
    Timer,
)

OperationKind = Literal["create", "replace", "upsert", "patch", "delete"]
#: Statuses of a conditional write that lost to a concurrent writer: re-read and try again.
RACE_STATUSES = frozenset({404, 409, 412})
MAX_TRANSACTION_OPERATIONS = 100  # Cosmos transactional batch and Table entity-group transaction


@dataclass(frozen=True)
class Document:
    """A business document read from the store, with its etag for conditional writes."""

    id: str
    partition: str
    body: dict[str, Any]
    etag: str | None = None


@dataclass(frozen=True)
class WriteOp:
    """One business write inside an atomic commit (same partition as the marker)."""

    kind: OperationKind
    id: str
    body: dict[str, Any] = field(default_factory=dict[str, Any])
    etag: str | None = None  # replace/patch/delete only when the document is unchanged
    patch: tuple[dict[str, Any], ...] = ()  # Cosmos patch operations
    record: IdempotencyRecord | None = None  # a marker of a group: the backend encodes it

    @classmethod
    def marker(cls, record: IdempotencyRecord) -> WriteOp:
        """A further marker in a group commit: created, or replaced under its etag (takeover)."""
        return cls("replace" if record.etag else "create", record.id, etag=record.etag,
                   record=record)


class RecordStore(abc.ABC):
    """Dedup records by location (partition, id): the four operations the flow needs."""

    #: Backend name for logs and metrics.
    name: str = "store"

    @abc.abstractmethod
    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        """The record stored at (partition, record_id), or None."""

    @abc.abstractmethod
    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        """Create the record; RecordExistsError when one is there. Returns it with its etag."""

    @abc.abstractmethod
    def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        """Replace when the stored etag equals `record.etag`; RecordChangedError otherwise."""

    @abc.abstractmethod
    def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        """Delete when the stored etag equals `record.etag`; RecordChangedError otherwise."""

    # Maintenance (the sweep in shared.maintenance), not the per-message flow.
    @abc.abstractmethod
    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        """Records whose lease ran out before a time, or which expired before a time."""

    def purge_expired(self, now: float) -> int:
        """Delete records that expired before `now`; return how many were deleted. Streams the
        query (a deleted record does not disturb it), so memory stays flat."""
        return self._delete_each(self.iter_records(expired_before=now))

    def sweep(self, now: float, *, stale_before: float | None = None,
              on_stale: StaleHandler | None = None,
              budget_seconds: float = DEFAULT_BUDGET_SECONDS,
              timer: Timer = time.monotonic) -> SweepReport:
        """Purge what expired before `now`, then hand each record in progress past
        `stale_before` to `on_stale`, stopping when `budget_seconds` run out.

        This default runs the two filtered queries, which cost what they return on an
        indexed store; handled claims leave the filter, so a stopped run simply resumes.
        Table Storage overrides it with one bounded, resumable scan.
        """
        deadline = Deadline(budget_seconds, timer=timer)
        report = SweepReport(purged=self.purge_expired(now))
        if stale_before is None or on_stale is None:
            return report
        for record in self.iter_records(in_progress_before=stale_before):
            if deadline.passed():
                report.complete = False
                break
            report.rows_read += 1
            on_stale(record)
            report.stale += 1
        return report

    def _delete_each(self, records: Iterable[IdempotencyRecord]) -> int:
        deleted = 0
        for record in records:
            try:
                self.delete_record_if_unchanged(record)
                deleted += 1
            except RecordChangedError:
                pass  # taken over or renewed since the query: keep it
        return deleted

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release network resources."""


class DocumentStore(abc.ABC):
    """Business documents, written atomically within one partition."""

    @abc.abstractmethod
    def read_document(self, partition: str, document_id: str) -> Document | None:
        """Point read of a business document."""

    @abc.abstractmethod
    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        """Apply `operations` atomically in one partition (no marker).

        OperationFailedError (or StoreUnavailableError) names the failing one;
        nothing is written then.
        """

    @abc.abstractmethod
    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        """Write the marker first and `operations` in one transaction in its partition.

        The marker is created, or replaced when it carries an etag (taking over
        an expired record). RecordExistsError / RecordChangedError when the
        marker write fails; OperationFailedError when a business write fails.
        Nothing is written in either case. `written`, when given, receives the
        documents `operations` created or replaced, with their new etags
        (`written_documents`), so a caller can write them again without a read.
        """

    def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        """Clear `marker`'s pending outgoing messages under its etag, keeping every other
        property (a marker that is a business document keeps its body): one request.
        Returns it with its new etag and no outbox; RecordChangedError when it changed."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outgoing messages")

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        """Markers whose outgoing messages have been pending since before a time (the
        sweeper's query: its cost grows with the pending markers, see each backend)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outgoing messages")

    def commit_group(self, markers: Sequence[IdempotencyRecord], operations: Sequence[WriteOp], *,
                     written: list[Document] | None = None) -> list[IdempotencyRecord]:
        """Write several markers of one partition, in order, then `operations`, in one transaction.

        All commit or nothing does. RecordExistsError / RecordChangedError say
        which marker failed in their `index`; OperationFailedError's index
        counts `operations` only. Built on `commit` (the further markers travel
        as `WriteOp.marker` operations), so every backend, and any wrapper that
        forwards `commit`, commits groups the same way. Returns the markers;
        only the first carries its new etag. `written` as for `commit`.
        """
        first, rest = group_commit(markers, operations)
        try:
            committed = self.commit(first, rest, written=written)
        except OperationFailedError as error:
            failure = group_commit_error(error, markers)
            if failure is None:
                raise
            raise failure from error
        return [committed, *_without_etags(markers[1:])]


def written_documents(partition: str, operations: Sequence[WriteOp],
                      etags: Sequence[str | None]) -> list[Document]:
    """The business documents a transaction created or replaced, with the etags it answered
    (further markers, patches and deletes leave nothing to reuse)."""
    return [Document(op.id, partition, op.body, etag)
            for op, etag in zip(operations, etags, strict=True)
            if op.record is None and op.kind in ("create", "replace", "upsert") and etag]


def group_commit(markers: Sequence[IdempotencyRecord], operations: Sequence[WriteOp]
                 ) -> tuple[IdempotencyRecord, list[WriteOp]]:
    """A group commit as one `commit`: the first marker, then the others and `operations`."""
    first, *rest = markers
    if any(marker.partition_key != first.partition_key for marker in rest):
        raise ValueError("a group commit holds the markers of one partition")
    return first, [*(WriteOp.marker(m) for m in rest), *operations]


def _without_etags(markers: Sequence[IdempotencyRecord]) -> list[IdempotencyRecord]:
    """A group's further markers as committed: their new etags are unknown (a new marker has
    none to drop, so it is kept as it is)."""
    return [marker if marker.etag is None else marker.evolve(etag=None) for marker in markers]


def group_commit_error(error: OperationFailedError, markers: Sequence[IdempotencyRecord]
                       ) -> Exception | None:
    """`commit`'s failure as the group's: the failed marker by index, or the business write's
    (None: raise `error` as it is)."""
    others = len(markers) - 1
    if error.index >= others:
        return OperationFailedError(error.index - others, error.status_code)
    index = error.index + 1
    if error.status_code == 409:
        return RecordExistsError(markers[index].id, index=index)
    if error.status_code in (404, 412):
        return RecordChangedError(markers[index].id, index=index)
    return None


class AsyncDocumentStore:
    """`DocumentStore.commit_group` for the async stores: built on their awaited `commit`."""

    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None,
                     written: list[Document] | None = None) -> IdempotencyRecord:
        raise NotImplementedError

    async def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        """See `DocumentStore.record_dispatched`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outgoing messages")

    async def commit_group(self, markers: Sequence[IdempotencyRecord],
                           operations: Sequence[WriteOp], *,
                           written: list[Document] | None = None) -> list[IdempotencyRecord]:
        """See `DocumentStore.commit_group`."""
        first, rest = group_commit(markers, operations)
        try:
            committed = await self.commit(first, rest, written=written)
        except OperationFailedError as error:
            failure = group_commit_error(error, markers)
            if failure is None:
                raise
            raise failure from error
        return [committed, *_without_etags(markers[1:])]


class IdempotencyStore(RecordStore, DocumentStore, abc.ABC):
    """A backend that keeps records and business documents together (Cosmos, Table, memory)."""


# -- shared by the backends ---------------------------------------------------------------
def check_transaction_size(count: int) -> None:
    if count > MAX_TRANSACTION_OPERATIONS:
        raise ValueError(f"a transaction holds at most {MAX_TRANSACTION_OPERATIONS} operations, "
                         f"got {count}")


def transaction_failure(index: int, status: int | None, *, marker_id: str | None,
                        detail: str = "") -> IdempotencyError:
    """The store-contract error for a failed transaction (the marker, if any, at index 0).

    Marker 409 = exists, marker 404/412 = changed, throttling or timeouts =
    retriable, anything else = the business operation at that index failed.
    """
    if marker_id is not None and index == 0:
        if status == 409:
            return RecordExistsError(marker_id)
        if status in (404, 412):
            return RecordChangedError(marker_id)
    if status in RETRIABLE_STATUS:
        return StoreUnavailableError(f"transaction failed with {status}", status_code=status)
    return OperationFailedError(index - (marker_id is not None), status, detail)


def changed_statuses(record_id: str) -> dict[int, Callable[[], Exception]]:
    """An etag-conditional write's contract: 412 (changed) or 404 (gone) = RecordChangedError."""
    return {412: lambda: RecordChangedError(record_id), 404: lambda: RecordChangedError(record_id)}


def translate_error(backend: str, error: AzureError, *,
                    on_status: dict[int, Callable[[], Exception]] | None = None,
                    none_if_missing: bool = False) -> None:
    """Raise the library's exception for an SDK failure; return (answer None) on a missing read.

    `on_status` maps the statuses that are part of the store contract for this
    request (409 on a create, 412/404 on a conditional write) to the error to
    raise; throttling, timeouts, 5xx and transport failures become
    StoreUnavailableError; anything else StoreRequestError. The SDK error is
    always chained as the cause. `none_if_missing` answers a 404 (point read) with None.
    One translation for the sync and the async stores.
    """
    if not isinstance(error, HttpResponseError):  # connection refused, timeouts, broken responses
        raise StoreUnavailableError(f"{backend} unreachable: {error}", error=error) from error
    status = error.status_code
    if none_if_missing and status == 404:
        return
    if on_status and status in on_status:
        raise on_status[status]() from error
    if status is None or status in RETRIABLE_STATUS:
        raise StoreUnavailableError(f"{backend} answered {status}", status_code=status,
                                    error=error) from error
    raise StoreRequestError(f"{backend} rejected the request ({status}): {error.message}",
                            status_code=status) from error


StatusErrors = dict[int, Callable[[], Exception]]


@overload
def store_call[T](backend: str, action: Callable[[], T], *, on_status: StatusErrors | None = None,
                  none_if_missing: Literal[False] = False) -> T: ...
@overload
def store_call[T](backend: str, action: Callable[[], T], *, on_status: StatusErrors | None = None,
                  none_if_missing: bool) -> T | None: ...
def store_call[T](backend: str, action: Callable[[], T], *,
                  on_status: StatusErrors | None = None,
                  none_if_missing: bool = False) -> T | None:
    """Run one store request; its failure translated by `translate_error`."""
    try:
        return action()
    except AzureError as error:
        translate_error(backend, error, on_status=on_status, none_if_missing=none_if_missing)
        return None


@overload
async def async_store_call[T](backend: str, action: Callable[[], Awaitable[T]], *,
                              on_status: StatusErrors | None = None,
                              none_if_missing: Literal[False] = False) -> T: ...
@overload
async def async_store_call[T](backend: str, action: Callable[[], Awaitable[T]], *,
                              on_status: StatusErrors | None = None,
                              none_if_missing: bool) -> T | None: ...
async def async_store_call[T](backend: str, action: Callable[[], Awaitable[T]], *,
                              on_status: StatusErrors | None = None,
                              none_if_missing: bool = False) -> T | None:
    """`store_call` for an async SDK request (the same translation)."""
    try:
        return await action()
    except AzureError as error:
        translate_error(backend, error, on_status=on_status, none_if_missing=none_if_missing)
        return None


@dataclass(frozen=True, slots=True)
class Request[T]:
    """One store request, built once for a backend's sync and async store (the mapping
    builds it; only sending it differs): `send(client)` makes the SDK call (the sync SDK
    answers, the async one returns an awaitable), `answer` turns the SDK's answer into the
    store's; `on_status` and `none_if_missing` as for `translate_error`; `refine` may name a
    more precise error for one the SDK raised (a failed transaction's operation)."""

    send: Callable[[Any], Any]
    answer: Callable[[Any], T]
    on_status: StatusErrors | None = None
    none_if_missing: bool = False
    refine: Callable[[Exception], Exception | None] | None = None


def _raise_refined(request: Request[Any], error: Exception) -> None:
    """Raise the request's more precise error for `error`, if it names one."""
    refined = request.refine(error) if request.refine is not None else None
    if refined is not None:
        raise refined from error


def send_request[T](backend: str, client: Any, request: Request[T]) -> T:
    """Send a request with a sync SDK client; its failure translated by `translate_error`."""
    def call() -> Any:
        try:
            return request.send(client)
        except Exception as error:
            _raise_refined(request, error)
            raise

    return request.answer(store_call(backend, call, on_status=request.on_status,
                                     none_if_missing=request.none_if_missing))


async def send_request_async[T](backend: str, client: Any, request: Request[T]) -> T:
    """`send_request` with an async SDK client (the same translation)."""
    async def call() -> Any:
        try:
            return await request.send(client)
        except Exception as error:
            _raise_refined(request, error)
            raise

    return request.answer(await async_store_call(backend, call, on_status=request.on_status,
                                                 none_if_missing=request.none_if_missing))
