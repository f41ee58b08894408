"""The steps every dedup flow shares (`shared.flows.idempotency` composes them into its flows): a
record made, a record someone wrote first judged, the completed-key cache consulted, an
outcome's telemetry, and a committed marker's outgoing messages dispatched and recorded. Each
is a plain call, or a flow of steps (`shared.flows.steps`) a driver runs."""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

from shared.core.config import IdempotencyConfig
from shared.core.exceptions import ConcurrencyRetriesExhaustedError, ConfigurationError, RecordChangedError
from shared.core.keys import DedupKey
from shared.core.records import IdempotencyRecord, Outcome, OutcomeStatus, RecordState
from shared.core.store import GetRecord, RecordDispatched
from shared.core.telemetry import Telemetry
from shared.flows.cache import CompletedKeyCache, DocumentCache
from shared.flows.drivers import Async, AsyncStore, Sync, SyncStore, flowmethod
from shared.flows.steps import Dispatch, Flow, Writes

Context = Mapping[str, Any]

#: Leases are judged on each instance's clock. A renewal lands every lease/3, so the expiry
#: another instance reads is at least 2/3 of a lease ahead of the holder's clock: two clocks may
#: differ by less than 2/3 of the lease (minus a renewal's round trip), i.e. each may be off the
#: store's by less than 1/3. `dedup.clock_skew` warns at half that, 1/6 of the lease, while the
#: pair still has room for the renewal latency and the 1-second resolution of Cosmos's `_ts`.
CLOCK_SKEW_WARNING_FRACTION = 1 / 6


class DedupSteps[S: (SyncStore, AsyncStore), D]:
    """The state of the dedup flow over one store (the store, its dispatcher, config,
    telemetry and caches) and the steps its flows share; `shared.flows.idempotency.BaseIdempotency`
    holds the flows."""

    def __init__(self, store: S, *, config: IdempotencyConfig | None = None,
                 telemetry: Telemetry | None = None, cache: CompletedKeyCache | None = None,
                 documents: DocumentCache | None = None, dispatcher: D | None = None) -> None:
        check_sync_or_async(self, store, dispatcher)
        self.store = store  # the atomic paths also need it to hold documents
        # Sends what builds record with `tx.send` (shared.backends.dispatch; on the async variant, a
        # shared.backends.dispatch_aio one, or a sync one that never blocks). None: a build that
        # sends fails before committing (a consumer that names its destinations fails at
        # construction instead).
        self.dispatcher = dispatcher
        self.config = config or IdempotencyConfig()
        self.telemetry = telemetry or Telemetry()
        self.cache = cache  # completed keys only; consulted by run/run_atomic before the store
        self.documents = documents  # what group commits wrote last; see DocumentCache

    # -- helpers -------------------------------------------------------------------
    def _now(self) -> float:
        return self.config.clock()

    def _clock_seen(self, written: IdempotencyRecord) -> None:
        """Compare this instance's clock (the record's `updated_at`) with the store's, where the
        write answered it (`server_time`); telemetry samples it. No request, a subtraction."""
        if written.server_time is not None:
            self.telemetry.clock_skew(
                written.updated_at - written.server_time, backend=self.store.name,
                threshold=self.config.lease.total_seconds() * CLOCK_SKEW_WARNING_FRACTION)

    def _new_record(self, key: DedupKey, request_hash: str, state: RecordState, *,
                    partition: str | None = None, record_id: str | None = None,
                    expires: bool = True, result: Any = None) -> IdempotencyRecord:
        now = self._now()
        return IdempotencyRecord(
            key=key, state=state, request_hash=request_hash, created_at=now, updated_at=now,
            expires_at=now + self.config.ttl.total_seconds() if expires else None,
            lease_expires_at=(now + self.config.lease.total_seconds()
                              if state is RecordState.IN_PROGRESS else None),
            partition=partition, record_id=record_id, result=result,
        )

    def _outcome_of_found(self, existing: IdempotencyRecord, request_hash: str, key: DedupKey) -> Outcome:
        """Outcome for a live record someone else wrote first."""
        if existing.request_hash != request_hash:
            return Outcome(OutcomeStatus.CONFLICT, key, request_hash, existing.result, existing)
        if existing.state is RecordState.COMPLETED:
            return Outcome(OutcomeStatus.DUPLICATE, key, request_hash, existing.result, existing)
        return Outcome(OutcomeStatus.IN_PROGRESS, key, request_hash, None, existing)

    def _marker(self, key: DedupKey, request_hash: str, *, partition: str | None,
                record_id: str | None = None, expires: bool = True,
                over: IdempotencyRecord | None = None, result: Any = None) -> IdempotencyRecord:
        """A completed marker to commit, holding `result`; `over` is an expired one it replaces
        under its etag."""
        marker = self._new_record(key, request_hash, RecordState.COMPLETED, partition=partition,
                                  record_id=record_id, expires=expires, result=result)
        if over is None:
            return marker
        return marker.evolve(etag=over.etag, attempts=over.attempts + 1)

    def _after_failed_marker(self, marker: IdempotencyRecord, request_hash: str
                             ) -> Flow[Outcome | IdempotencyRecord]:
        """After a marker write failed: the outcome the live record there decides, or the
        expired record to take over. RecordChangedError when it vanished meanwhile."""
        existing: IdempotencyRecord | None = yield GetRecord(marker.partition_key, marker.id)
        if existing is None:
            raise RecordChangedError(marker.id)  # deleted meanwhile: commit again
        if existing.is_expired(self._now()):
            return existing
        return self._outcome_of_found(existing, request_hash, marker.key)

    def _cached(self, key: DedupKey, request_hash: str) -> Outcome | None:
        """A duplicate (or conflict) answered by the local cache, without a store request."""
        record = self.cache.get(key, now=self._now()) if self.cache is not None else None
        return None if record is None else self._outcome_of_found(record, request_hash, key)

    def _finish(self, outcome: Outcome, started: float, context: Context | None, *,
                handler_seconds: float = 0.0, source: str = "store") -> Outcome:
        if (self.cache is not None and outcome.record is not None and source == "store"
                and not outcome.record.has_pending):
            self.cache.put(outcome.record)  # refuses anything not completed
        elapsed = time.perf_counter() - started
        self.telemetry.outcome(outcome, latency=elapsed - handler_seconds, backend=self.store.name,
                               source=source, context=context)
        return outcome

    def _can_send(self, writes: Writes) -> None:
        if writes.outgoing and self.dispatcher is None:
            raise ConfigurationError(
                f"the build sent {len(writes.outgoing)} message(s) to "
                f"{writes.outgoing[0].destination} but this Idempotency has no dispatcher: pass "
                "dispatcher=ServiceBusDispatcher(...) (shared.backends.dispatch) to Idempotency")

    @flowmethod
    def dispatch_pending(self, marker: IdempotencyRecord) -> Flow[IdempotencyRecord]:
        """Send a committed marker's pending messages, then clear them under its etag.

        Returns the marker as stored after that (nothing pending). A dispatch failure
        propagates (DispatchUnavailableError: retry later) and leaves them pending. When the
        marker changed meanwhile (a business write on a marker that is a document, or
        someone else recorded the dispatch), it is read again: cleared already = done,
        still pending = those are cleared (they were just sent).
        """
        if not marker.outbox:
            return marker
        if self.dispatcher is None:
            raise ConfigurationError(f"{marker.key.encoded} has {len(marker.outbox)} pending "
                                     "message(s) but this Idempotency has no dispatcher: pass "
                                     "dispatcher=... to Idempotency")
        consumer = marker.key.consumer
        try:
            yield Dispatch(self.dispatcher, marker.outbox)
        except Exception as error:
            self.telemetry.dispatch_failed(len(marker.outbox), consumer=consumer, error=error)
            raise
        self.telemetry.dispatched(len(marker.outbox), consumer=consumer)
        sent = {message.message_id for message in marker.outbox}
        current = marker
        for _ in range(self.config.max_commit_attempts):
            try:
                return (yield RecordDispatched(current))
            except RecordChangedError:
                found: IdempotencyRecord | None = yield GetRecord(marker.partition_key, marker.id)
                if found is None or not found.outbox:
                    return found or marker.evolve(outbox=())
                if not {m.message_id for m in found.outbox} <= sent:
                    return found  # other messages pending now: theirs to send
                current = found
        raise ConcurrencyRetriesExhaustedError(f"recording the dispatch of {marker.key.encoded}")

    def _with_outbox_sent(self, outcome: Outcome) -> Flow[Outcome]:
        """The outcome once the marker's pending messages (if any) are dispatched and recorded."""
        record = outcome.record
        if (record is None or not record.outbox
                or outcome.status not in (OutcomeStatus.PROCESSED, OutcomeStatus.DUPLICATE)):
            return outcome
        cleared = yield from self.dispatch_pending.flow(record)
        return Outcome(outcome.status, outcome.key, outcome.request_hash, outcome.result, cleared)


def check_sync_or_async(owner: object, store: object, dispatcher: object = None) -> None:
    """Refuse, at construction, a store or dispatcher of the other variant: a sync variant would
    hand an async store's coroutines to its steps unawaited; an async variant would block its
    event loop on every request of a sync store."""
    kind = type(owner).__name__.removeprefix("Async")  # the name an app imports it by
    store_is_async = inspect.iscoroutinefunction(getattr(store, "get_record", None)) or \
        inspect.iscoroutinefunction(getattr(store, "read_document", None))
    if isinstance(owner, Async) and not store_is_async:
        raise ConfigurationError(
            f"shared.aio.{kind} needs an async store ({type(store).__name__} is sync): use "
            "shared.aio.CosmosIdempotencyStore or shared.aio.TableIdempotencyStore, or wrap a "
            "sync one in shared.aio.ThreadedStore")
    if isinstance(owner, Sync) and store_is_async:
        raise ConfigurationError(f"{kind} needs a sync store ({type(store).__name__} is async): "
                                 f"use shared.aio.{kind} with it")
    if isinstance(owner, Sync) and inspect.iscoroutinefunction(getattr(dispatcher, "dispatch", None)):
        raise ConfigurationError(f"{kind} needs a sync dispatcher ({type(dispatcher).__name__} is "
                                 "async): use shared.backends.dispatch's, or shared.aio with this one")
