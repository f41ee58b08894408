"""Dedup configuration and the retention rule: a record outlives every redelivery of its message."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from shared._core.exceptions import RetentionConfigError

DEFAULT_TTL = timedelta(days=7)


@dataclass(frozen=True)
class RedeliveryWindow:
    """How long after first processing the broker can still deliver a copy: each of
    `max_delivery_count` deliveries holds the message for the lock duration (or the auto lock
    renewal), plus a margin for copies that wait in the queue and operator resubmissions."""

    lock_duration: timedelta = timedelta(minutes=1)
    max_delivery_count: int = 10
    max_auto_lock_renewal: timedelta = timedelta(minutes=5)
    margin: timedelta = timedelta(days=1)

    @property
    def length(self) -> timedelta:
        per_attempt = max(self.lock_duration, self.max_auto_lock_renewal)
        return per_attempt * self.max_delivery_count + self.margin


def validate_retention(ttl: timedelta, window: RedeliveryWindow) -> None:
    """Refuse a TTL that would let a record expire while a copy can still arrive."""
    if window.max_delivery_count < 1:
        raise RetentionConfigError("max delivery count must be at least 1")
    if ttl < window.length:
        raise RetentionConfigError(
            f"dedup TTL {ttl} is shorter than the redelivery window {window.length} "
            f"(max(lock {window.lock_duration}, lock renewal {window.max_auto_lock_renewal}) "
            f"x {window.max_delivery_count} deliveries + margin {window.margin}); a copy "
            "delivered after the record expired would be processed again"
        )


@dataclass(frozen=True)
class IdempotencyConfig:
    """Options of the dedup flow. Keyword-only, with safe defaults."""

    ttl: timedelta = DEFAULT_TTL
    # The two-phase lease. Tie it to the message lock: a little shorter than the lock, so a
    # crashed holder's key is free when the broker redelivers; renewed while the handler runs
    # (every lease/3, for at most `max_lease_renewal`, as the host renews the lock).
    lease: timedelta = timedelta(seconds=54)
    max_lease_renewal: timedelta = timedelta(minutes=5)
    max_result_bytes: int = 16 * 1024
    max_commit_attempts: int = 5
    clock: Callable[[], float] = field(default=time.time, compare=False)
    window: RedeliveryWindow | None = None

    def __post_init__(self) -> None:
        if self.lease <= timedelta(0):
            raise ValueError("lease must be positive")
        if self.ttl <= self.lease:
            raise RetentionConfigError(f"TTL {self.ttl} must be longer than the lease {self.lease}")
        if self.window is not None:
            validate_retention(self.ttl, self.window)
