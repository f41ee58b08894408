"""OpenTelemetry metrics for every dedup outcome; log records only for what a person acts on.

Every outcome is one point on the per-message metrics (`METRIC_*`), aggregated in process and
exported once per interval, so telemetry does not grow with the message rate. `dedup.messages`
counts messages by consumer, outcome, backend, source (`store` or `cache`) and, for duplicates,
the cause where known (`redelivery`: the broker delivered it again; `producer_retry`: a second
copy on its first delivery; `replay`: an Event Hubs replay; or the caller's `cause=`); the
duplicate-rate alert reads it.

Log records are written only where someone acts: a conflict, a parked or dead-lettered message
(ERROR), a stale claim or a lost lease (WARNING), a recovered claim and one summary per Event
Hubs batch (INFO). Processed messages, duplicates and in-progress claims are DEBUG (duplicates
at INFO with `log_duplicates=True`). Fields are built only when the level is enabled, and carry
only what a person reads: nothing the metrics or the exporter's envelope already hold (latency,
backend, trace ids), no empty values. Every record's message starts with a stable event name
(`EVENT_*`); the Bicep alerts and the replay tool rely on these names, do not rename them.

Metrics go through the OpenTelemetry API: a no-op until the app configures a meter provider
(`shared._core.observability.configure_observability`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics

from shared._core.records import Outcome, OutcomeStatus

EVENT_OUTCOME = "DedupOutcome"
EVENT_DUPLICATE = "DuplicateDetected"
EVENT_CONFLICT = "IdempotencyKeyConflict"
EVENT_IN_PROGRESS = "DedupInProgress"
EVENT_PARKED = "EventParked"
EVENT_DEAD_LETTERED = "MessageDeadLettered"
EVENT_REPLAY_SKIPPED = "ReplaySkipped"
EVENT_SEQUENCE_RESET = "SequenceReset"
EVENT_BATCH = "EventBatchProcessed"

# `outcome` on dedup.messages of a message set aside for a person, and of an older version of a
# full-state event that was not applied.
OUTCOME_PARKED = "parked"
OUTCOME_DEAD_LETTERED = "dead_lettered"
OUTCOME_STALE_VERSION = "stale_version"
EVENT_STALE_VERSION = "StaleStatusRejected"

CAUSE_REDELIVERY = "redelivery"
CAUSE_PRODUCER_RETRY = "producer_retry"

METRIC_MESSAGES = "dedup.messages"
METRIC_STORE_LATENCY = "dedup.store.latency"
METRIC_REPLAY_SKIPPED = "dedup.replay_skipped"
METRIC_PARKED = "dedup.parked"
METRIC_DEAD_LETTERED = "dedup.dead_lettered"
METRIC_DISPATCHED = "outbox.dispatched"
METRIC_DISPATCH_FAILURES = "outbox.dispatch_failures"
METRIC_OLDEST_PENDING = "outbox.oldest_pending_age"
EVENT_DISPATCH_FAILED = "OutboxDispatchFailed"
EVENT_OUTBOX_SWEEP = "OutboxSweep"
METRIC_SEQUENCE_RESET = "dedup.eventhubs.sequence_reset"
METRIC_MARK_LAG = "dedup.eventhubs.mark_lag"
METRIC_CLOCK_SKEW = "dedup.clock_skew"
EVENT_CLOCK_SKEW = "ClockSkewDetected"
#: At most one `dedup.clock_skew` point per this many seconds (per Telemetry), and one WARNING
#: per `..._WARNING_SECONDS`.
CLOCK_SKEW_SAMPLE_SECONDS = 60.0
CLOCK_SKEW_WARNING_SECONDS = 900.0

logger = logging.getLogger(__name__)

# LogRecord attributes that `extra` may not overwrite (logging raises KeyError).
_RESERVED_LOG_KEYS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime"}

# Event name and level per outcome; None: DEBUG, or INFO when duplicates are logged.
_LOG_AS: dict[OutcomeStatus, tuple[str, int | None]] = {
    OutcomeStatus.PROCESSED: (EVENT_OUTCOME, logging.DEBUG),
    OutcomeStatus.DUPLICATE: (EVENT_DUPLICATE, None),
    OutcomeStatus.IN_PROGRESS: (EVENT_IN_PROGRESS, None),
    OutcomeStatus.CONFLICT: (EVENT_CONFLICT, logging.ERROR),
    OutcomeStatus.STALE: (EVENT_IN_PROGRESS, logging.WARNING),
    OutcomeStatus.LEASE_LOST: (EVENT_IN_PROGRESS, logging.WARNING),
    OutcomeStatus.TAKEN_OVER: (EVENT_OUTCOME, logging.INFO),
}


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields that hold something (no None, empty strings or empty collections)."""
    return {name: value for name, value in fields.items()
            if value is not None and not (isinstance(value, (str, dict, list, tuple)) and not value)}


def _safe_extra(fields: dict[str, Any]) -> dict[str, Any]:
    """`extra` for logging: caller context that collides with LogRecord attributes is prefixed."""
    return {(f"ctx_{name}" if name in _RESERVED_LOG_KEYS else name): value
            for name, value in fields.items()}


def _log(level: int, event: str, text: str, *args: object, fields: dict[str, Any]) -> None:
    """One record: its message `event` then `text`, its fields `fields` with `event` set."""
    logger.log(level, f"%s {text}", event, *args, extra=_safe_extra({**fields, "event": event}),
               stacklevel=2)


def duplicate_cause(*, delivery_count: Any = None, cause: str | None = None) -> str | None:
    """Why a duplicate arrived: the explicit cause, else one read from the delivery count."""
    if cause:
        return str(cause)
    if delivery_count is None:
        return None
    try:
        count = int(delivery_count)
    except (TypeError, ValueError):
        return None
    return CAUSE_REDELIVERY if count > 1 else CAUSE_PRODUCER_RETRY


class Telemetry:
    """Turns outcomes into metric points and, where someone acts, log records.

    `meter_provider` defaults to the global one. `log_duplicates` raises duplicate and
    in-progress records from DEBUG to INFO (an investigation).
    """

    def __init__(self, meter_name: str = "idempotent-consumer", *,
                 meter_provider: metrics.MeterProvider | None = None,
                 log_duplicates: bool = False,
                 clock_skew_sample_seconds: float = CLOCK_SKEW_SAMPLE_SECONDS,
                 clock_skew_warning_seconds: float = CLOCK_SKEW_WARNING_SECONDS) -> None:
        meter = (meter_provider.get_meter(meter_name) if meter_provider is not None
                 else metrics.get_meter(meter_name))
        self.log_duplicates = log_duplicates
        self.messages = meter.create_counter(
            METRIC_MESSAGES, unit="{message}",
            description="Messages by consumer and dedup outcome (duplicates by cause where known)")
        self.latency = meter.create_histogram(
            METRIC_STORE_LATENCY, unit="ms",
            description="Time the dedup flow spent on the store per message (handler excluded)")
        self.replay_skipped_events = meter.create_counter(
            METRIC_REPLAY_SKIPPED, unit="{event}",
            description="Event Hubs events skipped under the high-water mark")
        self.parked_events = meter.create_counter(
            METRIC_PARKED, unit="{message}", description="Messages parked for a person")
        self.dead_lettered_messages = meter.create_counter(
            METRIC_DEAD_LETTERED, unit="{message}", description="Messages the app dead-lettered itself")
        self.dispatched_messages = meter.create_counter(
            METRIC_DISPATCHED, unit="{message}",
            description="Outgoing messages dispatched after their commit")
        self.dispatch_failures = meter.create_counter(
            METRIC_DISPATCH_FAILURES, unit="{dispatch}",
            description="Dispatches of outgoing messages that failed (they stay pending)")
        self.oldest_pending_age = meter.create_gauge(
            METRIC_OLDEST_PENDING, unit="s",
            description="Age of the oldest outgoing message the sweeper found pending")
        self.sequence_resets = meter.create_counter(
            METRIC_SEQUENCE_RESET, unit="{reset}",
            description="Event Hubs partitions whose sequence numbers restarted below the mark")
        self.mark_lag = meter.create_histogram(
            METRIC_MARK_LAG, unit="s",
            description="Age of the newest event of a batch when the Event Hubs mark advanced")
        self.clock_skew_seconds = meter.create_gauge(  # a gauge: a skew can be negative
            METRIC_CLOCK_SKEW, unit="s",
            description="This instance's clock minus the store's at a record write (sampled)")
        self._skew_every = clock_skew_sample_seconds
        self._skew_warn_every = clock_skew_warning_seconds
        self._next_skew_sample = 0.0  # time.monotonic() values
        self._next_skew_warning = 0.0

    def outcome(self, outcome: Outcome, *, latency: float, backend: str, source: str = "store",
                context: Mapping[str, Any] | None = None) -> None:
        """Record one dedup outcome. `latency`: store time in seconds; `context`: the caller's
        (message_id, correlation_id, delivery_count, cause, ...), logged as fields."""
        status = outcome.status
        consumer = outcome.key.consumer
        cause = None
        if status is OutcomeStatus.DUPLICATE and context:
            cause = duplicate_cause(delivery_count=context.get("delivery_count"),
                                    cause=context.get("cause"))
        attributes = {"consumer": consumer, "outcome": status.value, "backend": backend,
                      "source": source}
        latency_ms = max(0.0, latency * 1000.0)
        # The SDK may keep the dict it was given for a new series: one dict per instrument.
        self.messages.add(1, {**attributes, "cause": cause} if cause else attributes)
        self.latency.record(latency_ms, dict(attributes) if cause else attributes)

        event, level = _LOG_AS.get(status, (EVENT_OUTCOME, logging.INFO))
        if level is None:
            level = logging.INFO if self.log_duplicates else logging.DEBUG
        if not logger.isEnabledFor(level):
            return
        fields = dict(context or {})
        message_id = fields.pop("message_id", None)
        correlation_id = fields.pop("correlation_id", None)
        fields.pop("cause", None)
        fields.update({
            "consumer": consumer,
            "outcome": status.value,
            "dedup_key": outcome.key.key,
            "message_id": message_id,
            "correlation_id": correlation_id,
            "duplicate_cause": cause,
            "attempt": outcome.record.attempts if outcome.record else None,
            "request_hash": outcome.request_hash,
            # the stored hash only where it tells something: a conflict's other content
            "stored_hash": (outcome.stored_hash if outcome.stored_hash != outcome.request_hash
                            else None),
        })
        _log(level, event, "consumer=%s outcome=%s", consumer, status.value, fields=_present(fields))

    def parked(self, *, consumer: str, reason: str,
               context: Mapping[str, Any] | None = None) -> None:
        """A message that can never be applied was parked for a person: alert."""
        self._set_aside(self.parked_events, OUTCOME_PARKED, EVENT_PARKED, consumer=consumer,
                        reason=reason, context=context)

    def dead_lettered(self, *, consumer: str, reason: str,
                      context: Mapping[str, Any] | None = None) -> None:
        """A message the app dead-lettered itself (invalid, refused by the store): alert."""
        self._set_aside(self.dead_lettered_messages, OUTCOME_DEAD_LETTERED, EVENT_DEAD_LETTERED,
                        consumer=consumer, reason=reason, context=context)

    def _set_aside(self, counter: metrics.Counter, outcome: str, event: str, *, consumer: str,
                   reason: str, context: Mapping[str, Any] | None) -> None:
        """Count a parked or dead-lettered message and write its ERROR record."""
        counter.add(1, {"consumer": consumer, "reason": reason})
        self.messages.add(1, {"consumer": consumer, "outcome": outcome, "reason": reason})
        fields = {**(context or {}), "consumer": consumer, "reason": reason}
        _log(logging.ERROR, event, "consumer=%s reason=%s", consumer, reason, fields=_present(fields))

    def versioned(self, result: str, *, consumer: str, backend: str,
                  delivery_count: int | None = None,
                  context: Mapping[str, Any] | None = None) -> None:
        """One full-state event applied by version, without a dedup record: `result` is
        "applied" (processed), "unchanged" (a duplicate, by cause) or "stale" (an older version
        arriving late, outcome `stale_version`, logged at DEBUG only: reordering is expected)."""
        attributes = {"consumer": consumer, "backend": backend, "source": "store"}
        if result == "applied":
            self.messages.add(1, {**attributes, "outcome": OutcomeStatus.PROCESSED.value})
        elif result == "unchanged":
            cause = duplicate_cause(delivery_count=delivery_count)
            self.messages.add(1, {**attributes, "outcome": OutcomeStatus.DUPLICATE.value,
                                  **({"cause": cause} if cause else {})})
        elif result == "stale":
            self.messages.add(1, {**attributes, "outcome": OUTCOME_STALE_VERSION})
            if logger.isEnabledFor(logging.DEBUG):
                _log(logging.DEBUG, EVENT_STALE_VERSION, "consumer=%s", consumer,
                     fields=_present({**(context or {}), "consumer": consumer}))
        else:
            raise ValueError(f"result={result!r} is not applied, unchanged or stale")

    def replay_skipped(self, count: int, *, consumer: str, partition_id: str) -> None:
        """Events at or below the high-water mark, skipped without a store request each;
        logged at DEBUG only (the batch summary carries the count)."""
        if count:
            self.replay_skipped_events.add(count, {"consumer": consumer, "partition_id": partition_id})
            if logger.isEnabledFor(logging.DEBUG):
                _log(logging.DEBUG, EVENT_REPLAY_SKIPPED, "consumer=%s partition=%s count=%d",
                     consumer, partition_id, count,
                     fields={"consumer": consumer, "partition_id": partition_id, "count": count})

    def sequence_reset(self, *, consumer: str, partition_id: str, mark: int, first: int,
                       context: Mapping[str, Any] | None = None) -> None:
        """A partition's sequence numbers restarted (hub recreated, disaster-recovery failover):
        events below the mark were processed through their keys and the mark moved down. Alert."""
        self.sequence_resets.add(1, {"consumer": consumer, "partition_id": partition_id})
        fields = {**(context or {}), "consumer": consumer, "partition_id": partition_id,
                  "mark": mark, "first_sequence_number": first}
        _log(logging.WARNING, EVENT_SEQUENCE_RESET, "consumer=%s partition=%s mark=%d first=%d",
             consumer, partition_id, mark, first, fields=fields)

    def mark_lagging(self, seconds: float, *, consumer: str, partition_id: str) -> None:
        """How old the newest event of a batch was when the mark advanced past it."""
        self.mark_lag.record(max(0.0, seconds), {"consumer": consumer, "partition": partition_id})

    def clock_skew(self, skew: float, *, backend: str, threshold: float) -> None:
        """This instance's clock minus the store's (seconds, positive: ahead), seen at a record
        write: a point at most every `clock_skew_sample_seconds` (so it is cheap on every
        write), a WARNING beyond `threshold` at most every `clock_skew_warning_seconds`."""
        now = time.monotonic()
        if now < self._next_skew_sample:
            return
        self._next_skew_sample = now + self._skew_every
        self.clock_skew_seconds.set(skew, {"backend": backend})
        if abs(skew) <= threshold or now < self._next_skew_warning:
            return
        self._next_skew_warning = now + self._skew_warn_every
        direction, risk = (("ahead of", "it may take over another instance's live lease")
                           if skew > 0 else
                           ("behind", "the leases it writes end early for the other instances, "
                            "which may take them over while it still works"))
        _log(logging.WARNING, EVENT_CLOCK_SKEW,
             "backend=%s skew=%.1fs threshold=%.1fs: this instance's clock is %.1f s %s the store's; "
             "leases are judged on each instance's own clock, so %s. Synchronise its clock (NTP)",
             backend, skew, threshold, abs(skew), direction, risk,
             fields={"backend": backend, "clock_skew_s": round(skew, 3),
                     "threshold_s": round(threshold, 3)})

    def batch(self, *, consumer: str, partition_id: str, counts: Mapping[str, int],
              first_sequence: int | None, last_sequence: int | None, duration: float,
              context: Mapping[str, Any] | None = None) -> None:
        """One INFO summary record per Event Hubs batch instead of one per event: each non-zero
        count of `counts` (events by outcome) a field, their sum in the message; `duration` in
        seconds, logged in whole ms; `context` adds fields (what was parked and why)."""
        if not logger.isEnabledFor(logging.INFO):
            return
        fields = {**(context or {}), "consumer": consumer, "partition_id": partition_id,
                  "first_sequence": first_sequence, "last_sequence": last_sequence,
                  **{name: int(value) for name, value in counts.items() if value},
                  "duration_ms": round(duration * 1000.0)}
        _log(logging.INFO, EVENT_BATCH, "consumer=%s partition=%s events=%d", consumer, partition_id,
             int(sum(counts.values())), fields=_present(fields))

    def dispatched(self, count: int, *, consumer: str) -> None:
        """Outgoing messages the broker took after their commit."""
        self.dispatched_messages.add(count, {"consumer": consumer})

    def dispatch_failed(self, count: int, *, consumer: str, error: BaseException) -> None:
        """A dispatch failed: its messages stay pending for a copy or the sweeper."""
        self.dispatch_failures.add(1, {"consumer": consumer, "error": type(error).__name__})
        _log(logging.WARNING, EVENT_DISPATCH_FAILED, "consumer=%s messages=%d error=%s", consumer,
             count, type(error).__name__,
             fields={"consumer": consumer, "count": count, "error": str(error)})

    def outbox_swept(self, *, pending: int, dispatched: int, failed: int,
                     oldest_age: float) -> None:
        """One sweep: markers found pending past the age, dispatched, failed; the oldest age."""
        self.oldest_pending_age.set(max(0.0, oldest_age))
        _log(logging.INFO, EVENT_OUTBOX_SWEEP, "pending=%d dispatched=%d failed=%d oldest_age=%.1f",
             pending, dispatched, failed, oldest_age,
             fields={"pending": pending, "dispatched": dispatched, "failed": failed,
                     "oldest_pending_age_s": round(oldest_age, 3)})
