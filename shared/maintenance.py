"""Housekeeping for a timer trigger: purge expired records, close abandoned claims,
dispatch outgoing messages no redelivery will.

Records accumulate unless something deletes them (Table Storage has no TTL;
Cosmos expires markers in the background), and a claim whose holder died
stays in progress until a redelivery takes it over. Once the broker can no
longer redeliver, nobody will: the sweep parks such a claim for a person and
closes it, so no record is left in progress forever.

The outbox sweep: a commit's messages are dispatched right after it, and again
by any copy of the incoming message; when none comes (the message expired or
was purged after the commit, the instance died on its last delivery) they stay
pending on the marker. The sweep finds markers pending for longer than
`outbox_age_seconds` (`iter_pending`: its cost grows with the pending markers,
not all markers) and dispatches and records them as a copy would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.exceptions import DispatchRejectedError, DispatchUnavailableError, RecordChangedError
from shared.parking import ParkingLot
from shared.stores.base import RecordStore
from shared.telemetry import Telemetry

logger = logging.getLogger(__name__)


@dataclass
class MaintenanceReport:
    purged: dict[str, int] = field(default_factory=dict[str, int])
    parked: int = 0
    outbox_pending: int = 0  # markers found pending past the age
    outbox_dispatched: int = 0  # of them, dispatched and recorded now
    outbox_failed: int = 0  # of them, whose dispatch failed (still pending: next sweep)
    oldest_pending_age: float = 0.0  # seconds, of the oldest found


class Maintenance:
    """Purges expired records and parks in-progress records nobody will finish.

    `grace_seconds` is the redelivery window: a record still in progress that
    long after its lease ran out can no longer be picked up by a redelivery.
    """

    def __init__(self, stores: Mapping[str, RecordStore], parking: ParkingLot, *,
                 grace_seconds: float, clock: Callable[[], float],
                 outbox: Mapping[str, Any] | None = None, outbox_age_seconds: float = 600.0,
                 telemetry: Telemetry | None = None) -> None:
        self.stores = stores
        self.parking = parking
        self.grace_seconds = grace_seconds
        self.clock = clock
        # The consumers that send (name -> a sync `Idempotency` with its dispatcher).
        self.outbox: Mapping[str, Any] = outbox or {}
        self.outbox_age_seconds = outbox_age_seconds
        self.telemetry = telemetry or Telemetry()

    def run(self) -> MaintenanceReport:
        report = MaintenanceReport()
        now = self.clock()
        for name, store in self.stores.items():
            report.purged[name] = store.purge_expired(now)
            for record in store.iter_records(in_progress_before=now - self.grace_seconds):
                try:
                    self.parking.park_record(
                        store, record, reason="StaleInProgress", payload=record.key.key,
                        error="in progress past its lease and the redelivery window", now=now,
                        context={"dedup_store": name})
                    report.parked += 1
                except RecordChangedError as error:  # taken over meanwhile: fine
                    logger.info("stale record changed meanwhile: %s", error)
        self.sweep_outbox(report, now)
        logger.info("maintenance done", extra={"event": "MaintenanceRun", "purged": report.purged,
                                               "parked_stale": report.parked,
                                               "outbox_dispatched": report.outbox_dispatched})
        return report

    def sweep_outbox(self, report: MaintenanceReport, now: float) -> None:
        """Dispatch what has been pending longer than the age; a failure waits for the next run."""
        if not self.outbox:
            return
        for name, idempotency in self.outbox.items():
            for record in idempotency.store.iter_pending(since_before=now - self.outbox_age_seconds):
                report.outbox_pending += 1
                report.oldest_pending_age = max(report.oldest_pending_age, now - record.updated_at)
                try:
                    idempotency.dispatch_pending(record)
                    report.outbox_dispatched += 1
                except (DispatchUnavailableError, DispatchRejectedError) as error:
                    report.outbox_failed += 1
                    logger.warning("outbox sweep: %s: %s", name, error)
        self.telemetry.outbox_swept(pending=report.outbox_pending,
                                    dispatched=report.outbox_dispatched,
                                    failed=report.outbox_failed,
                                    oldest_age=report.oldest_pending_age)
