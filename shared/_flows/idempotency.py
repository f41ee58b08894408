"""The dedup flow: claim, process, complete; or commit marker and effect at once.

`run` is the two-phase flow for effects that cannot join a store transaction: claim the key,
run the handler once under a renewed lease, record its result. `run_atomic` writes the marker
and the business documents in one transaction; `run_atomic_group` commits many messages of one
partition at once. The store arbitrates concurrent copies with conditional writes.

Outbox: messages a build sends (`tx.send`) are written on the marker in the same transaction,
dispatched after the commit and cleared under the marker's etag before the flow returns, so the
incoming message is acknowledged only after they are out. A copy that finds messages still on
the marker dispatches them first; a dispatch failure raises, leaving them for the next copy or
the sweeper.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared._core.exceptions import (
    ConcurrencyRetriesExhaustedError,
    EffectUncertainError,
    LeaseLostError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
    ResultTooLargeError,
    StoreUnavailableError,
)
from shared._core.keys import DedupKey
from shared._core.keys import request_hash as hash_request
from shared._core.outbox import AsyncDispatcher, EventPosition
from shared._core.outbox import Dispatcher as SyncDispatcher
from shared._core.records import (
    IdempotencyRecord,
    KeyInProgressError,
    KeyReusedError,
    Outcome,
    OutcomeStatus,
    RecordState,
    encode_result,
)
from shared._core.store import (
    MAX_TRANSACTION_OPERATIONS,
    RACE_STATUSES,
    Commit,
    CommitGroup,
    Committed,
    DeleteRecordIfUnchanged,
    GetRecord,
    PutRecordIfAbsent,
    ReplaceRecordIfUnchanged,
)
from shared._flows.dedup_steps import Context, DedupSteps
from shared._flows.drivers import (
    Async,
    AsyncStore,
    AsyncTransaction,
    BaseTransaction,
    Sync,
    SyncStore,
    Transaction,
    flowmethod,
)
from shared._flows.steps import (
    BuildResult,
    Flow,
    HandlerResult,
    Reads,
    RunBuild,
    RunHandler,
    Writes,
    retry_on_race,
)

logger = logging.getLogger(__name__)

#: A held lease is renewed every 1/LEASE_RENEWALS of its length while the handler runs.
LEASE_RENEWALS = 3


@dataclass(frozen=True)
class GroupMessage:
    """One message of a group commit: its key, request hash and log context.

    `position` (its Event Hubs event) means the caller's partition mark records the dispatch:
    the messages sent are committed with it and left for the caller, as are a duplicate's.
    """

    key: DedupKey
    request_hash: str
    context: Context | None = None
    position: EventPosition | None = None


def identify(key: Callable[..., DedupKey], payload: Callable[..., Any] | None,
             fields: tuple[str, ...] | None, args: tuple[Any, ...],
             kwargs: Mapping[str, Any]) -> tuple[DedupKey, str]:
    """The decorators' key and request hash for one call of the decorated handler."""
    data = payload(*args, **kwargs) if payload else (args[0] if args else kwargs)
    return key(*args, **kwargs), hash_request(data, fields=fields)


class BaseIdempotency[S: (SyncStore, AsyncStore), D, X: BaseTransaction](DedupSteps[S, D]):
    """The dedup flow over a store `S`, with a dispatcher `D`, handing builds a transaction `X`;
    `Idempotency` and `shared.aio.Idempotency` are its variants."""

    # -- two-phase -------------------------------------------------------------------
    @flowmethod
    def claim(self, key: DedupKey, request_hash: str, *, takeover_stale: bool = True,
              partition: str | None = None) -> Flow[tuple[Outcome, IdempotencyRecord | None]]:
        """Phase one: hold the key in progress (a create, else a takeover of an expired or
        stale record under its etag). Returns (PROCESSED or TAKEN_OVER, the held record) when
        this caller now owns the key, else (outcome, None)."""
        fresh = self._new_record(key, request_hash, RecordState.IN_PROGRESS, partition=partition)

        def attempt() -> Flow[tuple[Outcome, IdempotencyRecord | None]]:
            try:
                held: IdempotencyRecord = yield PutRecordIfAbsent(fresh)
                self._clock_seen(held)
                return Outcome(OutcomeStatus.PROCESSED, key, request_hash, None, held), held
            except RecordExistsError:
                pass
            existing: IdempotencyRecord | None = yield GetRecord(fresh.partition_key, fresh.id)
            if existing is None:
                raise RecordChangedError(fresh.id)  # released between create and read: again
            now = self._now()
            expired = existing.is_expired(now)
            if not expired and existing.request_hash != request_hash:
                return Outcome(OutcomeStatus.CONFLICT, key, request_hash, existing.result,
                               existing), None
            stale = not expired and existing.is_lease_expired(now)
            if not (expired or stale):
                return self._outcome_of_found(existing, request_hash, key), None
            if stale and not takeover_stale:
                return Outcome(OutcomeStatus.STALE, key, request_hash, None, existing), None
            taken = fresh.evolve(
                etag=existing.etag, updated_at=now,
                created_at=existing.created_at if stale else now,
                attempts=existing.attempts + 1 if stale else 1,
                lease_expires_at=now + self.config.lease.total_seconds(),
                expires_at=now + self.config.ttl.total_seconds())
            held = yield ReplaceRecordIfUnchanged(taken)  # a lost race: look again
            self._clock_seen(held)
            status = OutcomeStatus.TAKEN_OVER if stale else OutcomeStatus.PROCESSED
            return Outcome(status, key, request_hash, None, held), held

        return (yield from retry_on_race(attempt, attempts=self.config.max_commit_attempts,
                                         what=f"claim of {key.encoded}"))

    @flowmethod
    def complete(self, held: IdempotencyRecord, result: Any) -> Flow[IdempotencyRecord]:
        """Phase two: mark the held record completed with the handler's result. LeaseLostError
        when another consumer took the key over meanwhile (its record is kept)."""
        too_large: ResultTooLargeError | None = None
        try:
            encode_result(result, self.config.max_result_bytes)
        except ResultTooLargeError as error:
            too_large, result = error, None
        done = held.evolve(state=RecordState.COMPLETED, result=result, lease_expires_at=None,
                           updated_at=self._now())
        try:
            done = yield ReplaceRecordIfUnchanged(done)
            self._clock_seen(done)
        except RecordChangedError as error:
            current = yield GetRecord(held.partition_key, held.id)
            raise LeaseLostError(f"lease on {held.key.encoded} lost before completion",
                                 record=current) from error
        if too_large is not None:
            raise too_large  # the effect is recorded as done; only its result is missing
        return done

    @flowmethod
    def renew(self, held: IdempotencyRecord) -> Flow[IdempotencyRecord]:
        """Extend a held lease (etag-conditional); RecordChangedError when it was lost."""
        now = self._now()
        renewed: IdempotencyRecord = yield ReplaceRecordIfUnchanged(held.evolve(
            lease_expires_at=now + self.config.lease.total_seconds(), updated_at=now))
        self._clock_seen(renewed)
        return renewed

    @flowmethod
    def release(self, held: IdempotencyRecord) -> Flow[None]:
        """Give the key back after a failed handler so a redelivery can retry."""
        try:
            yield DeleteRecordIfUnchanged(held)
        except (RecordChangedError, StoreUnavailableError) as error:
            # The lease will run out on its own; a redelivery then takes over.
            logger.warning("could not release claim: %s", error,
                           extra={"dedup_key": held.key.key, "consumer": held.key.consumer})

    @flowmethod
    def run(self, key: DedupKey, request_hash: str, handler: Callable[[], Any], *,
            takeover_stale: bool = True, partition: str | None = None,
            context: Context | None = None) -> Flow[Outcome]:
        """Claim, run `handler` once, record its result; duplicates get the first result.
        `context` goes to logs and metrics. The handler may be async on the async variant."""
        started = time.perf_counter()
        cached = self._cached(key, request_hash)
        if cached is not None:
            return self._finish(cached, started, context, source="cache")
        outcome, held = yield from self.claim.flow(key, request_hash,
                                                   takeover_stale=takeover_stale,
                                                   partition=partition)
        if held is None:
            return self._finish(outcome, started, context)
        handler_started = time.perf_counter()
        config = self.config
        ran: HandlerResult = yield RunHandler(
            handler, held, lambda record: self.renew.flow(record),
            every=config.lease.total_seconds() / LEASE_RENEWALS,
            until=config.clock() + config.max_lease_renewal.total_seconds(), clock=config.clock)
        if isinstance(ran.error, EffectUncertainError):
            ran.error.record = ran.held  # kept in progress: reconciled, never retried blindly
            raise ran.error
        if ran.error is not None:
            yield from self.release.flow(ran.held)
            raise ran.error
        handler_seconds = time.perf_counter() - handler_started
        try:
            done = yield from self.complete.flow(ran.held, ran.result)
        except LeaseLostError as error:
            stored = error.record if isinstance(error.record, IdempotencyRecord) else None
            lost = Outcome(OutcomeStatus.LEASE_LOST, key, request_hash,
                           stored.result if stored is not None else None, stored)
            return self._finish(lost, started, context, handler_seconds=handler_seconds)
        return self._finish(Outcome(outcome.status, key, request_hash, ran.result, done), started,
                            context, handler_seconds=handler_seconds)

    # -- atomic ------------------------------------------------------------------------
    @flowmethod
    def run_atomic(self, key: DedupKey, request_hash: str, build: Callable[[X], Any], *,
                   partition: str | None = None, marker_id: str | None = None,
                   marker_body: dict[str, Any] | None = None, expires: bool = True,
                   context: Context | None = None, read_first: bool = False) -> Flow[Outcome]:
        """Commit the marker and the writes `build(tx)` adds in one transaction.

        `build` may read through `tx`; it runs again when a concurrent writer changed what it
        read. With `marker_id` / `marker_body` the marker is the business document itself;
        `expires=False` keeps it. Messages sent with `tx.send` are dispatched and recorded
        before this returns. `read_first` reads the marker before building (for a likely
        duplicate: one request instead of a failed commit and a read).
        """
        started = time.perf_counter()
        cached = self._cached(key, request_hash)
        if cached is not None:
            return self._finish(cached, started, context, source="cache")
        expired: list[IdempotencyRecord] = []  # an expired marker the next attempt replaces
        correlation_id = context.get("correlation_id") if context else None
        if read_first:
            probe = self._marker(key, request_hash, partition=partition, record_id=marker_id)
            existing: IdempotencyRecord | None = yield GetRecord(probe.partition_key, probe.id)
            if existing is not None and existing.is_expired(self._now()):
                expired.append(existing)
            elif existing is not None:
                found = self._outcome_of_found(existing, request_hash, key)
                outcome = yield from self._with_outbox_sent(found)
                return self._finish(outcome, started, context)

        def attempt() -> Flow[Outcome]:
            marker = self._marker(key, request_hash, partition=partition, record_id=marker_id,
                                  expires=expires, over=expired.pop() if expired else None)
            built: BuildResult = yield RunBuild(build, marker.partition_key, key=key,
                                       correlation_id=correlation_id)
            encode_result(built.value, self.config.max_result_bytes)
            self._can_send(built.writes)
            try:
                committed: Committed = yield Commit(
                    marker.evolve(result=built.value, outbox=tuple(built.writes.outgoing)),
                    built.writes.operations, marker_body)
                self._clock_seen(committed.markers[0])
                return Outcome(OutcomeStatus.PROCESSED, key, request_hash, built.value,
                               committed.markers[0])
            except (RecordExistsError, RecordChangedError):
                pass
            found = yield from self._after_failed_marker(marker, request_hash)
            if isinstance(found, Outcome):
                return found
            expired.append(found)
            raise RecordChangedError(marker.id)  # take the expired marker over

        outcome = yield from retry_on_race(attempt, attempts=self.config.max_commit_attempts,
                                           what=f"commit of {key.encoded}")
        outcome = yield from self._with_outbox_sent(outcome)
        return self._finish(outcome, started, context)

    @flowmethod
    def run_atomic_group(self, messages: Sequence[GroupMessage], build: Callable[[X, list[int]], Any], *,
                         partition: str) -> Flow[list[Outcome]]:
        """Commit many messages of one partition: their markers, in order, and the writes
        `build(tx, indexes)` adds, returning one result per index (kept on its marker).

        A group larger than a transaction is split in order. A failed marker (the error's
        `index`) is judged as in `run_atomic` and the others are committed again without
        re-reading; a key twice in the group is judged against its first copy's record.
        Messages sent go on the first marker of their transaction and are dispatched after it
        commits, unless that message has a `position` (see `GroupMessage`). Returns one
        outcome per message, in order.
        """
        started = time.perf_counter()
        decided: dict[int, tuple[Outcome, str]] = {}  # message index -> (outcome, source)
        first_copy: dict[str, int] = {}
        todo: list[int] = []
        for index, message in enumerate(messages):
            cached = self._cached(message.key, message.request_hash)
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
            chunk, results, writes = yield from self._build_chunk(partition, todo, build, reads,
                                                                  messages)
            markers = tuple(self._marker(messages[i].key, messages[i].request_hash,
                                         partition=partition, over=expired.get(i), result=result)
                            for i, result in zip(chunk, results, strict=True))
            position = messages[chunk[0]].position
            markers = (markers[0].evolve(outbox=tuple(writes.outgoing),
                                         outbox_position=position if writes.outgoing else None),
                       *markers[1:])
            try:
                committed: Committed = yield CommitGroup(markers, writes.operations)
            except (RecordExistsError, RecordChangedError) as error:
                index = chunk[error.index]
                expired.pop(index, None)
                try:
                    found = yield from self._after_failed_marker(markers[error.index],
                                                                 messages[index].request_hash)
                except RecordChangedError:  # deleted meanwhile: commit it again
                    lost_race(index)
                    continue
                if isinstance(found, Outcome):
                    deferred = (messages[index].position is not None and found.record is not None
                                and found.record.outbox_position is not None)
                    decided[index] = (found if deferred else (yield from self._with_outbox_sent(found)),
                                      "store")
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
            first = committed.markers[0]
            self._clock_seen(first)
            if position is None:
                first = yield from self.dispatch_pending.flow(first)
            for index, marker, result in zip(chunk, (first, *committed.markers[1:]), results,
                                             strict=True):
                decided[index] = (Outcome(OutcomeStatus.PROCESSED, marker.key, marker.request_hash,
                                          result, marker), "store")
            todo = todo[len(chunk):]
            reads.committed(writes.operations, committed.written)  # the next chunk builds on it
        outcomes: list[Outcome] = []
        for index, message in enumerate(messages):
            if index not in decided:  # a second copy within the group
                first = decided[first_copy[message.key.encoded]][0]
                judged = (self._outcome_of_found(first.record, message.request_hash, message.key)
                          if first.record is not None else first)
                decided[index] = (judged, "group")
            outcome, source = decided[index]
            outcomes.append(self._finish(outcome, started, message.context, source=source))
        return outcomes

    def _build_chunk(self, partition: str, todo: Sequence[int], build: Callable[[X, list[int]], Any],
                     reads: Reads, messages: Sequence[GroupMessage]
                     ) -> Flow[tuple[list[int], list[Any], Writes]]:
        """The next messages that fit in one transaction with their writes, built."""
        chunk = list(todo[:MAX_TRANSACTION_OPERATIONS - 1])
        while True:
            first = messages[chunk[0]]
            built: BuildResult = yield RunBuild(build, partition, (chunk,), reads, key=first.key,
                                       correlation_id=(first.context or {}).get("correlation_id"))
            results = list(built.value)
            operations = built.writes.operations
            if reads.unchecked(operations):
                continue  # a cached document the commit would not check: build on a read
            room = MAX_TRANSACTION_OPERATIONS - len(operations)
            if len(chunk) <= room:
                break
            if room < 1:
                raise ValueError(f"{len(operations)} writes leave no room for a marker")
            chunk = chunk[:room]
        if len(results) != len(chunk):
            raise ValueError(f"build returned {len(results)} results for {len(chunk)} messages")
        for result in results:
            encode_result(result, self.config.max_result_bytes)
        self._can_send(built.writes)
        return chunk, results, built.writes


def _result(outcome: Outcome) -> Any:
    """A decorated handler's result (now, or stored for a duplicate); KeyReusedError or
    KeyInProgressError otherwise."""
    if outcome.status is OutcomeStatus.CONFLICT:
        raise KeyReusedError(
            f"{outcome.key.encoded} was processed with other content (request hash "
            f"{outcome.stored_hash}; this call has {outcome.request_hash}): the first effect "
            "stands, this call did nothing. Use a new key for new content.", outcome=outcome)
    if not outcome.should_ack:
        raise KeyInProgressError(f"{outcome.key.encoded} is {outcome.status.value} by another "
                                 "attempt: retry after its lease", outcome=outcome)
    return outcome.result


class Idempotency(BaseIdempotency[SyncStore, SyncDispatcher, Transaction], Sync):
    """Runs messages through the dedup flow against one (sync) store."""

    def idempotent[**A, R](self, *, key: Callable[..., DedupKey],
                           payload: Callable[..., Any] | None = None,
                           fields: tuple[str, ...] | None = None
                           ) -> Callable[[Callable[A, R]], Callable[A, R]]:
        """Decorate a handler so each call runs once per key (the two-phase flow).

        A duplicate returns the first call's stored result; a key reused with other content
        raises KeyReusedError, a key another attempt holds KeyInProgressError. `key` and
        `payload` receive the handler's arguments; the payload (default: the first argument)
        is hashed to tell a duplicate from a reused key.
        """
        def decorate(function: Callable[A, R]) -> Callable[A, R]:
            @functools.wraps(function)
            def wrapper(*args: A.args, **kwargs: A.kwargs) -> R:
                dedup_key, request_hash = identify(key, payload, fields, args, kwargs)
                return _result(self.run(dedup_key, request_hash, lambda: function(*args, **kwargs)))
            return wrapper
        return decorate


class AsyncIdempotency(BaseIdempotency[AsyncStore, AsyncDispatcher | SyncDispatcher, AsyncTransaction],
                       Async):
    """The dedup flow on an async store (`shared.aio.Idempotency`); builds and handlers may be
    sync or async, the dispatcher async or a sync one that never blocks."""

    def idempotent[**A, R](self, *, key: Callable[..., DedupKey],
                           payload: Callable[..., Any] | None = None,
                           fields: tuple[str, ...] | None = None
                           ) -> Callable[[Callable[A, Awaitable[R]]], Callable[A, Awaitable[R]]]:
        """`Idempotency.idempotent` for an async handler."""
        def decorate(function: Callable[A, Awaitable[R]]) -> Callable[A, Awaitable[R]]:
            @functools.wraps(function)
            async def wrapper(*args: A.args, **kwargs: A.kwargs) -> R:
                dedup_key, request_hash = identify(key, payload, fields, args, kwargs)
                return _result(await self.run(dedup_key, request_hash,
                                              lambda: function(*args, **kwargs)))
            return wrapper
        return decorate
