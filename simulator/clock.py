"""Virtual time shared by the simulated brokers and the app's services.

The clock starts at the real time and moves only when the simulation moves
it: as the producer's schedule advances, when a host waits for a retry
backoff, or when nothing is left to do but wait for a lock to expire. Lock
durations, dedup leases and the duplicate-detection window therefore keep
their production values (60 s, 300 s, 10 min) without a run taking that
long, and the same run behaves the same on a fast or a slow machine.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator

#: The virtual time a context has slept to, inside `SimClock.overlapping`.
_slept_to: contextvars.ContextVar[tuple[SimClock, float] | None] = contextvars.ContextVar(
    "simclock_slept_to", default=None)


class SimClock:
    """A thread-safe virtual clock in epoch seconds; callable like `time.time`."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by `seconds` (never backward); return the new time."""
        with self._lock:
            if seconds > 0:
                self._now += seconds
            return self._now

    def advance_to(self, when: float) -> float:
        """Move forward to `when` if it is later than now; return the new time."""
        with self._lock:
            if when > self._now:
                self._now = when
            return self._now

    def sleep(self, seconds: float) -> None:
        """A `sleep` for the services: virtual time passes, the thread does not wait.

        Inside `overlapping()` a context sleeps from its own time, so concurrent sleeps
        overlap as they do in real time: the account groups of a batch (copies of the
        invocation's context) each wake at their start plus their own sleeps, and the clock
        moves to the latest wake-up. Elsewhere sleeps add up.
        """
        with self._lock:
            mine = _slept_to.get()
            since = mine[1] if mine is not None and mine[0] is self else self._now
            wake = since + max(0.0, seconds)
            if mine is not None and mine[0] is self:
                _slept_to.set((self, wake))
            self._now = max(self._now, wake)

    @contextlib.contextmanager
    def overlapping(self) -> Iterator[None]:
        """Sleeps in this context (and the tasks and threads it starts) count from now."""
        token = _slept_to.set((self, self._now))
        try:
            yield
        finally:
            _slept_to.reset(token)
