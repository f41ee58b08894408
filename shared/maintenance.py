"""Housekeeping for a timer trigger: purge expired records, close abandoned claims.

Records accumulate unless something deletes them (Table Storage has no TTL;
Cosmos expires markers in the background), and a claim whose holder died
stays in progress until a redelivery takes it over. Once the broker can no
longer redeliver, nobody will: the sweep parks such a claim for a person and
closes it, so no record is left in progress forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shared.exceptions import RecordChangedError
from shared.parking import ParkingLot
from shared.stores.base import RecordStore

logger = logging.getLogger(__name__)


@dataclass
class MaintenanceReport:
    purged: dict[str, int] = field(default_factory=dict[str, int])
    parked: int = 0


class Maintenance:
    """Purges expired records and parks in-progress records nobody will finish.

    `grace_seconds` is the redelivery window: a record still in progress that
    long after its lease ran out can no longer be picked up by a redelivery.
    """

    def __init__(self, stores: Mapping[str, RecordStore], parking: ParkingLot, *,
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
                        context={"dedup_store": name})
                    report.parked += 1
                except RecordChangedError as error:  # taken over meanwhile: fine
                    logger.info("stale record changed meanwhile: %s", error)
        logger.info("maintenance done", extra={"event": "MaintenanceRun", "purged": report.purged,
                                               "parked_stale": report.parked})
        return report
