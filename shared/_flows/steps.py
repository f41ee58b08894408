"""The step protocol every flow of the library speaks: what a flow yields and is answered.

A flow is a generator: it yields a step (a frozen dataclass of the closed union `Step`),
receives the step's answer or has its error thrown in, and returns its value. It performs no
I/O, so one flow serves the sync and the async driver (`shared._flows.drivers`), and a test can
step it by hand with no store at all.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared._core.exceptions import (
    ConcurrencyRetriesExhaustedError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
)
from shared._core.keys import DedupKey
from shared._core.outbox import OutgoingMessage, PropertyValue, check_pending_size, outgoing
from shared._core.records import IdempotencyRecord
from shared._core.store import (
    RACE_STATUSES,
    Document,
    ReadDocument,
    StoreStep,
    WriteDocuments,
    WriteOp,
)
from shared._flows.cache import DocumentCache


# -- what the steps carry --------------------------------------------------------------------
class Writes:
    """What one atomic commit writes besides its markers: business writes, in order, in the
    markers' partition, and the messages it sends (recorded on the marker, dispatched after).

    `key` is the dedup key the messages' default ids derive from (the marker carrying them);
    `correlation_id` the incoming message's, propagated unless `send` is given another.
    """

    def __init__(self, partition: str, *, key: DedupKey | None = None,
                 correlation_id: str | None = None) -> None:
        self.partition = partition
        self.operations: list[WriteOp] = []
        self.outgoing: list[OutgoingMessage] = []
        self._key = key
        self._correlation_id = correlation_id
        self._ordinals: Counter[str] = Counter()

    def send(self, destination: str, body: bytes | str | Mapping[str, Any] | Sequence[Any], *,
             message_id: str | None = None, content_type: str | None = None,
             properties: Mapping[str, PropertyValue] | None = None,
             correlation_id: str | None = None, session_id: str | None = None,
             partition_key: str | None = None,
             scheduled_enqueue_time: datetime.datetime | None = None) -> OutgoingMessage:
        """Record a message to send once this transaction has committed (re-sent until
        recorded as dispatched).

        Its id defaults to one derived from the key, the destination and its ordinal there,
        so a rebuilt transaction yields the same ids. Too large a body, or too many bytes for
        one marker, raises OutgoingMessageTooLargeError here, before anything commits.
        """
        if self._key is None:
            raise TypeError("this transaction has no dedup key to send for (use an atomic commit)")
        ordinal = self._ordinals[destination]
        message = outgoing(self._key, destination, body, ordinal=ordinal, message_id=message_id,
                           content_type=content_type,
                           correlation_id=correlation_id or self._correlation_id,
                           properties=properties, session_id=session_id,
                           partition_key=partition_key,
                           scheduled_enqueue_time=scheduled_enqueue_time)
        check_pending_size([*self.outgoing, message])
        self._ordinals[destination] = ordinal + 1
        self.outgoing.append(message)
        return message

    def create(self, document_id: str, body: dict[str, Any]) -> None:
        self.operations.append(WriteOp("create", document_id, body))

    def replace(self, document_id: str, body: dict[str, Any], *, etag: str | None) -> None:
        self.operations.append(WriteOp("replace", document_id, body, etag))

    def upsert(self, document_id: str, body: dict[str, Any]) -> None:
        self.operations.append(WriteOp("upsert", document_id, body))

    def patch(self, document_id: str, operations: list[dict[str, Any]], *,
              etag: str | None = None) -> None:
        self.operations.append(WriteOp("patch", document_id, etag=etag, patch=tuple(operations)))

    def delete(self, document_id: str, *, etag: str | None = None) -> None:
        self.operations.append(WriteOp("delete", document_id, etag=etag))


class Reads:
    """What one group commit read, across attempts and chunks, so it reads each document once
    (again only after losing a race on it); with a `DocumentCache`, documents this process wrote
    last are taken instead of a read (the commit's etag checks them)."""

    def __init__(self, partition: str, cache: DocumentCache | None = None) -> None:
        self.partition = partition
        self.cache = cache
        self.documents: dict[str, Document | None] = {}
        self.cached: dict[str, Document] = {}  # taken from the cache: must be written back

    def known(self, document_id: str) -> tuple[bool, Document | None]:
        """(True, the document) when it needs no read; (False, None) otherwise."""
        if document_id in self.documents:
            return True, self.documents[document_id]
        found = self.cache.get(self.partition, document_id) if self.cache is not None else None
        if found is None:
            return False, None
        self.documents[document_id] = self.cached[document_id] = found
        return True, found

    def remember(self, document_id: str, document: Document | None) -> None:
        self.documents[document_id] = document

    def unchecked(self, operations: Sequence[WriteOp]) -> list[str]:
        """Cached documents the writes do not write back under the etag taken: read them."""
        checked = {op.id for op in operations
                   if op.kind in ("replace", "patch", "delete") and op.id in self.cached
                   and op.etag == self.cached[op.id].etag}
        unchecked = [document_id for document_id in self.cached if document_id not in checked]
        self.forget(unchecked)
        return unchecked

    def forget(self, document_ids: Sequence[str]) -> None:
        for document_id in document_ids:
            self.documents.pop(document_id, None)
            self.cached.pop(document_id, None)
            if self.cache is not None:
                self.cache.forget(self.partition, document_id)

    def lost_race(self) -> None:
        """A business write failed its condition: read everything again."""
        self.forget(list(self.cached))
        self.documents.clear()

    def committed(self, operations: Sequence[WriteOp], written: Sequence[Document]) -> None:
        """After a commit: remember what it wrote; the next chunk builds on that."""
        self.forget([op.id for op in operations])
        self.documents.clear()
        if self.cache is not None:
            for document in written:
                self.cache.put(document)


# -- the steps ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BuildResult:
    """The answer to `RunBuild`: what the user's build returned, and the writes it added."""

    value: Any
    writes: Writes


@dataclass(frozen=True, slots=True)
class RunBuild:
    """Run the user's `build(tx, *args)` on a fresh transaction of `partition` (reads answered
    from `reads` first; `key` and `correlation_id` go to `tx.send`). Answer: `BuildResult`."""

    build: Callable[..., Any]
    partition: str
    args: tuple[Any, ...] = ()
    reads: Reads | None = None
    key: DedupKey | None = None
    correlation_id: str | None = None


@dataclass(frozen=True, slots=True)
class HandlerResult:
    """The answer to `RunHandler`: the handler's result or error (never raised: the flow
    decides), and the last held record (renewals replace it)."""

    held: IdempotencyRecord
    result: Any = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class RunHandler:
    """Run the user's handler while its lease is renewed every `every` seconds until
    `until` (on `clock`), each renewal the flow `renew(held)`. Answer: `HandlerResult`."""

    handler: Callable[[], Any]
    held: IdempotencyRecord
    renew: Callable[[IdempotencyRecord], Flow[IdempotencyRecord]]
    every: float
    until: float
    clock: Callable[[], float]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send committed outgoing messages with `dispatcher` (async allowed under `run_async`).
    Answer: None; DispatchUnavailableError or DispatchRejectedError leave them pending."""

    dispatcher: Any
    messages: tuple[OutgoingMessage, ...]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait (a backoff, a Retry-After) on the driver's clock. Answer: None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Gather:
    """Run flows concurrently, at most `limit` at a time (threads in `run_sync`, tasks in
    `run_async`). Answer: their values in order; the first error (in order) is raised once
    every flow has finished."""

    flows: tuple[Flow[Any], ...]
    limit: int = 16


@dataclass(frozen=True, slots=True)
class OnStore:
    """Run `flow` with its store steps going to `store` (a flow that spans stores). Answer:
    the flow's value."""

    store: Any
    flow: Flow[Any]


Step = StoreStep | RunBuild | RunHandler | Sleep | Gather | OnStore | Dispatch
type Flow[T] = Generator[Step, Any, T]


# -- composing flows ---------------------------------------------------------------------
def retry_on_race[T](attempt: Callable[[], Flow[T]], *, attempts: int, what: str) -> Flow[T]:
    """Run an optimistic read-then-conditional-write attempt until it does not lose a race
    (RecordChangedError, RecordExistsError, or OperationFailedError with a race status);
    ConcurrencyRetriesExhaustedError after `attempts`. Any other error propagates."""
    for _ in range(attempts):
        try:
            return (yield from attempt())
        except (RecordChangedError, RecordExistsError):
            continue
        except OperationFailedError as error:
            if error.status_code not in RACE_STATUSES:
                raise
    raise ConcurrencyRetriesExhaustedError(f"{what}: lost {attempts} races in a row")


class Unread:
    """The caller has not read the document (None means: read, and there is none)."""


UNREAD = Unread()


def update_document(partition: str, document_id: str,
                    change: Callable[[Document | None], dict[str, Any] | None], *,
                    known: Document | Unread | None = UNREAD, attempts: int = 10
                    ) -> Flow[tuple[Document | None, Document | None]]:
    """Create or replace one document under its etag, as `change` decides from the current one
    (None: leave it). `known` is the document as already read (saves the first read); a lost
    race re-reads. Returns (the written document or None, the document `change` last saw)."""
    hint = known

    def attempt() -> Flow[tuple[Document | None, Document | None]]:
        nonlocal hint
        current = (yield ReadDocument(partition, document_id)) if isinstance(hint, Unread) else hint
        hint = UNREAD
        body = change(current)
        if body is None:
            return None, current
        op = (WriteOp("create", document_id, body) if current is None
              else WriteOp("replace", document_id, body, etag=current.etag))
        written: list[Document] = yield WriteDocuments(partition, (op,))
        return written[0], current

    return (yield from retry_on_race(attempt, attempts=attempts, what=f"update of {document_id}"))


__all__ = [
    "UNREAD", "BuildResult", "Dispatch", "Flow", "Gather", "HandlerResult", "OnStore", "Reads",
    "RunBuild", "RunHandler", "Sleep", "Step", "Unread", "Writes", "retry_on_race", "update_document",
]
