"""One Event Hubs partition's batch, each event's effect exactly once.

`PartitionBatchProcessor` skips events the partition's high-water mark covers, parks bad input
and what can never succeed, commits each group of events (by the user's partition key) in one
transaction (`Idempotency.run_atomic_group`), groups concurrently, and advances the mark once
every group committed or was parked. The messages the groups send are dispatched in one
`Dispatch` before the mark moves: the mark covering a marker's position records the dispatch.

Transient is never poison: an outage, throttling or lost races never park a valid event. A
group still failing after its tries makes the batch raise, once every group finished, so the
host's retry policy runs it again; the mark and the keys absorb what was done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from shared._core.exceptions import (
    ConcurrencyRetriesExhaustedError,
    ConfigurationError,
    PoisonMessageError,
    retry_after,
)
from shared._core.keys import DedupKey
from shared._core.observability import CORRELATION_ID_HEADER
from shared._core.outbox import EventPosition, OutgoingMessage
from shared._core.records import Outcome, OutcomeStatus
from shared._core.settlement import TRANSIENT_ERRORS, decision_for_exception, refusal
from shared._flows.drivers import Async, AsyncTransaction, BaseTransaction, Sync, Transaction, flowmethod
from shared._flows.idempotency import AsyncIdempotency, BaseIdempotency, GroupMessage, Idempotency
from shared._flows.parking import AsyncParkingLot, BaseParkingLot, ParkingLot
from shared._flows.steps import Flow, Gather, OnStore, Sleep
from shared._flows.watermark import (
    AsyncPartitionWatermark,
    BasePartitionWatermark,
    Mark,
    PartitionWatermark,
    event_time,
)

#: The longest Retry-After a group (or the batch, before it raises) waits out.
MAX_RETRY_AFTER_SECONDS = 5.0
#: Outcomes after which an event needs nothing more (applied now or before, or refused).
SETTLED = frozenset({OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER, OutcomeStatus.DUPLICATE,
                     OutcomeStatus.CONFLICT})
logger = logging.getLogger(__name__)


class BatchEvent(Protocol):
    """What the processor reads of an event (the app's view of an EventHubEvent)."""

    @property
    def sequence_number(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def properties(self) -> Mapping[str, Any]: ...
    @property
    def offset(self) -> str | None: ...
    @property
    def enqueued_time(self) -> datetime | str | None: ...


@dataclass
class BatchReport:
    """What one batch did."""

    applied: int = 0
    duplicates: int = 0
    replay_skipped: int = 0
    parked: dict[str, int] = field(default_factory=dict[str, int])
    watermark: int | None = None
    groups: int = 0  # groups committed (one or more transactions each)
    dispatched: int = 0  # outgoing messages sent before the mark moved (re-sends included)

    def park(self, reason: str) -> None:
        self.parked[reason] = self.parked.get(reason, 0) + 1


@dataclass(frozen=True)
class _Parsed[E, I]:
    event: E
    item: I
    key: DedupKey
    request_hash: str
    position: EventPosition


class BasePartitionBatchProcessor[E: BatchEvent, I, L: BaseIdempotency[Any, Any, Any],
                                  W: BasePartitionWatermark, P: BaseParkingLot, X: BaseTransaction]:
    """Parametrised by the user's rule:

    * `parse(event, partition_id)`: the event's item; InvalidPayloadError for bad input;
    * `identify(item)`: its dedup key and request hash;
    * `group(item)`: the store partition its effect lives in (a group commits together);
    * `build(tx, items)`: add the items' writes, return one result per item; InvalidPayloadError
      refuses an item (parked).
    """

    def __init__(self, ledger: L, watermark: W, parking: P, *, consumer: str, event_hub: str,
                 parse: Callable[[E, str], I], identify: Callable[[I], tuple[DedupKey, str]],
                 group: Callable[[I], str], build: Callable[[X, list[I]], Any], max_attempts: int = 3,
                 backoff: float = 0.2, max_concurrency: int = 16,
                 max_retry_after: float = MAX_RETRY_AFTER_SECONDS,
                 sleep: Callable[[float], object] | None = None) -> None:
        if max_concurrency < 1:
            raise ConfigurationError("max_concurrency must be at least 1")
        if max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        for part in (ledger, watermark, parking):
            if isinstance(part, Async) != isinstance(self, Async):
                variant = "shared.aio" if isinstance(self, Async) else "shared"
                raise ConfigurationError(
                    f"{type(self).__name__} runs on the {variant} variant; give it {variant}'s Idempotency, "
                    f"PartitionWatermark and ParkingLot ({type(part).__name__} is the other variant)")
        self.store = None  # every step names its store (OnStore)
        self.ledger = ledger
        self.watermark = watermark
        self.parking = parking
        self.consumer = consumer
        self.event_hub = event_hub
        self.parse = parse
        self.identify = identify
        self.group = group
        self.build = build
        self.max_attempts = max_attempts  # tries per group before the batch raises
        self.backoff = backoff
        self.max_concurrency = max_concurrency  # groups committed at the same time
        self.max_retry_after = max_retry_after
        if sleep is not None:
            self.sleep = sleep

    @flowmethod
    def process_batch(self, events: Sequence[E], partition_id: str) -> Flow[BatchReport]:
        """Apply a batch from one partition. The mark moves only after every group committed
        or was parked and their uncovered messages were dispatched; a group's transient
        failure or a failed dispatch raises once every group has finished."""
        report = BatchReport()
        watermark = self.watermark
        mark = yield OnStore(watermark.store, watermark.read.flow(partition_id))
        fresh = sorted((e for e in events if mark is None
                        or not mark.covers(e.sequence_number, e.enqueued_time)),
                       key=lambda e: e.sequence_number)
        # Below the mark yet newer: the hub restarted its numbers (recreated, failed over).
        reset = next((e for e in fresh if mark is not None
                      and mark.is_reset(e.sequence_number, e.enqueued_time)), None)
        report.replay_skipped = len(events) - len(fresh)
        self.ledger.telemetry.replay_skipped(report.replay_skipped, consumer=self.consumer,
                                             partition_id=partition_id)
        groups, invalid = self._groups(fresh, partition_id)
        for event, reason, detail in invalid:
            yield from self._park(event, partition_id, reason, detail, report)
        report.groups = len(groups)
        results: list[list[Outcome | Exception] | Exception] = yield Gather(
            tuple(self._group_flow(group, partition_id) for group in groups),
            limit=self.max_concurrency)
        failure: Exception | None = None
        holding: list[_Held] = []
        for group, outcomes in zip(groups, results, strict=True):
            if isinstance(outcomes, Exception):
                failure = failure or outcomes
                continue
            for parsed, outcome in zip(group, outcomes, strict=True):
                park = self._count(parsed, outcome, report)
                if park is not None:
                    yield from self._park(parsed.event, partition_id, *park, report)
                elif isinstance(outcome, Outcome) and (held := _held(outcome)) is not None:
                    holding.append(held)
        if failure is not None:
            delay = retry_after(failure)
            if delay:
                yield Sleep(min(delay, self.max_retry_after))
            raise failure
        pending = yield from self._not_covered(holding, partition_id, mark)
        if pending:
            if self.ledger.dispatcher is None:
                raise TypeError(f"{len(pending)} message(s) to dispatch but the processor's "
                                "Idempotency has no dispatcher")
            yield from self.ledger.dispatch_messages(tuple(pending), consumer=self.consumer)
            report.dispatched = len(pending)
        if fresh:
            newest = fresh[-1]
            report.watermark = yield OnStore(watermark.store, watermark.advance.flow(
                partition_id, newest.sequence_number, known=mark,
                enqueued_time=newest.enqueued_time, offset=newest.offset))
            self._marked(events, partition_id, mark, reset)
        elif mark is not None:
            report.watermark = mark.sequence_number
        return report

    def _marked(self, events: Sequence[E], partition_id: str, mark: Mark | None,
                reset: E | None) -> None:
        """Telemetry of an advanced mark: its lag, and a sequence reset if it moved down."""
        telemetry = self.ledger.telemetry
        if mark is not None and reset is not None:
            telemetry.sequence_reset(consumer=self.consumer, partition_id=partition_id,
                                     mark=mark.sequence_number, first=reset.sequence_number,
                                     context={"event_hub": self.event_hub})
        times = [t for t in (event_time(e.enqueued_time) for e in events) if t is not None]
        if times:
            telemetry.mark_lagging(self.ledger.config.clock() - max(times).timestamp(),
                                   consumer=self.consumer, partition_id=partition_id)

    def _not_covered(self, holding: Sequence[_Held], partition_id: str, mark: Mark | None
                     ) -> Flow[list[OutgoingMessage]]:
        """The held messages whose positions the marks do not cover, each id once. A position
        in another partition is judged by that partition's mark; another hub's is never
        covered (sent again: the ids make that harmless)."""
        pending: dict[str, OutgoingMessage] = {}
        marks: dict[str, Mark | None] = {partition_id: mark}
        for position, messages in holding:
            covered = False
            if position.event_hub == self.event_hub:
                if position.partition_id not in marks:
                    marks[position.partition_id] = yield OnStore(
                        self.watermark.store, self.watermark.read.flow(position.partition_id))
                other = marks[position.partition_id]
                covered = other is not None and other.covers(position.sequence_number,
                                                             position.enqueued_time)
            if not covered:
                for message in messages:
                    pending.setdefault(message.message_id, message)
        return list(pending.values())

    @flowmethod
    def apply(self, item: I, context: Mapping[str, Any] | None = None) -> Flow[Outcome]:
        """One item on its own (an HTTP request, a replayed entry): its marker and writes in one
        transaction; what its build sends is dispatched and recorded before this returns."""
        key, request_hash = self.identify(item)
        outcomes = yield from self._commit([GroupMessage(key, request_hash, context)], [item])
        return outcomes[0]

    def _commit(self, messages: list[GroupMessage], items: Sequence[I]) -> Flow[list[Outcome]]:
        ledger = self.ledger

        def build(tx: Any, indexes: Sequence[int]) -> Any:
            return self.build(tx, [items[i] for i in indexes])

        return (yield OnStore(ledger.store, ledger.run_atomic_group.flow(
            messages, build, partition=self.group(items[0]))))

    def _groups(self, fresh: Sequence[E], partition_id: str
                ) -> tuple[list[list[_Parsed[E, I]]], list[tuple[E, str, str]]]:
        """Valid events by group, in sequence order; the rest with the reason to park them."""
        by_group: dict[str, list[_Parsed[E, I]]] = {}
        invalid: list[tuple[E, str, str]] = []
        for event in fresh:
            step = "parse"
            try:
                item = self.parse(event, partition_id)
                step = "key"
                key, request_hash = self.identify(item)
                step = "group"
                group = self.group(item)
            except Exception as error:  # read from the event alone: its fault, for good
                refused = refusal(step, error)  # the rule every trigger applies
                if refused is not error:
                    logger.warning("%s: %s raised, event refused: %r", self.consumer, step, error,
                                   extra=self._context(event, partition_id))
                invalid.append((event, refused.reason, refused.detail))
                continue
            position = EventPosition(self.event_hub, partition_id, event.sequence_number,
                                     _time_text(event.enqueued_time))
            by_group.setdefault(group, []).append(_Parsed(event, item, key, request_hash,
                                                          position))
        return list(by_group.values()), invalid

    def _group_flow(self, group: list[_Parsed[E, I]], partition_id: str
                    ) -> Flow[list[Outcome | Exception] | Exception]:
        """The group's per-event results (an Exception: that event's bug), or the transient error
        it still failed with after `max_attempts` tries (returned: the other groups finish)."""
        attempt = 1
        while True:
            try:
                return (yield from self._attempt(group, partition_id, attempt))
            except TRANSIENT_ERRORS as error:
                if attempt == self.max_attempts:
                    return error
                yield Sleep(min(retry_after(error) or self.backoff * 2 ** (attempt - 1),
                                self.max_retry_after))
                attempt += 1

    def _attempt(self, group: list[_Parsed[E, I]], partition_id: str, attempt: int
                 ) -> Flow[list[Outcome | Exception]]:
        messages = [GroupMessage(p.key, p.request_hash,
                                 {**self._context(p.event, partition_id), "attempt": attempt}, p.position)
                    for p in group]
        try:
            results: list[Outcome | Exception] = list((yield from self._commit(
                messages, [p.item for p in group])))
        except TRANSIENT_ERRORS:
            raise
        except Exception:  # not the store's availability: find the event it is about
            logger.exception("%s: group failed; applying its events one by one", self.consumer,
                             extra=messages[0].context)
            results = []
            for parsed, message in zip(group, messages, strict=True):
                try:
                    results.append((yield from self._commit([message], [parsed.item]))[0])
                except TRANSIENT_ERRORS:
                    raise
                except Exception as error:  # refused or a bug for this event: park it, go on
                    if not isinstance(error, PoisonMessageError):
                        logger.exception("%s: unexpected error", self.consumer, extra=message.context)
                    results.append(error)
        held = [r for r in results if isinstance(r, Outcome) and r.status not in SETTLED]
        if held:  # a live claim by someone else (not a ledger marker): retry the batch later
            raise ConcurrencyRetriesExhaustedError(f"{held[0].key.encoded} is {held[0].status}")
        return results

    @staticmethod
    def _count(parsed: _Parsed[E, I], result: Outcome | Exception,
               report: BatchReport) -> tuple[str, str] | None:
        """Count the result; the reason and detail to park the event with, if it must be."""
        if isinstance(result, Exception):  # parked, never retried: the partition never stalls
            decision = decision_for_exception(result)
            return decision.reason or "UnexpectedError", decision.description or repr(result)
        if result.status is OutcomeStatus.CONFLICT:
            return "IdempotencyKeyConflict", f"{parsed.key.key} was applied with different content"
        if result.status is OutcomeStatus.DUPLICATE:
            report.duplicates += 1
        else:
            report.applied += 1
        return None

    def _context(self, event: E, partition_id: str) -> dict[str, Any]:
        """The event's log context, with the producer's correlation id (which sent messages
        carry on) when it set one."""
        context: dict[str, Any] = {"partition_id": partition_id,
                                   "sequence_number": event.sequence_number,
                                   "event_hub": self.event_hub}
        correlation_id = event.properties.get(CORRELATION_ID_HEADER)
        if correlation_id:
            context["correlation_id"] = str(correlation_id)
        return context

    def _park(self, event: E, partition_id: str, reason: str, detail: str,
              report: BatchReport) -> Flow[None]:
        """Durably park; if even that fails, raise so the host's retry policy re-runs the batch."""
        parking = self.parking
        entry_id = f"{self.event_hub}/{partition_id}/{event.sequence_number}"
        identity = _time_text(event.enqueued_time)
        # Sequence numbers restart with a recreated or failed-over hub: the enqueued time keeps
        # a new incarnation's parked event from replacing an old one's.
        yield OnStore(parking.store, parking.park.flow(
            consumer=self.consumer, entry_id=entry_id, reason=reason, payload=event.body,
            error=detail, identity=identity, context={
                "partition_id": partition_id, "sequence_number": event.sequence_number,
                "offset": event.offset, "enqueued_time": identity,
                "properties": {str(k): str(v) for k, v in event.properties.items()}}))
        report.park(reason)


def _time_text(enqueued: datetime | str | None) -> str | None:
    """An enqueued time as text, as the trigger sends it."""
    return None if enqueued is None else (
        enqueued.isoformat() if isinstance(enqueued, datetime) else str(enqueued))


type _Held = tuple[EventPosition, tuple[OutgoingMessage, ...]]


def _held(outcome: Outcome) -> _Held | None:
    """The position and messages the outcome's marker holds for a partition mark to record;
    None when there are none, or no position (the ledger records them)."""
    record = outcome.record
    if (outcome.status is OutcomeStatus.CONFLICT or record is None or not record.outbox
            or record.outbox_position is None):
        return None
    return record.outbox_position, record.outbox


class PartitionBatchProcessor[E: BatchEvent, I](
        BasePartitionBatchProcessor[E, I, Idempotency, PartitionWatermark, ParkingLot, Transaction],
        Sync):
    """Runs a partition's batches on sync stores; groups commit on a bounded thread pool."""


class AsyncPartitionBatchProcessor[E: BatchEvent, I](
        BasePartitionBatchProcessor[E, I, AsyncIdempotency, AsyncPartitionWatermark, AsyncParkingLot,
                                    AsyncTransaction], Async):
    """`PartitionBatchProcessor` on async stores (`shared.aio.PartitionBatchProcessor`): groups
    are tasks on one event loop; builds may be async."""
