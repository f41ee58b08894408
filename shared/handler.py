"""The dedup flow: claim, process, complete; or commit marker and effect at once.

`Idempotency.run` is the two-phase flow for effects that cannot join a store
transaction (spec requirement 6). `Idempotency.run_atomic` writes the marker
and the business documents in one transaction (requirement 4). Both let the
store arbitrate concurrent copies with a conditional write (requirement 5).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, ParamSpec

from shared.cache import CompletedKeyCache, DocumentCache
from shared.config import IdempotencyConfig
from shared.exceptions import (
    ConcurrencyRetriesExhaustedError,
    EffectUncertainError,
    LeaseLostError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
    ResultTooLargeError,
    StoreUnavailableError,
)
from shared.keys import DedupKey, request_hash, same_request
from shared.records import IdempotencyRecord, Outcome, OutcomeStatus, RecordState, encode_result
from shared.stores.base import (
    MAX_TRANSACTION_OPERATIONS,
    RACE_STATUSES,
    Document,
    DocumentStore,
    RecordStore,
    WriteOp,
    drive,
    retry_on_race_flow,
)
from shared.telemetry import Telemetry

P = ParamSpec("P")
logger = logging.getLogger(__name__)
Context = Mapping[str, Any]


class TransactionWrites:
    """The business writes of one atomic commit, shared by the sync and async transactions."""

    def __init__(self, partition: str) -> None:
        self.partition = partition
        self.operations: list[WriteOp] = []

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
    """What one group commit read, across its attempts and chunks, so it reads each document
    once and again only after losing a race on it; and, with a `DocumentCache`, documents
    this process wrote last, taken instead of a read (the commit's etag checks them)."""

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


class Transaction(TransactionWrites):
    """The business writes of one atomic commit. Reads go to the store, or to `reads`."""

    def __init__(self, store: DocumentStore, partition: str, reads: Reads | None = None) -> None:
        super().__init__(partition)
        self._store = store
        self._reads = reads

    def read(self, document_id: str) -> Document | None:
        if self._reads is not None:
            hit, document = self._reads.known(document_id)
            if hit:
                return document
        document = self._store.read_document(self.partition, document_id)
        if self._reads is not None:
            self._reads.remember(document_id, document)
        return document


@dataclass(frozen=True)
class Call:
    """One step a flow asks its driver for: a store method, or the user's code.

    `kind` "store": `getattr(store, name)(*args, **kwargs)`; "build": `fn(*args)` (the
    driver awaits it when it returns an awaitable); "handler": run `fn` under
    a renewed lease on `args[0]` and answer with a HandlerRun, never raising.
    """

    kind: Literal["store", "build", "handler"]
    name: str = ""
    args: tuple[Any, ...] = ()
    fn: Callable[..., Any] | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HandlerRun:
    """What running the handler gave: its result or error, and the last held record."""

    held: IdempotencyRecord
    result: Any = None
    error: BaseException | None = None


Flow = Generator[Call, Any, Any]


def _store(name: str, *args: Any, **kwargs: Any) -> Call:
    return Call("store", name, args, kwargs=kwargs)


def _identify(key: Callable[..., DedupKey], payload: Callable[..., Any] | None,
              fields: tuple[str, ...] | None, args: tuple[Any, ...],
              kwargs: Mapping[str, Any]) -> tuple[DedupKey, str]:
    """The decorators' key and request hash for one call of the decorated handler."""
    data = payload(*args, **kwargs) if payload else (args[0] if args else kwargs)
    return key(*args, **kwargs), request_hash(data, fields=fields)


@dataclass(frozen=True)
class GroupMessage:
    """One message of a group commit: its key, request hash and log context."""

    key: DedupKey
    digest: str
    context: Context | None = None


class _FlowCore:
    """The dedup flow written once, as I/O-free generators over `Call`s.

    A flow yields what it needs (a store request, the user's build or handler)
    and receives the answer, or has the error thrown in. `Idempotency` drives
    the flows on a sync store, `AsyncIdempotency` awaits them on an async one,
    so claim/commit/judge exist in one copy.
    """

    store: Any

    def __init__(self, store: Any, *, config: IdempotencyConfig | None = None,
                 telemetry: Telemetry | None = None, cache: CompletedKeyCache | None = None,
                 documents: DocumentCache | None = None) -> None:
        self.store = store  # run_atomic also needs it to be a DocumentStore
        self.config = config or IdempotencyConfig()
        self.telemetry = telemetry or Telemetry()
        self.cache = cache  # completed keys only; consulted by run/run_atomic before the store
        self.documents = documents  # what group commits wrote last; see DocumentCache

    # -- helpers -------------------------------------------------------------------
    def _now(self) -> float:
        return self.config.clock()

    def _new_record(self, key: DedupKey, digest: str, state: RecordState, *,
                    partition: str | None = None, record_id: str | None = None,
                    expires: bool = True) -> IdempotencyRecord:
        now = self._now()
        # str(): a record holds plain text (the Table SDK maps values by exact type), not the
        # RequestHash with its payload.
        return IdempotencyRecord(
            key=key, state=state, request_hash=str(digest), created_at=now, updated_at=now,
            expires_at=now + self.config.ttl.total_seconds() if expires else None,
            lease_expires_at=(now + self.config.lease.total_seconds()
                              if state is RecordState.IN_PROGRESS else None),
            partition=partition, record_id=record_id,
        )

    def _judge(self, existing: IdempotencyRecord, digest: str, key: DedupKey) -> Outcome:
        """Outcome for a live record someone else wrote first."""
        if not same_request(existing.request_hash, digest):
            return Outcome(OutcomeStatus.CONFLICT, key, digest, existing.result, existing)
        if existing.state is RecordState.COMPLETED:
            return Outcome(OutcomeStatus.DUPLICATE, key, digest, existing.result, existing)
        return Outcome(OutcomeStatus.IN_PROGRESS, key, digest, None, existing)

    def _marker(self, key: DedupKey, digest: str, *, partition: str | None,
                record_id: str | None = None, expires: bool = True,
                over: IdempotencyRecord | None = None) -> IdempotencyRecord:
        """A completed marker to commit; `over` is an expired one it replaces under its etag."""
        marker = self._new_record(key, digest, RecordState.COMPLETED, partition=partition,
                                  record_id=record_id, expires=expires)
        if over is None:
            return marker
        return marker.evolve(etag=over.etag, attempts=over.attempts + 1)

    def _settle_flow(self, marker: IdempotencyRecord, digest: str) -> Flow:
        """After a marker write failed: the outcome the live record there decides, or the
        expired record to take over. RecordChangedError when it vanished meanwhile."""
        existing = yield _store("get_record", marker.partition_key, marker.id)
        if existing is None:
            raise RecordChangedError(marker.id)  # deleted meanwhile: commit again
        if existing.is_expired(self._now()):
            return existing
        return self._judge(existing, digest, marker.key)  # the caller's hash: it can judge old forms

    def _cached(self, key: DedupKey, digest: str) -> Outcome | None:
        """A duplicate (or conflict) answered by the local cache, without a store request."""
        record = self.cache.get(key, now=self._now()) if self.cache is not None else None
        return None if record is None else self._judge(record, digest, key)

    def _finish(self, outcome: Outcome, started: float, context: Context | None, *,
                handler_seconds: float = 0.0, source: str = "store") -> Outcome:
        if self.cache is not None and outcome.record is not None and source == "store":
            self.cache.put(outcome.record)  # refuses anything not completed
        elapsed = time.perf_counter() - started
        self.telemetry.outcome(outcome, latency=elapsed - handler_seconds, backend=self.store.name,
                               source=source, handler_latency=handler_seconds, context=context)
        return outcome

    def _transaction(self, partition: str, reads: Reads | None = None) -> TransactionWrites:
        """The transaction `build` fills; the driver's kind decides how it reads."""
        raise NotImplementedError

    # -- two-phase -------------------------------------------------------------------
    def _claim_flow(self, key: DedupKey, digest: str, *, takeover_stale: bool,
                    partition: str | None) -> Flow:
        fresh = self._new_record(key, digest, RecordState.IN_PROGRESS, partition=partition)

        def attempt() -> Flow:
            try:
                held = yield _store("put_record_if_absent", fresh)
                return Outcome(OutcomeStatus.PROCESSED, key, digest, None, held), held
            except RecordExistsError:
                pass
            existing = yield _store("get_record", fresh.partition_key, fresh.id)
            if existing is None:
                raise RecordChangedError(fresh.id)  # released between create and read: again
            now = self._now()
            expired = existing.is_expired(now)
            if not expired and not same_request(existing.request_hash, digest):
                return Outcome(OutcomeStatus.CONFLICT, key, digest, existing.result, existing), None
            stale = not expired and existing.is_lease_expired(now)
            if not (expired or stale):
                return self._judge(existing, digest, key), None
            if stale and not takeover_stale:
                return Outcome(OutcomeStatus.STALE, key, digest, None, existing), None
            taken = fresh.evolve(
                etag=existing.etag, updated_at=now,
                created_at=existing.created_at if stale else now,
                attempts=existing.attempts + 1 if stale else 1,
                lease_expires_at=now + self.config.lease.total_seconds(),
                expires_at=now + self.config.ttl.total_seconds())
            held = yield _store("replace_record_if_unchanged", taken)  # lost race: look again
            status = OutcomeStatus.TAKEN_OVER if stale else OutcomeStatus.PROCESSED
            return Outcome(status, key, digest, None, held), held

        return (yield from retry_on_race_flow(attempt, attempts=self.config.max_commit_attempts,
                                              what=f"claim of {key.encoded}"))

    def _complete_flow(self, held: IdempotencyRecord, result: Any) -> Flow:
        too_large: ResultTooLargeError | None = None
        try:
            encode_result(result, self.config.max_result_bytes)
        except ResultTooLargeError as error:
            too_large, result = error, None
        done = held.evolve(state=RecordState.COMPLETED, result=result, lease_expires_at=None,
                           updated_at=self._now())
        try:
            done = yield _store("replace_record_if_unchanged", done)
        except RecordChangedError as error:
            current = yield _store("get_record", held.partition_key, held.id)
            raise LeaseLostError(f"lease on {held.key.encoded} lost before completion",
                                 record=current) from error
        if too_large is not None:
            raise too_large  # the effect is recorded as done; only its result is missing
        return done

    def _renew_flow(self, held: IdempotencyRecord) -> Flow:
        now = self._now()
        return (yield _store("replace_record_if_unchanged", held.evolve(
            lease_expires_at=now + self.config.lease.total_seconds(), updated_at=now)))

    def _release_flow(self, held: IdempotencyRecord) -> Flow:
        try:
            yield _store("delete_record_if_unchanged", held)
        except (RecordChangedError, StoreUnavailableError) as error:
            # The lease will run out on its own; a redelivery then takes over.
            logger.warning("could not release claim: %s", error,
                           extra={"dedup_key": held.key.key, "consumer": held.key.consumer})

    def _run_flow(self, key: DedupKey, digest: str, handler: Callable[[], Any], *,
                  takeover_stale: bool, partition: str | None, context: Context | None) -> Flow:
        started = time.perf_counter()
        cached = self._cached(key, digest)
        if cached is not None:
            return self._finish(cached, started, context, source="cache")
        outcome, held = yield from self._claim_flow(key, digest, takeover_stale=takeover_stale,
                                                    partition=partition)
        if held is None:
            return self._finish(outcome, started, context)
        handler_started = time.perf_counter()
        ran: HandlerRun = yield Call("handler", args=(held,), fn=handler)
        if isinstance(ran.error, EffectUncertainError):
            ran.error.record = ran.held  # kept in progress: reconciled, never retried blindly
            raise ran.error
        if ran.error is not None:
            yield from self._release_flow(ran.held)
            raise ran.error
        handler_seconds = time.perf_counter() - handler_started
        try:
            done = yield from self._complete_flow(ran.held, ran.result)
        except LeaseLostError as error:
            stored = error.record if isinstance(error.record, IdempotencyRecord) else None
            lost = Outcome(OutcomeStatus.LEASE_LOST, key, digest,
                           stored.result if stored is not None else None, stored)
            return self._finish(lost, started, context, handler_seconds=handler_seconds)
        return self._finish(Outcome(outcome.status, key, digest, ran.result, done), started,
                            context, handler_seconds=handler_seconds)

    # -- atomic ------------------------------------------------------------------------
    def _run_atomic_flow(self, key: DedupKey, digest: str, build: Callable[..., Any], *,
                         partition: str | None, marker_id: str | None,
                         marker_body: dict[str, Any] | None, expires: bool,
                         context: Context | None) -> Flow:
        started = time.perf_counter()
        cached = self._cached(key, digest)
        if cached is not None:
            return self._finish(cached, started, context, source="cache")
        expired: list[IdempotencyRecord] = []  # an expired marker the next attempt replaces

        def attempt() -> Flow:
            marker = self._marker(key, digest, partition=partition, record_id=marker_id,
                                  expires=expires, over=expired.pop() if expired else None)
            tx = self._transaction(marker.partition_key)
            result = yield Call("build", args=(tx,), fn=build)
            encode_result(result, self.config.max_result_bytes)
            try:
                committed = yield _store("commit", marker.evolve(result=result), tx.operations,
                                         marker_body=marker_body)
                return Outcome(OutcomeStatus.PROCESSED, key, digest, result, committed)
            except (RecordExistsError, RecordChangedError):
                pass
            found = yield from self._settle_flow(marker, digest)
            if isinstance(found, Outcome):
                return found
            expired.append(found)
            raise RecordChangedError(marker.id)  # take the expired marker over

        outcome = yield from retry_on_race_flow(attempt, attempts=self.config.max_commit_attempts,
                                                what=f"commit of {key.encoded}")
        return self._finish(outcome, started, context)


    def _run_atomic_group_flow(self, messages: Sequence[GroupMessage],
                               build: Callable[..., Any], *, partition: str) -> Flow:
        started = time.perf_counter()
        decided: dict[int, tuple[Outcome, str]] = {}  # message index -> (outcome, source)
        first_copy: dict[str, int] = {}
        todo: list[int] = []
        for index, message in enumerate(messages):
            cached = self._cached(message.key, message.digest)
            if cached is not None:
                decided[index] = (cached, "cache")
            elif message.key.encoded not in first_copy:
                first_copy[message.key.encoded] = index
                todo.append(index)
        reads = Reads(partition, self.documents)
        expired: dict[int, IdempotencyRecord] = {}  # expired markers the next commit replaces
        races: Counter[int] = Counter()  # lost races by message index (-1: a business write)

        def lost_race(index: int) -> None:
            races[index] += 1
            if races[index] >= self.config.max_commit_attempts:
                raise ConcurrencyRetriesExhaustedError(
                    f"group commit in {partition}: lost {races[index]} races in a row")

        while todo:
            chunk, results, tx = yield from self._build_chunk_flow(partition, todo, build, reads)
            markers = [self._marker(messages[i].key, messages[i].digest, partition=partition,
                                    over=expired.get(i)).evolve(result=result)
                       for i, result in zip(chunk, results, strict=True)]
            written: list[Document] = []
            try:
                committed = yield _store("commit_group", markers, tx.operations, written=written)
            except (RecordExistsError, RecordChangedError) as error:
                index = chunk[error.index]
                expired.pop(index, None)
                try:
                    found = yield from self._settle_flow(markers[error.index], messages[index].digest)
                except RecordChangedError:  # deleted meanwhile: commit it again
                    lost_race(index)
                    continue
                if isinstance(found, Outcome):
                    decided[index] = (found, "store")
                    todo.remove(index)
                else:
                    expired[index] = found
                    lost_race(index)
                continue
            except OperationFailedError as error:
                if error.status_code not in RACE_STATUSES:
                    raise
                reads.lost_race()  # a business document changed since it was read
                lost_race(-1)
                continue
            for index, marker, result in zip(chunk, committed, results, strict=True):
                decided[index] = (Outcome(OutcomeStatus.PROCESSED, marker.key, marker.request_hash,
                                          result, marker), "store")
            todo = todo[len(chunk):]
            reads.committed(tx.operations, written)  # the next chunk builds on what this wrote
        outcomes = []
        for index, message in enumerate(messages):
            if index not in decided:  # a second copy within the group
                first = decided[first_copy[message.key.encoded]][0]
                judged = (self._judge(first.record, message.digest, message.key)
                          if first.record is not None else first)
                decided[index] = (judged, "group")
            outcome, source = decided[index]
            outcomes.append(self._finish(outcome, started, message.context, source=source))
        return outcomes

    def _build_chunk_flow(self, partition: str, todo: Sequence[int], build: Callable[..., Any],
                          reads: Reads) -> Flow:
        """The next messages that fit in one transaction with their writes, built."""
        chunk = list(todo[:MAX_TRANSACTION_OPERATIONS - 1])
        while True:
            tx = self._transaction(partition, reads)
            results = list((yield Call("build", args=(tx, chunk), fn=build)))
            if reads.unchecked(tx.operations):
                continue  # a cached document the commit would not check: build on a read
            room = MAX_TRANSACTION_OPERATIONS - len(tx.operations)
            if len(chunk) <= room:
                break
            if room < 1:
                raise ValueError(f"{len(tx.operations)} writes leave no room for a marker")
            chunk = chunk[:room]
        if len(results) != len(chunk):
            raise ValueError(f"build returned {len(results)} results for {len(chunk)} messages")
        for result in results:
            encode_result(result, self.config.max_result_bytes)
        return chunk, results, tx

class Idempotency(_FlowCore):
    """Runs messages through the dedup flow against one (sync) store."""

    store: RecordStore

    def __init__(self, store: RecordStore, *, config: IdempotencyConfig | None = None,
                 telemetry: Telemetry | None = None, cache: CompletedKeyCache | None = None,
                 documents: DocumentCache | None = None) -> None:
        super().__init__(store, config=config, telemetry=telemetry, cache=cache,
                         documents=documents)

    def _document_store(self) -> DocumentStore:
        if not isinstance(self.store, DocumentStore):
            raise TypeError(f"the atomic path needs a DocumentStore; {type(self.store).__name__} "
                            "is not one")
        return self.store

    def _transaction(self, partition: str, reads: Reads | None = None) -> Transaction:
        return Transaction(self._document_store(), partition, reads)

    def _perform(self, call: Call) -> Any:
        if call.kind == "store":
            return getattr(self.store, call.name)(*call.args, **call.kwargs)
        assert call.fn is not None
        if call.kind == "build":
            return call.fn(*call.args)
        with _LeaseRenewal(self, call.args[0]) as lease:
            try:
                result = call.fn()
            except BaseException as error:  # the flow decides: release or keep
                lease.stop()
                return HandlerRun(lease.held, error=error)
            lease.stop()
        return HandlerRun(lease.held, result)

    def _drive(self, flow: Flow) -> Any:
        """Run a flow against the sync store: each Call performed, errors thrown back in."""
        return drive(flow, self._perform)

    # -- two-phase -------------------------------------------------------------------
    def claim(self, key: DedupKey, digest: str, *, takeover_stale: bool = True,
              partition: str | None = None) -> tuple[Outcome, IdempotencyRecord | None]:
        """Phase one: hold the key in progress, or say why not.

        Returns (PROCESSED or TAKEN_OVER, the held record) when this caller now
        owns the key, else (outcome, None). The store arbitrates: a create that
        fails on conflict, then a takeover under the etag of what it found.
        """
        return self._drive(self._claim_flow(key, digest, takeover_stale=takeover_stale,
                                            partition=partition))

    def complete(self, held: IdempotencyRecord, result: Any) -> IdempotencyRecord:
        """Phase two: mark the held record completed with the handler's result.

        LeaseLostError when the lease ran out and another consumer took the key
        over meanwhile: the store keeps the other consumer's record.
        """
        return self._drive(self._complete_flow(held, result))

    def renew(self, held: IdempotencyRecord) -> IdempotencyRecord:
        """Extend a held lease (etag-conditional); RecordChangedError when it was lost."""
        return self._drive(self._renew_flow(held))

    def release(self, held: IdempotencyRecord) -> None:
        """Give the key back after a failed handler so a redelivery can retry."""
        self._drive(self._release_flow(held))

    def run(self, key: DedupKey, digest: str, handler: Callable[[], Any], *,
            takeover_stale: bool = True, partition: str | None = None,
            context: Context | None = None) -> Outcome:
        """Claim, run `handler` once, record its result; duplicates get the first result.

        `context` (message id, correlation id, delivery count...) goes to logs and metrics.
        """
        return self._drive(self._run_flow(key, digest, handler, takeover_stale=takeover_stale,
                                          partition=partition, context=context))

    # -- atomic ------------------------------------------------------------------------
    def run_atomic(self, key: DedupKey, digest: str, build: Callable[[Transaction], Any], *,
                   partition: str | None = None, marker_id: str | None = None,
                   marker_body: dict[str, Any] | None = None, expires: bool = True,
                   context: Context | None = None) -> Outcome:
        """Commit the marker and the writes `build` adds in one transaction.

        `build` may read current state through the transaction; it is called
        again when a concurrent writer changed what it read (etag mismatch).
        With `marker_id`/`marker_body` the marker is the business document
        itself (an order whose id is the order id); `expires=False` keeps it.
        """
        self._document_store()
        return self._drive(self._run_atomic_flow(
            key, digest, build, partition=partition, marker_id=marker_id,
            marker_body=marker_body, expires=expires, context=context))

    def run_atomic_group(self, messages: Sequence[GroupMessage],
                         build: Callable[[Transaction, Sequence[int]], Sequence[Any]], *,
                         partition: str) -> list[Outcome]:
        """Commit many messages of one partition: their markers and the writes `build` adds.

        One transaction holds the markers (in message order) and then the
        writes `build(tx, indexes)` adds for the messages at `indexes`; it
        returns one result per index, kept on that message's marker. A group
        larger than a transaction is split in order. A marker that fails names
        its message (the error's `index`): it is judged as in `run_atomic`
        (duplicate, conflict, or an expired record taken over) and the others
        are committed again, without reading what `tx` already read. A key
        twice in the group is judged against its first copy's record.
        Returns one outcome per message, in order.
        """
        self._document_store()
        return self._drive(self._run_atomic_group_flow(messages, build, partition=partition))

    # -- decorator ------------------------------------------------------------------
    def idempotent(self, *, key: Callable[..., DedupKey], payload: Callable[..., Any] | None = None,
                   fields: tuple[str, ...] | None = None
                   ) -> Callable[[Callable[P, Any]], Callable[P, Outcome]]:
        """Decorate a handler so each call runs once per key (two-phase flow).

        `key` and `payload` receive the handler's arguments; the payload
        (default: the first argument) is hashed to detect reused keys.
        """
        def decorate(function: Callable[P, Any]) -> Callable[P, Outcome]:
            @functools.wraps(function)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> Outcome:
                dedup_key, digest = _identify(key, payload, fields, args, kwargs)
                return self.run(dedup_key, digest, lambda: function(*args, **kwargs))
            return wrapper
        return decorate


class _LeaseRenewal:
    """Keeps a held lease alive while the handler runs, the way the host renews the lock.

    A background thread renews every lease/3 (real seconds) for at most
    `max_lease_renewal`; a lost renewal (someone took the key over) stops it,
    and completion then reports LEASE_LOST. Store outages are retried next tick.
    """

    def __init__(self, flow: Idempotency, held: IdempotencyRecord) -> None:
        self._flow = flow
        self._lock = threading.Lock()
        self._held = held
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> IdempotencyRecord:
        with self._lock:
            return self._held

    def __enter__(self) -> _LeaseRenewal:
        self._thread = threading.Thread(target=self._renew, name="lease-renewal", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _renew(self) -> None:
        config = self._flow.config
        every = config.lease.total_seconds() / 3
        deadline = config.clock() + config.max_lease_renewal.total_seconds()
        while not self._done.wait(every) and config.clock() < deadline:
            with self._lock:
                if self._done.is_set():
                    return
                try:
                    self._held = self._flow.renew(self._held)
                except RecordChangedError:
                    logger.warning("lease lost while the handler ran",
                                   extra={"dedup_key": self._held.key.key,
                                          "consumer": self._held.key.consumer})
                    return
                except StoreUnavailableError as error:
                    logger.warning("could not renew lease: %s", error)
