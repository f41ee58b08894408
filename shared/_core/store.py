"""The persistence interfaces every dedup backend implements, the steps they answer, and what
they share.

`RecordStore` is the dedup flow's whole view of storage: four record operations by location,
each a single conditional request. `DocumentStore` holds business documents (an id, a partition
and a flat body) and commits them atomically in one partition, optionally with a marker record
first: the atomic path. The flows know nothing of any backend.

What a flow asks of a store is a store step (`GetRecord`, ..., `RecordDispatched`): a frozen
dataclass the drivers hand to `perform`, the one call into a store. A store written as methods
answers it by the method; Cosmos DB and Table Storage build the step's SDK request.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shared._core.exceptions import (
    RETRIABLE_STATUS,
    IdempotencyError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
    StoreUnavailableError,
)
from shared._core.records import IdempotencyRecord
from shared._core.sweep import (
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


# -- the store steps: what a flow asks of a store (`shared._flows.steps`), each one request ------------
@dataclass(frozen=True, slots=True)
class GetRecord:
    """Read a dedup record by location. Answer: the record, or None."""

    partition: str
    record_id: str


@dataclass(frozen=True, slots=True)
class PutRecordIfAbsent:
    """Create a record. Answer: it with its etag; RecordExistsError when one is there."""

    record: IdempotencyRecord


@dataclass(frozen=True, slots=True)
class ReplaceRecordIfUnchanged:
    """Replace a record under its etag. Answer: it with its new etag; RecordChangedError."""

    record: IdempotencyRecord


@dataclass(frozen=True, slots=True)
class DeleteRecordIfUnchanged:
    """Delete a record under its etag. Answer: None; RecordChangedError."""

    record: IdempotencyRecord


@dataclass(frozen=True, slots=True)
class ReadDocument:
    """Point read of a business document. Answer: the document, or None."""

    partition: str
    document_id: str


@dataclass(frozen=True, slots=True)
class WriteDocuments:
    """Apply writes atomically in one partition, no marker. Answer: the written documents."""

    partition: str
    operations: Sequence[WriteOp]


@dataclass(frozen=True, slots=True)
class Committed:
    """The answer to `Commit` and `CommitGroup`: the markers as stored and the business
    documents the transaction created or replaced, with their new etags."""

    markers: tuple[IdempotencyRecord, ...]
    written: tuple[Document, ...] = ()


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit a marker and business writes in one transaction. Answer: `Committed`;
    RecordExistsError / RecordChangedError for the marker, OperationFailedError for a write."""

    marker: IdempotencyRecord
    operations: Sequence[WriteOp]
    marker_body: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CommitGroup:
    """Commit several markers of one partition, in order, and business writes in one
    transaction. Answer: `Committed`; a marker's error names it by `index`."""

    markers: tuple[IdempotencyRecord, ...]
    operations: Sequence[WriteOp]


@dataclass(frozen=True, slots=True)
class RecordDispatched:
    """Clear a marker's pending messages under its etag, leaving every other field (a marker
    that is a business document keeps its body). Answer: the marker with its new etag and
    no outbox; RecordChangedError when it changed or vanished since it was read."""

    marker: IdempotencyRecord


StoreStep = (GetRecord | PutRecordIfAbsent | ReplaceRecordIfUnchanged | DeleteRecordIfUnchanged
             | ReadDocument | WriteDocuments | Commit | CommitGroup | RecordDispatched)


class RecordStore(abc.ABC):
    """Dedup records by location (partition, id): the four operations the flow needs."""

    #: Backend name for logs and metrics.
    name: str = "store"

    def perform(self, step: StoreStep) -> Any:
        """Answer one store step by the method that makes its request."""
        match step:
            case GetRecord(partition, record_id):
                return self.get_record(partition, record_id)
            case PutRecordIfAbsent(record):
                return self.put_record_if_absent(record)
            case ReplaceRecordIfUnchanged(record):
                return self.replace_record_if_unchanged(record)
            case DeleteRecordIfUnchanged(record):
                return self.delete_record_if_unchanged(record)
            case _:
                raise TypeError(f"{type(self).__name__} holds records only: the atomic path "
                                "needs a DocumentStore")

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

    # Maintenance (shared._triggers.maintenance), not the per-message flow.
    @abc.abstractmethod
    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        """Records whose lease ran out before a time, or which expired before a time."""

    def purge_expired(self, now: float) -> int:
        """Delete records that expired before `now`; return how many. Streams the query, so
        memory stays flat."""
        return self._delete_each(self.iter_records(expired_before=now))

    def sweep(self, now: float, *, stale_before: float | None = None,
              on_stale: StaleHandler | None = None,
              budget_seconds: float = DEFAULT_BUDGET_SECONDS,
              timer: Timer = time.monotonic) -> SweepReport:
        """Purge what expired before `now`, then hand each record in progress past
        `stale_before` to `on_stale`, stopping when `budget_seconds` run out.

        Two filtered queries, which cost what they return on an indexed store; handled claims
        leave the filter, so a stopped run simply resumes.
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
        """Apply `operations` atomically in one partition (no marker). OperationFailedError (or
        StoreUnavailableError) names the failing one; nothing is written then."""

    @abc.abstractmethod
    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        """Write the marker (created, or replaced under its etag) first and `operations` in one
        transaction in its partition; errors as for `Commit`, and nothing is written then.
        `written`, when given, receives the documents created or replaced, with their new etags."""

    def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        """Clear `marker`'s pending messages under its etag in one request (`RecordDispatched`)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outgoing messages")

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        """Markers whose outgoing messages have been pending since before a time (the
        sweeper's query)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no outgoing messages")

    def commit_group(self, markers: Sequence[IdempotencyRecord], operations: Sequence[WriteOp], *,
                     written: list[Document] | None = None) -> list[IdempotencyRecord]:
        """Write several markers of one partition, in order, then `operations`, in one transaction.

        A marker's error names it by `index`; OperationFailedError's counts `operations` only.
        Built on `commit`, so any wrapper that forwards `commit` commits groups the same way.
        Returns the markers; only the first carries its new etag.
        """
        first, rest = group_commit(markers, operations)
        try:
            committed = self.commit(first, rest, written=written)
        except OperationFailedError as error:
            failure = group_commit_error(error, markers)
            if failure is None:
                raise
            raise failure from error
        return [committed, *without_etags(markers[1:])]


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


def without_etags(markers: Sequence[IdempotencyRecord]) -> list[IdempotencyRecord]:
    """A group's further markers as committed: their new etags are unknown."""
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


def _markers(committed: Committed, written: list[Document] | None
             ) -> tuple[IdempotencyRecord, ...]:
    """A `Committed` answer's markers, its written documents added to `written` when given."""
    if written is not None:
        written.extend(committed.written)
    return committed.markers


class AsyncIdempotencyStore(abc.ABC):
    """The async stores' interface: implement `perform`; the record and document operations are
    its steps, by name."""

    name: str = "store"

    @abc.abstractmethod
    async def perform(self, step: StoreStep) -> Any:
        """Answer one store step (see the step's docstring)."""

    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return await self.perform(GetRecord(partition, record_id))

    async def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return await self.perform(PutRecordIfAbsent(record))

    async def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return await self.perform(ReplaceRecordIfUnchanged(record))

    async def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        await self.perform(DeleteRecordIfUnchanged(record))

    async def read_document(self, partition: str, document_id: str) -> Document | None:
        return await self.perform(ReadDocument(partition, document_id))

    async def write_documents(self, partition: str, operations: Sequence[WriteOp]
                              ) -> list[Document]:
        return await self.perform(WriteDocuments(partition, operations))

    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None,
                     written: list[Document] | None = None) -> IdempotencyRecord:
        return _markers(await self.perform(Commit(marker, operations, marker_body)), written)[0]

    async def commit_group(self, markers: Sequence[IdempotencyRecord],
                           operations: Sequence[WriteOp], *,
                           written: list[Document] | None = None) -> list[IdempotencyRecord]:
        return list(_markers(await self.perform(CommitGroup(tuple(markers), operations)), written))

    async def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        return await self.perform(RecordDispatched(marker))

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release network resources."""


class IdempotencyStore(RecordStore, DocumentStore, abc.ABC):
    """A backend that keeps records and business documents together (Cosmos, Table, memory)."""

    def perform(self, step: StoreStep) -> Any:
        match step:
            case ReadDocument(partition, document_id):
                return self.read_document(partition, document_id)
            case WriteDocuments(partition, operations):
                return self.write_documents(partition, operations)
            case Commit(marker, operations, marker_body):
                written: list[Document] = []
                committed = self.commit(marker, operations, marker_body=marker_body,
                                        written=written)
                return Committed((committed,), tuple(written))
            case CommitGroup(markers, operations):
                written = []
                return Committed(tuple(self.commit_group(markers, operations, written=written)),
                                 tuple(written))
            case RecordDispatched(marker):
                return self.record_dispatched(marker)
            case _:
                return super().perform(step)


class StepStore(IdempotencyStore):
    """A sync store written as `perform` alone: the record and document operations are its
    steps, by name."""

    @abc.abstractmethod
    def perform(self, step: StoreStep) -> Any:
        """Answer one store step (see the step's docstring)."""

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return self.perform(GetRecord(partition, record_id))

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self.perform(PutRecordIfAbsent(record))

    def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self.perform(ReplaceRecordIfUnchanged(record))

    def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        self.perform(DeleteRecordIfUnchanged(record))

    def read_document(self, partition: str, document_id: str) -> Document | None:
        return self.perform(ReadDocument(partition, document_id))

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        return self.perform(WriteDocuments(partition, operations))

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        return _markers(self.perform(Commit(marker, operations, marker_body)), written)[0]

    def commit_group(self, markers: Sequence[IdempotencyRecord], operations: Sequence[WriteOp], *,
                     written: list[Document] | None = None) -> list[IdempotencyRecord]:
        return list(_markers(self.perform(CommitGroup(tuple(markers), operations)), written))

    def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        return self.perform(RecordDispatched(marker))


# -- shared by the backends ---------------------------------------------------------------
def check_transaction_size(count: int) -> None:
    if count > MAX_TRANSACTION_OPERATIONS:
        raise ValueError(f"a transaction holds at most {MAX_TRANSACTION_OPERATIONS} operations, "
                         f"got {count}")


def transaction_failure(index: int, status: int | None, *, marker_id: str | None,
                        detail: str = "") -> IdempotencyError:
    """The store-contract error for a failed transaction (the marker, if any, at index 0):
    marker 409 = exists, marker 404/412 = changed, a retriable status = unavailable, anything
    else = the business operation at that index failed."""
    if marker_id is not None and index == 0:
        if status == 409:
            return RecordExistsError(marker_id)
        if status in (404, 412):
            return RecordChangedError(marker_id)
    if status in RETRIABLE_STATUS:
        return StoreUnavailableError(f"transaction failed with {status}", status_code=status)
    return OperationFailedError(index - (marker_id is not None), status, detail)
