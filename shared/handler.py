"""The dedup flow: claim, process, complete; or commit marker and effect at once.

`Idempotency.run` is the two-phase flow for effects that cannot join a store
transaction (spec requirement 6). `Idempotency.run_atomic` writes the marker
and the business documents in one transaction (requirement 4). Both let the
store arbitrate concurrent copies with a conditional write (requirement 5).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec

from shared.cache import CompletedKeyCache
from shared.config import IdempotencyConfig
from shared.exceptions import (
    EffectUncertainError,
    RecordChangedError,
    RecordExistsError,
    ResultTooLargeError,
    StoreUnavailableError,
)
from shared.keys import DedupKey, request_hash
from shared.records import IdempotencyRecord, Outcome, OutcomeStatus, RecordState, encode_result
from shared.stores.base import Document, DocumentStore, RecordStore, WriteOp, retry_on_race
from shared.telemetry import Telemetry

P = ParamSpec("P")
logger = logging.getLogger(__name__)
Context = Mapping[str, Any]


class Transaction:
    """The business writes of one atomic commit. Reads go straight to the store."""

    def __init__(self, store: DocumentStore, partition: str) -> None:
        self._store = store
        self.partition = partition
        self.operations: list[WriteOp] = []

    def read(self, document_id: str) -> Document | None:
        return self._store.read_document(self.partition, document_id)

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


class Idempotency:
    """Runs messages through the dedup flow against one store."""

    def __init__(self, store: RecordStore, *, config: IdempotencyConfig | None = None,
                 telemetry: Telemetry | None = None, cache: CompletedKeyCache | None = None) -> None:
        self.store = store  # run_atomic also needs it to be a DocumentStore
        self.config = config or IdempotencyConfig()
        self.telemetry = telemetry or Telemetry()
        self.cache = cache  # completed keys only; consulted by run/run_atomic before the store

    # -- helpers -------------------------------------------------------------------
    def _now(self) -> float:
        return self.config.clock()

    def _new_record(self, key: DedupKey, digest: str, state: RecordState, *,
                    partition: str | None = None, record_id: str | None = None,
                    expires: bool = True) -> IdempotencyRecord:
        now = self._now()
        return IdempotencyRecord(
            key=key, state=state, request_hash=digest, created_at=now, updated_at=now,
            expires_at=now + self.config.ttl.total_seconds() if expires else None,
            lease_expires_at=(now + self.config.lease.total_seconds()
                              if state is RecordState.IN_PROGRESS else None),
            partition=partition, record_id=record_id,
        )

    def _judge(self, existing: IdempotencyRecord, digest: str, key: DedupKey) -> Outcome:
        """Outcome for a live record someone else wrote first."""
        if existing.request_hash != digest:
            return Outcome(OutcomeStatus.CONFLICT, key, digest, existing.result, existing)
        if existing.state is RecordState.COMPLETED:
            return Outcome(OutcomeStatus.DUPLICATE, key, digest, existing.result, existing)
        return Outcome(OutcomeStatus.IN_PROGRESS, key, digest, None, existing)

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

    # -- two-phase -------------------------------------------------------------------
    def claim(self, key: DedupKey, digest: str, *, takeover_stale: bool = True,
              partition: str | None = None) -> tuple[Outcome, IdempotencyRecord | None]:
        """Phase one: hold the key in progress, or say why not.

        Returns (PROCESSED or TAKEN_OVER, the held record) when this caller now
        owns the key, else (outcome, None). The store arbitrates: a create that
        fails on conflict, then a takeover under the etag of what it found.
        """
        fresh = self._new_record(key, digest, RecordState.IN_PROGRESS, partition=partition)

        def attempt() -> tuple[Outcome, IdempotencyRecord | None]:
            try:
                held = self.store.put_record_if_absent(fresh)
                return Outcome(OutcomeStatus.PROCESSED, key, digest, None, held), held
            except RecordExistsError:
                pass
            existing = self.store.get_record(fresh.partition_key, fresh.id)
            if existing is None:
                raise RecordChangedError(fresh.id)  # released between create and read: again
            now = self._now()
            expired = existing.is_expired(now)
            if not expired and existing.request_hash != digest:
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
            held = self.store.replace_record_if_unchanged(taken)  # lost race: look again
            status = OutcomeStatus.TAKEN_OVER if stale else OutcomeStatus.PROCESSED
            return Outcome(status, key, digest, None, held), held

        return retry_on_race(attempt, attempts=self.config.max_commit_attempts,
                             what=f"claim of {key.encoded}")

    def complete(self, held: IdempotencyRecord, result: Any) -> IdempotencyRecord:
        """Phase two: mark the held record completed with the handler's result."""
        too_large: ResultTooLargeError | None = None
        try:
            encode_result(result, self.config.max_result_bytes)
        except ResultTooLargeError as error:
            too_large, result = error, None
        done = held.evolve(state=RecordState.COMPLETED, result=result, lease_expires_at=None,
                           updated_at=self._now())
        try:
            done = self.store.replace_record_if_unchanged(done)
        except RecordChangedError:
            # Our lease ran out and another consumer took the key over meanwhile.
            logger.warning("lease lost before completion", extra={"dedup_key": held.key.key,
                                                                   "consumer": held.key.consumer})
        if too_large is not None:
            raise too_large  # the effect is recorded as done; only its result is missing
        return done

    def release(self, held: IdempotencyRecord) -> None:
        """Give the key back after a failed handler so a redelivery can retry."""
        try:
            self.store.delete_record_if_unchanged(held)
        except (RecordChangedError, StoreUnavailableError) as error:
            # The lease will run out on its own; a redelivery then takes over.
            logger.warning("could not release claim: %s", error,
                           extra={"dedup_key": held.key.key, "consumer": held.key.consumer})

    def run(self, key: DedupKey, digest: str, handler: Callable[[], Any], *,
            takeover_stale: bool = True, partition: str | None = None,
            context: Context | None = None) -> Outcome:
        """Claim, run `handler` once, record its result; duplicates get the first result.

        `context` (message id, correlation id, delivery count...) goes to logs and metrics.
        """
        started = time.perf_counter()
        cached = self._cached(key, digest)
        if cached is not None:
            return self._finish(cached, started, context, source="cache")
        outcome, held = self.claim(key, digest, takeover_stale=takeover_stale, partition=partition)
        if held is None:
            return self._finish(outcome, started, context)
        handler_started = time.perf_counter()
        try:
            result = handler()
        except EffectUncertainError as error:
            error.record = held  # kept in progress: to be reconciled, never retried blindly
            raise
        except BaseException:
            self.release(held)
            raise
        handler_seconds = time.perf_counter() - handler_started
        done = self.complete(held, result)
        return self._finish(Outcome(outcome.status, key, digest, result, done), started, context,
                            handler_seconds=handler_seconds)

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
        store = self.store
        if not isinstance(store, DocumentStore):
            raise TypeError(f"run_atomic needs a DocumentStore; {type(store).__name__} is not one")
        started = time.perf_counter()
        cached = self._cached(key, digest)
        if cached is not None:
            return self._finish(cached, started, context, source="cache")
        expired: list[IdempotencyRecord] = []  # an expired marker the next attempt replaces

        def attempt() -> Outcome:
            marker = self._new_record(key, digest, RecordState.COMPLETED, partition=partition,
                                      record_id=marker_id, expires=expires)
            if expired:
                previous = expired.pop()
                marker = marker.evolve(etag=previous.etag, attempts=previous.attempts + 1)
            tx = Transaction(store, marker.partition_key)
            result = build(tx)
            encode_result(result, self.config.max_result_bytes)
            try:
                committed = store.commit(marker.evolve(result=result), tx.operations,
                                         marker_body=marker_body)
                return Outcome(OutcomeStatus.PROCESSED, key, digest, result, committed)
            except (RecordExistsError, RecordChangedError):
                pass
            existing = store.get_record(marker.partition_key, marker.id)
            if existing is None:
                raise RecordChangedError(marker.id)  # deleted meanwhile: commit again
            if existing.is_expired(self._now()):
                expired.append(existing)
                raise RecordChangedError(marker.id)  # take the expired marker over
            return self._judge(existing, digest, key)

        outcome = retry_on_race(attempt, attempts=self.config.max_commit_attempts,
                                what=f"commit of {key.encoded}")
        return self._finish(outcome, started, context)

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
                dedup_key = key(*args, **kwargs)
                data = payload(*args, **kwargs) if payload else (args[0] if args else kwargs)
                digest = request_hash(data, fields=fields)
                return self.run(dedup_key, digest, lambda: function(*args, **kwargs))
            return wrapper
        return decorate
