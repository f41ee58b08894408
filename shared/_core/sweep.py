"""What one maintenance run may cost: a time budget, and the report of a bounded sweep.

A sweep deletes expired records and hands claims abandoned in progress to a handler (the
parking lot). Table Storage reads every row to filter, so a run stops at its budget and the next
resumes where it stopped; a run never holds more than one page.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from shared._core.records import IdempotencyRecord, RecordState

#: Half of host.json's functionTimeout (10 minutes): a run stops well before the host kills it.
DEFAULT_BUDGET_SECONDS = 300.0
#: The Table service's largest page (it may answer fewer rows and a continuation).
DEFAULT_PAGE_SIZE = 1000

#: Called with each record still in progress past the stale cut-off (parks and closes it).
StaleHandler = Callable[[IdempotencyRecord], None]
Timer = Callable[[], float]


@dataclass
class SweepReport:
    """One sweep of one store: what it deleted, handed on and read, and whether it finished."""

    purged: int = 0
    stale: int = 0  # records handed to the stale handler
    rows_read: int = 0  # rows the store returned to the client (after the service's filter)
    pages: int = 0
    complete: bool = True  # False: the budget ran out; the next run resumes the scan
    restarted: bool = False  # a stored continuation was unusable: the scan began again


class Deadline:
    """A time budget on a monotonic timer (injectable, so tests can spend it by hand)."""

    def __init__(self, budget_seconds: float, *, timer: Timer = time.monotonic) -> None:
        self.timer = timer
        self.ends = timer() + budget_seconds

    def passed(self) -> bool:
        return self.timer() >= self.ends


def is_stale(record: IdempotencyRecord, stale_before: float) -> bool:
    """In progress, and its lease ran out before `stale_before`."""
    return (record.state is RecordState.IN_PROGRESS and record.lease_expires_at is not None
            and record.lease_expires_at < stale_before)


def is_expired(record: IdempotencyRecord, now: float) -> bool:
    return record.expires_at is not None and record.expires_at < now
