"""Structured logs and OpenTelemetry metrics for dedup outcomes (spec requirement 11).

Metrics go through the OpenTelemetry API: a no-op until the app configures a
meter provider (Application Insights via azure-monitor-opentelemetry when its
connection string is set). Event names are stable: the Bicep alerts query them.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import metrics

from shared.records import Outcome, OutcomeStatus

EVENT_OUTCOME = "DedupOutcome"
EVENT_DUPLICATE = "DuplicateDetected"
EVENT_CONFLICT = "IdempotencyKeyConflict"
EVENT_PARKED = "EventParked"
EVENT_REPLAY_SKIPPED = "ReplaySkipped"

logger = logging.getLogger("shared.idempotency")


class Telemetry:
    """One place that turns outcomes into log events and metric points."""

    def __init__(self, meter_name: str = "idempotent-consumer") -> None:
        meter = metrics.get_meter(meter_name)
        self.messages = meter.create_counter(
            "dedup.messages", unit="{message}", description="Messages by consumer and outcome")
        self.latency = meter.create_histogram(
            "dedup.store.latency", unit="ms", description="Dedup flow latency incl. store calls")
        self.replay_skipped_events = meter.create_counter(
            "dedup.replay_skipped", unit="{event}",
            description="Event Hubs events skipped under the high-water mark")
        self.parked_events = meter.create_counter(
            "dedup.parked", unit="{message}", description="Messages parked or dead-lettered")

    def outcome(self, outcome: Outcome, *, latency: float, backend: str, **context: Any) -> None:
        cause = context.pop("cause", None)
        attributes = {"consumer": outcome.key.consumer, "outcome": outcome.status.value,
                      "backend": backend}
        if cause and outcome.status is OutcomeStatus.DUPLICATE:
            attributes["cause"] = cause
        self.messages.add(1, attributes)
        self.latency.record(latency * 1000.0, {"consumer": outcome.key.consumer, "backend": backend})
        event, level = EVENT_OUTCOME, logging.INFO
        if outcome.status is OutcomeStatus.DUPLICATE:
            event = EVENT_DUPLICATE
        elif outcome.status is OutcomeStatus.CONFLICT:
            event, level = EVENT_CONFLICT, logging.ERROR
        fields = {
            "event": event,
            "dedup_key": outcome.key.key,
            "dedup_key_encoded": outcome.key.encoded,
            "consumer": outcome.key.consumer,
            "outcome": outcome.status.value,
            "attempt": outcome.record.attempts if outcome.record else None,
            "request_hash": outcome.request_hash,
            "stored_hash": outcome.stored_hash,
            "store_latency_ms": round(latency * 1000.0, 3),
            "backend": backend,
            **context,
        }
        logger.log(level, "%s %s %s", event, outcome.key.consumer, outcome.status.value,
                   extra=fields)

    def parked(self, *, consumer: str, reason: str, level: int = logging.ERROR,
               event: str = EVENT_PARKED, **context: Any) -> None:
        self.parked_events.add(1, {"consumer": consumer, "reason": reason})
        logger.log(level, "%s %s %s", event, consumer, reason,
                   extra={"event": event, "consumer": consumer, "reason": reason, **context})

    def replay_skipped(self, count: int, *, consumer: str, partition_id: str) -> None:
        if count:
            self.replay_skipped_events.add(count, {"consumer": consumer})
            logger.info("%s %s %d", EVENT_REPLAY_SKIPPED, consumer, count,
                        extra={"event": EVENT_REPLAY_SKIPPED, "consumer": consumer,
                               "partition_id": partition_id, "count": count})
