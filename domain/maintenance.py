"""Housekeeping on a timer: purge expired dedup records, reconcile stale in-progress ones."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shared import IdempotencyStore
from shared.exceptions import RecordChangedError
from shared.parking import ParkingLot

logger = logging.getLogger(__name__)


@dataclass
class MaintenanceReport:
    purged: dict[str, int] = field(default_factory=dict)
    parked: int = 0


class Maintenance:
    """Purges expired records and parks in-progress records nobody will finish.

    A record still in progress `grace` seconds after its lease ran out can no
    longer be picked up by a redelivery (the broker's window has passed), so it
    is parked for a person and closed: no record is left in progress forever.
    """

    def __init__(self, stores: Mapping[str, IdempotencyStore], parking: ParkingLot, *,
                 grace_seconds: float, clock: Callable[[], float]) -> None:
        self.stores = stores
        self.parking = parking
        self.grace_seconds = grace_seconds
        self.clock = clock

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
                        dedup_store=name)
                    report.parked += 1
                except RecordChangedError as error:  # taken over meanwhile: fine
                    logger.info("stale record changed meanwhile: %s", error)
        logger.info("maintenance done", extra={"event": "MaintenanceRun", "purged": report.purged,
                                               "parked_stale": report.parked})
        return report
