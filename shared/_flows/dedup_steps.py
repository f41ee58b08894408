"""The steps the dedup flows of `shared._flows.idempotency` share: a record made, a record
someone wrote first judged, the completed-key cache, an outcome's telemetry, and a committed
marker's outgoing messages dispatched and recorded."""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

from shared._core.config import IdempotencyConfig
from shared._core.exceptions import ConcurrencyRetriesExhaustedError, ConfigurationError, RecordChangedError
from shared._core.keys import DedupKey
from shared._core.outbox import OutgoingMessage
from shared._core.records import IdempotencyRecord, Outcome, OutcomeStatus, RecordState
from shared._core.store import GetRecord, RecordDispatched
from shared._core.telemetry import Telemetry
from shared._flows.cache import CompletedKeyCache, DocumentCache
from shared._flows.drivers import Async, AsyncStore, Sync, SyncStore, flowmethod
from shared._flows.steps import Dispatch, Flow, Writes

Context = Mapping[str, Any]

#: Leases are judged on each instance's clock. A renewal every lease/3 keeps the expiry others read
#: 2/3 of a lease ahead, so each clock may be off the store's by less than 1/3 of the lease;
#: `dedup.clock_skew` warns at half that, leaving room for renewal latency and Cosmos's 1-second `_ts`.
CLOCK_SKEW_WARNING_FRACTION = 1 / 6


class DedupSteps[S: (SyncStore, AsyncStore), D]:
    """The state of the dedup flow over one store (store, dispatcher, config, telemetry,
    caches) and the steps its flows share."""

    def __init__(self, store: S, *, config: IdempotencyConfig | None = None,
                 telemetry: Telemetry | None = None, cache: CompletedKeyCache | None = None,
                 documents: DocumentCache | None = None, dispatcher: D | None = None) -> None:
        check_sync_or_async(self, store, dispatcher)
        self.store = store  # the atomic paths also need it to hold documents
        self.dispatcher = dispatcher  # None: a build that sends fails before committing
        self.config = config or IdempotencyConfig()
        self.telemetry = telemetry or Telemetry()
        self.cache = cache  # completed keys only; consulted by run/run_atomic before the store
        self.documents = documents  # what group commits wrote last; see DocumentCache

    def _now(self) -> float:
        return self.config.clock()

    def _clock_seen(self, written: IdempotencyRecord) -> None:
        """Report this instance's clock skew against the store's `server_time`, where the write
        answered it (no request)."""
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
        """A completed marker holding `result`; `over` is an expired one it replaces under its etag."""
        marker = self._new_record(key, request_hash, RecordState.COMPLETED, partition=partition,
                                  record_id=record_id, expires=expires, result=result)
        if over is None:
            return marker
        return marker.evolve(etag=over.etag, attempts=over.attempts + 1)

    def _after_failed_marker(self, marker: IdempotencyRecord, request_hash: str
                             ) -> Flow[Outcome | IdempotencyRecord]:
        """After a failed marker write: the live record's outcome, or the expired record to take
        over. RecordChangedError when it vanished meanwhile."""
        existing: IdempotencyRecord | None = yield GetRecord(marker.partition_key, marker.id)
        if existing is None:
            raise RecordChangedError(marker.id)
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
                "dispatcher=ServiceBusDispatcher(...) (from shared) to Idempotency")

    @flowmethod
    def dispatch_pending(self, marker: IdempotencyRecord) -> Flow[IdempotencyRecord]:
        """Send a committed marker's pending messages, then clear them under its etag; returns
        the marker as stored after that.

        A dispatch failure propagates and leaves them pending. When the marker changed
        meanwhile it is read again: cleared already = done, still pending the same messages =
        cleared (they were just sent), other messages = returned as found.
        """
        if not marker.outbox:
            return marker
        if self.dispatcher is None:
            raise ConfigurationError(f"{marker.key.encoded} has {len(marker.outbox)} pending "
                                     "message(s) but this Idempotency has no dispatcher: pass "
                                     "dispatcher=... to Idempotency")
        yield from self.dispatch_messages(marker.outbox, consumer=marker.key.consumer)
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
                    return found  # other messages pending: theirs to send
                current = found
        raise ConcurrencyRetriesExhaustedError(f"recording the dispatch of {marker.key.encoded}")

    def dispatch_messages(self, messages: tuple[OutgoingMessage, ...], *, consumer: str) -> Flow[None]:
        """Send `messages` with the dispatcher, with telemetry either way; a failure propagates."""
        try:
            yield Dispatch(self.dispatcher, messages)
        except Exception as error:
            self.telemetry.dispatch_failed(len(messages), consumer=consumer, error=error)
            raise
        self.telemetry.dispatched(len(messages), consumer=consumer)

    def _with_outbox_sent(self, outcome: Outcome) -> Flow[Outcome]:
        """The outcome once the marker's pending messages (if any) are dispatched and recorded."""
        record = outcome.record
        if (record is None or not record.outbox
                or outcome.status not in (OutcomeStatus.PROCESSED, OutcomeStatus.DUPLICATE)):
            return outcome
        cleared = yield from self.dispatch_pending.flow(record)
        return Outcome(outcome.status, outcome.key, outcome.request_hash, outcome.result, cleared)


def check_sync_or_async(owner: object, store: object, dispatcher: object = None) -> None:
    """ConfigurationError for a store or dispatcher of the other variant: a sync variant would
    leave an async store's coroutines unawaited, an async one block its loop on a sync store."""
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
                                 "async): use shared's, or shared.aio with this one")
