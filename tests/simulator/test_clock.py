"""The virtual clock's sleeps: concurrent ones overlap inside `overlapping()`, as in real time."""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor

from simulator.clock import SimClock


def test_sleeps_outside_overlapping_add_up():
    clock = SimClock(start=100.0)
    for _ in range(3):
        clock.sleep(0.5)
    assert clock() == 101.5


def test_sleeps_in_one_context_add_up_inside_overlapping():
    clock = SimClock(start=100.0)
    with clock.overlapping():
        clock.sleep(0.2)
        clock.sleep(0.4)
    assert clock() == 100.0 + 0.2 + 0.4


def test_concurrent_groups_on_threads_wake_at_the_latest_not_the_sum():
    """Ten account groups each retry twice (0.2 s then 0.4 s): 0.6 s pass, not 6 s."""
    clock = SimClock(start=100.0)

    def group() -> None:
        clock.sleep(0.2)
        clock.sleep(0.4)

    with clock.overlapping(), ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(contextvars.copy_context().run, group) for _ in range(10)]:
            future.result()
    assert abs(clock() - 100.6) < 1e-9


def test_concurrent_groups_as_tasks_wake_at_the_latest_not_the_sum():
    clock = SimClock(start=100.0)

    async def group(seconds: float) -> None:
        clock.sleep(seconds)
        await asyncio.sleep(0)
        clock.sleep(seconds)

    async def batch() -> None:
        await asyncio.gather(*(group(s) for s in (0.1, 0.3, 0.2)))

    with clock.overlapping():
        asyncio.run(batch())
    assert abs(clock() - 100.6) < 1e-9


def test_a_sleep_behind_the_clock_does_not_move_it():
    """Another thread moved time on (a host's retry backoff): a group that started before
    it wakes in the past, and the clock stays where it is."""
    clock = SimClock(start=100.0)
    with clock.overlapping():
        clock.advance(5.0)
        clock.sleep(0.2)
    assert clock() == 105.0
