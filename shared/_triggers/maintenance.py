"""Housekeeping for a timer trigger: purge expired records, close abandoned claims, dispatch
outgoing messages no redelivery will.

Table Storage has no TTL, and a claim whose holder died stays in progress until a redelivery
takes it over; once the broker can no longer redeliver, the sweep parks such a claim for a
person and closes it, so no record is left in progress forever. A run shares a time budget
(default half the host's function timeout) among the stores; a store's unfinished scan resumes
on the next run, and stores on one table are swept once.

The outbox sweep dispatches and records, as a copy of the incoming message would, the messages
of markers pending longer than `outbox_age_seconds` (the incoming message expired, or the
instance died on its last delivery); `iter_pending` costs what the pending markers do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from shared._core.exceptions import DispatchRejectedError, DispatchUnavailableError, RecordChangedError
from shared._core.records import IdempotencyRecord
from shared._core.store import RecordStore
from shared._core.sweep import DEFAULT_BUDGET_SECONDS, SweepReport, Timer
from shared._core.telemetry import Telemetry
from shared._flows.parking import ParkingLot

logger = logging.getLogger(__name__)


@runtime_checkable
class SharedCollection(Protocol):
    """A store that can name the collection it keeps records in (two stores on one table
    share one sweep and its cursor)."""

    @property
    def sweep_scope(self) -> str: ...


@dataclass
class MaintenanceReport:
    purged: dict[str, int] = field(default_factory=dict[str, int])
    parked: int = 0
    sweeps: dict[str, SweepReport] = field(default_factory=dict[str, SweepReport])
    outbox_pending: int = 0  # markers found pending past the age
    outbox_dispatched: int = 0  # of them, dispatched and recorded now
    outbox_failed: int = 0  # of them, whose dispatch failed (still pending: next sweep)
    oldest_pending_age: float = 0.0  # seconds, of the oldest found


class Maintenance:
    """Purges expired records and parks in-progress records nobody will finish.

    `grace_seconds` is the redelivery window: a record still in progress that long after its
    lease ran out can no longer be picked up by a redelivery. `budget_seconds` bounds one run
    (`timer` measures it). `outbox` names the consumers that send (name -> a sync
    `Idempotency` with its dispatcher).
    """

    def __init__(self, stores: Mapping[str, RecordStore], parking: ParkingLot, *,
                 grace_seconds: float, clock: Callable[[], float],
                 budget_seconds: float = DEFAULT_BUDGET_SECONDS,
                 timer: Timer = time.monotonic, outbox: Mapping[str, Any] | None = None,
                 outbox_age_seconds: float = 600.0, telemetry: Telemetry | None = None) -> None:
        self.stores = stores
        self.parking = parking
        self.grace_seconds = grace_seconds
        self.clock = clock
        self.budget_seconds = budget_seconds
        self.timer = timer
        self.outbox: Mapping[str, Any] = outbox or {}
        self.outbox_age_seconds = outbox_age_seconds
        self.telemetry = telemetry or Telemetry()

    def _distinct_stores(self) -> list[tuple[str, RecordStore]]:
        """One store per collection: two roles on one table would scan it twice."""
        seen: set[object] = set()
        distinct: list[tuple[str, RecordStore]] = []
        for name, store in self.stores.items():
            scope = store.sweep_scope if isinstance(store, SharedCollection) else id(store)
            if scope not in seen:
                seen.add(scope)
                distinct.append((name, store))
        return distinct

    def run(self) -> MaintenanceReport:
        report = MaintenanceReport()
        now = self.clock()
        started = self.timer()
        stores = self._distinct_stores()
        for index, (name, store) in enumerate(stores):
            # An equal share of what is left, so one large store cannot starve the others.
            left = self.budget_seconds - (self.timer() - started)
            share = max(0.0, left) / (len(stores) - index)

            def park(record: IdempotencyRecord, name: str = name, store: RecordStore = store) -> None:
                try:
                    self.parking.park_record(
                        store, record, reason="StaleInProgress", payload=record.key.key,
                        error="in progress past its lease and the redelivery window", now=now,
                        context={"dedup_store": name})
                    report.parked += 1
                except RecordChangedError as error:  # taken over meanwhile: fine
                    logger.info("stale record changed meanwhile: %s", error)

            sweep = store.sweep(now, stale_before=now - self.grace_seconds, on_stale=park,
                                budget_seconds=share, timer=self.timer)
            report.sweeps[name] = sweep
            report.purged[name] = sweep.purged
        self.sweep_outbox(report, now)
        logger.info("maintenance done", extra={
            "event": "MaintenanceRun", "purged": report.purged, "parked_stale": report.parked,
            "rows_read": {name: s.rows_read for name, s in report.sweeps.items()},
            "unfinished": sorted(name for name, s in report.sweeps.items() if not s.complete),
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
