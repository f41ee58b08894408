"""Samples of measured work and the figures both modes draw from them.

A sample is one unit of work as the runner timed it: a message (loopback) or
an Event Hubs batch (latency). Every figure of the report is computed here
from samples, so a rate, a ratio or a target always rests on the same counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One unit of work: what it sent and what it cost."""

    requests: int  # data-plane store requests, every attempt on the wire
    resent: int  # of those, sent again after a failed attempt
    seconds: float  # wall time
    cpu: float  # this process's CPU time (the servers and relays are other processes)
    events: int = 1
    accounts: int = 0  # distinct accounts in a payment batch
    sends: int = 0  # dispatcher sends (one round trip each)
    messages: int = 0  # outgoing messages those sends carried

    @property
    def first_attempts(self) -> int:
        return self.requests - self.resent


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def ratio(value: float, base: float) -> float:
    """value / base; NaN when either is missing or the base is zero."""
    if math.isnan(value) or math.isnan(base) or not base:
        return math.nan
    return value / base


@dataclass(frozen=True)
class Figures:
    """What a list of samples adds up to."""

    units: int
    events: int
    seconds: float
    events_per_second: float  # events over the summed wall time: one consumer
    requests: int
    requests_per_unit: float
    requests_min: int  # first attempts, per unit
    requests_max: int
    requests_per_event: float
    cpu_ms_per_event: float
    p50_ms: float  # per unit
    p99_ms: float
    sends_per_event: float
    messages_per_event: float
    resent: int
    transactions_per_event: float = math.nan  # a payment batch's accounts: one transaction each


def figures(samples: Sequence[Sample]) -> Figures:
    events = sum(s.events for s in samples)
    seconds = sum(s.seconds for s in samples)
    requests = sum(s.requests for s in samples)
    first = [s.first_attempts for s in samples]

    def per_event(value: float) -> float:
        return value / events if events else math.nan

    return Figures(
        units=len(samples), events=events, seconds=seconds,
        events_per_second=events / seconds if seconds else math.nan,
        requests=requests, requests_per_unit=mean([s.requests for s in samples]),
        requests_min=min(first, default=0), requests_max=max(first, default=0),
        requests_per_event=per_event(requests),
        cpu_ms_per_event=per_event(sum(s.cpu for s in samples) * 1000),
        p50_ms=percentile([s.seconds for s in samples], 50) * 1000,
        p99_ms=percentile([s.seconds for s in samples], 99) * 1000,
        sends_per_event=per_event(sum(s.sends for s in samples)),
        messages_per_event=per_event(sum(s.messages for s in samples)),
        resent=sum(s.resent for s in samples),
        transactions_per_event=per_event(sum(s.accounts for s in samples)))


@dataclass(frozen=True)
class Comparison:
    """A variant's figures over a reference variant's, same backend and scenario, same run."""

    events_per_second: float
    cpu_per_event: float
    p50: float
    p99: float


def compare(value: Figures, base: Figures) -> Comparison:
    return Comparison(ratio(value.events_per_second, base.events_per_second),
                      ratio(value.cpu_ms_per_event, base.cpu_ms_per_event),
                      ratio(value.p50_ms, base.p50_ms), ratio(value.p99_ms, base.p99_ms))
