"""Clock skew between instances: what a lease tolerates, measured on the real stores, and the
skew the flow notices from the server time a record write answers anyway.

Leases are judged on each instance's own clock (`IdempotencyConfig.clock`). The holder renews
its lease every third of it, so the expiry another instance reads is never less than about two
thirds of a lease ahead of the holder's clock: an instance whose clock runs ahead by less than
that (minus a renewal's round trip) never sees a live lease as expired. The measurement runs the
real two-phase flow (`Idempotency.run`, its renewal thread, the default 54-second lease) against
challengers whose clocks are ahead by fractions of the lease, on Azurite and the Cosmos server.
"""

# Log records carry their `extra` fields as attributes the LogRecord type does not declare.
# pyright: reportAttributeAccessIssue=false
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from shared import DedupKey, Idempotency, IdempotencyConfig, request_hash
from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore
from shared._backends.table_aio import AsyncTableIdempotencyStore
from shared._core.records import IdempotencyRecord, OutcomeStatus
from shared._core.store import IdempotencyStore
from shared._core.telemetry import EVENT_CLOCK_SKEW, METRIC_CLOCK_SKEW, Telemetry
from shared._flows.dedup_steps import CLOCK_SKEW_WARNING_FRACTION
from shared._flows.idempotency import LEASE_RENEWALS
from shared.aio import Idempotency as AsyncIdempotency
from simulator.faults import _Forwarding

LEASE = IdempotencyConfig().lease.total_seconds()  # the default: 54 s
DIGEST = request_hash({"n": 1})
# The estimate's error: Cosmos `_ts` is whole seconds (the store takes the middle: +-0.5 s), a
# Table etag carries 100 ns; plus the request's own time and this machine's load.
RESOLUTION = {"cosmos": 1.0, "table": 0.5}


def skewed(offset: float) -> Callable[[], float]:
    """A clock `offset` seconds off the real one (positive: ahead)."""
    return lambda: time.time() + offset


# -- noticing skew --------------------------------------------------------------------------
def skew_points(reader: InMemoryMetricReader) -> list[Any]:
    data = reader.get_metrics_data()
    return [point for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics for metric in scope.metrics
            if metric.name == METRIC_CLOCK_SKEW for point in metric.data.data_points]


def skew_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith(EVENT_CLOCK_SKEW)]


class SetValues:
    """The gauge, remembering every value set (a gauge exports only the last one)."""

    def __init__(self, gauge: Any) -> None:
        self.gauge = gauge
        self.values: list[float] = []

    def set(self, value: float, attributes: Any = None) -> None:
        self.values.append(value)
        self.gauge.set(value, attributes)


def spied(telemetry: Telemetry) -> SetValues:
    spy = SetValues(telemetry.clock_skew_seconds)
    telemetry.clock_skew_seconds = spy  # a forwarding spy
    return spy


@pytest.fixture
def metrics():
    """A meter provider of the test's own, read in memory (the global one is left alone)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield reader, provider
    provider.shutdown()


@pytest.mark.parametrize("offset", [20.0, -20.0, 0.0, 5.0])
def test_the_skew_of_an_instance_is_measured_from_its_writes_and_warned_above_a_sixth_of_the_lease(
        store: IdempotencyStore, backend: str, offset: float, metrics, caplog):
    """An instance whose clock is `offset` seconds off: the two-phase writes (claim, complete)
    and an atomic commit answer the server's time; the first one is the sample."""
    reader, provider = metrics
    caplog.set_level(logging.WARNING, logger="shared")
    telemetry = Telemetry(meter_provider=provider)
    samples = spied(telemetry)
    idempotency = Idempotency(store, config=IdempotencyConfig(clock=skewed(offset)),
                              telemetry=telemetry)
    idempotency.run(DedupKey("c", "two-phase"), DIGEST, lambda: "done")
    idempotency.run_atomic(DedupKey("c", "atomic"), DIGEST, lambda tx: "done")
    assert len(samples.values) == 1  # sampled: one a minute, not one per write

    [point] = skew_points(reader)
    assert point.attributes == {"backend": store.name}
    assert abs(point.value - offset) <= RESOLUTION[backend], point.value
    threshold = LEASE * CLOCK_SKEW_WARNING_FRACTION
    assert threshold == 9.0
    warnings = skew_warnings(caplog)
    if abs(offset) > threshold:
        [warning] = warnings
        assert warning.backend == store.name
        assert abs(warning.clock_skew_s - offset) <= RESOLUTION[backend]
        assert warning.threshold_s == threshold
        assert ("ahead of" if offset > 0 else "behind") in warning.getMessage()
    else:
        assert warnings == []


def test_every_kind_of_record_write_answers_the_servers_time(store: IdempotencyStore,
                                                             backend: str, metrics):
    """Claim, takeover, renewal, completion and atomic commit each feed the sample (a Telemetry
    that samples every write counts them); a memory store answers none."""
    reader, provider = metrics
    telemetry = Telemetry(meter_provider=provider, clock_skew_sample_seconds=0.0)
    samples = spied(telemetry)
    clock = [time.time()]
    idempotency = Idempotency(store, config=IdempotencyConfig(clock=lambda: clock[0]),
                              telemetry=telemetry)
    key = DedupKey("c", "k")
    _, held = idempotency.claim(key, DIGEST)  # 1: claim
    assert held is not None and held.server_time is not None
    renewed = idempotency.renew(held)  # 2: renewal
    clock[0] += LEASE + 1
    outcome, taken = idempotency.claim(key, DIGEST)  # 3: takeover of the stale claim
    assert outcome.status is OutcomeStatus.TAKEN_OVER and taken is not None
    assert renewed.server_time is not None
    idempotency.complete(taken, "done")  # 4: completion
    clock[0] = time.time()
    idempotency.run_atomic(DedupKey("c", "atomic"), DIGEST, lambda tx: "done")  # 5: commit
    assert len(samples.values) == 5
    assert all(abs(value) < 60 + LEASE for value in samples.values)  # the clock moved by hand
    assert len(skew_points(reader)) == 1


@pytest.mark.parametrize("offset", [30.0, -30.0])
def test_the_async_flow_notices_skew_on_both_servers(stack, cosmos_database, table_service,
                                                     make_store, backend, offset, metrics, caplog):
    reader, provider = metrics
    caplog.set_level(logging.WARNING, logger="shared")
    sync_store = make_store(backend)  # a fresh table / container, deleted after the test

    async def main() -> None:
        if backend == "table":
            store: Any = AsyncTableIdempotencyStore.from_connection_string(
                stack.table_connection_string, table_name=sync_store.client.table_name)
        else:
            store = AsyncCosmosIdempotencyStore(
                stack.cosmos_endpoint, stack.cosmos_key, database=cosmos_database.id,
                container=sync_store.container.id, connection_verify=stack.cosmos_verify)
        try:
            idempotency = AsyncIdempotency(store, config=IdempotencyConfig(clock=skewed(offset)),
                                           telemetry=Telemetry(meter_provider=provider))
            await idempotency.run(DedupKey("c", "k"), DIGEST, lambda: "done")
        finally:
            await store.close()

    asyncio.run(main())
    [point] = skew_points(reader)
    assert abs(point.value - offset) <= RESOLUTION[backend]
    [warning] = skew_warnings(caplog)
    assert abs(warning.clock_skew_s - offset) <= RESOLUTION[backend]


def test_the_warning_is_rate_limited_and_the_sample_costs_a_clock_read(store, metrics, caplog):
    """Many writes of a skewed instance: one point and one WARNING (the next ones wait for
    their interval), so a steady skew costs neither a point nor a record per message."""
    reader, provider = metrics
    caplog.set_level(logging.WARNING, logger="shared")
    telemetry = Telemetry(meter_provider=provider)
    samples = spied(telemetry)
    idempotency = Idempotency(store, config=IdempotencyConfig(clock=skewed(40.0)),
                              telemetry=telemetry)
    for n in range(5):
        idempotency.run(DedupKey("c", f"k{n}"), DIGEST, lambda: "done")
    assert len(samples.values) == 1  # ten writes, one sample
    assert len(skew_points(reader)) == 1
    assert len(skew_warnings(caplog)) == 1


def test_a_store_without_server_time_is_never_sampled(metrics):
    from shared.testing import InMemoryIdempotencyStore

    reader, provider = metrics
    idempotency = Idempotency(InMemoryIdempotencyStore(),
                              config=IdempotencyConfig(clock=skewed(100.0)),
                              telemetry=Telemetry(meter_provider=provider))
    idempotency.run(DedupKey("c", "k"), DIGEST, lambda: "done")
    assert skew_points(reader) == []


# -- what a lease tolerates ---------------------------------------------------------------------
class TimedWrites(_Forwarding):
    """The store, remembering when each record write landed (real time)."""

    def __init__(self, inner: IdempotencyStore) -> None:
        super().__init__(inner)
        self.landed: list[tuple[IdempotencyRecord, float]] = []
        self._lock = threading.Lock()

    def _landed(self, record: IdempotencyRecord) -> None:
        with self._lock:
            self.landed.append((record, time.time()))

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        written = super().put_record_if_absent(record)
        self._landed(record)
        return written

    def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        written = super().replace_record_if_unchanged(record)
        self._landed(record)
        return written


@dataclass
class Trial:
    """One key: a holder on the true clock (or behind it) runs a handler under a renewed
    lease for `WINDOW` seconds; a challenger ahead of it tries to claim the key as soon as its
    own clock says the lease it read has run out, until then."""

    key: DedupKey
    skew: float  # fraction of the lease: challenger ahead by (or holder behind by) skew * LEASE
    holder_behind: bool = False
    claimed: threading.Event = field(default_factory=threading.Event)
    claimed_at: float = 0.0  # real time
    taken_over_at: float | None = None  # seconds after the claim
    holder_status: OutcomeStatus | None = None
    errors: list[BaseException] = field(default_factory=list)

    @property
    def holder_offset(self) -> float:
        return -self.skew * LEASE if self.holder_behind else 0.0

    @property
    def challenger_offset(self) -> float:
        return 0.0 if self.holder_behind else self.skew * LEASE


# Every skew of 0.5 of the lease or more would take the lease over within the window if it were
# not renewed, so "held" is the renewal's doing; the first renewal lands at a third of the lease.
WINDOW = 0.55 * LEASE
# Trials start this far apart, so their renewals do not queue behind each other on a server.
STAGGER = 0.6
CHALLENGER_AHEAD = (0.5, 0.6, 0.65, 0.66, 0.67, 0.68, 0.7)
HOLDER_BEHIND = (0.65, 0.7)


def _hold(store: IdempotencyStore, trial: Trial, delay: float) -> None:
    time.sleep(delay)
    holder = Idempotency(store, config=IdempotencyConfig(clock=skewed(trial.holder_offset)))

    def handler() -> str:
        trial.claimed_at = time.time()
        trial.claimed.set()
        time.sleep(WINDOW)
        return "held"

    try:
        trial.holder_status = holder.run(trial.key, DIGEST, handler).status
    except BaseException as error:  # reported by the test
        trial.errors.append(error)
        trial.claimed.set()


def _challenge(store: IdempotencyStore, trial: Trial) -> None:
    clock = skewed(trial.challenger_offset)
    challenger = Idempotency(store, config=IdempotencyConfig(clock=clock))
    trial.claimed.wait()
    deadline = trial.claimed_at + WINDOW
    try:
        while time.time() < deadline:
            record = store.get_record(trial.key.encoded, trial.key.encoded)
            expires = record.lease_expires_at if record is not None else None
            if expires is not None:
                # Asleep until this instance's clock says the lease it read has run out.
                time.sleep(max(0.0, min(expires - clock(), deadline - time.time())))
            if time.time() >= deadline:
                return
            _, held = challenger.claim(trial.key, DIGEST)
            if held is not None:
                trial.taken_over_at = time.time() - trial.claimed_at
                challenger.complete(held, "challenger")
                return
            time.sleep(0.01)  # renewed meanwhile: read the new expiry
    except BaseException as error:  # reported by the test
        trial.errors.append(error)


def _tolerance(timed: TimedWrites, trial: Trial) -> float:
    """The largest clock difference the holder's lease withstood, from when its writes landed:
    each lease (expiring at E on the holder's clock) was the stored one until the next write
    landed (real time T); a clock ahead of the holder's by d sees it expired once
    t + holder offset + d >= E for some t < T, so the lease withstood any d < E - offset - T.
    The minimum over the run, in seconds."""
    writes = [(record, landed) for record, landed in timed.landed if record.key == trial.key]
    return min(record.lease_expires_at - trial.holder_offset - next_landed
               for (record, _), (_, next_landed) in itertools.pairwise(writes)
               if record.lease_expires_at is not None)


def test_a_live_lease_withstands_clocks_apart_by_less_than_two_thirds_of_it(
        make_store, capsys):
    """The default lease (54 s) renewed every third of it, on Azurite and the Cosmos server
    at once (about 35 s): a challenger whose clock is ahead by up to 0.65 of the lease never
    takes a live lease over; ahead by 0.68 or more it does, before the first renewal lands;
    a holder whose clock is behind is the same case seen from the other side. The tolerance
    is also computed from when the holder's writes landed."""
    assert LEASE == 54.0 and LEASE_RENEWALS == 3
    stores = {backend: TimedWrites(make_store(backend)) for backend in ("table", "cosmos")}
    trials = {backend: [*(Trial(DedupKey("lease", f"{backend}-ahead-{s}"), s)
                          for s in CHALLENGER_AHEAD),
                        *(Trial(DedupKey("lease", f"{backend}-behind-{s}"), s, holder_behind=True)
                          for s in HOLDER_BEHIND)]
              for backend in stores}
    threads = [thread
               for backend, store in stores.items()
               for n, trial in enumerate(trials[backend])
               for thread in (threading.Thread(target=_hold, args=(store, trial, n * STAGGER)),
                              threading.Thread(target=_challenge, args=(store, trial)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WINDOW + len(CHALLENGER_AHEAD + HOLDER_BEHIND) * STAGGER + 30)

    report = []
    for backend, store in stores.items():
        for trial in trials[backend]:
            assert trial.errors == [], (backend, trial.skew, trial.errors)
            taken = trial.taken_over_at is not None
            side = "holder behind" if trial.holder_behind else "challenger ahead"
            report.append(f"{backend:6} {side:16} {trial.skew:5.3f} L ({trial.skew * LEASE:5.2f} s): "
                          + (f"taken over {trial.taken_over_at:5.2f} s after the claim" if taken
                             else "held"))
            if trial.skew <= 0.65:
                assert not taken, report[-1]
                assert trial.holder_status is OutcomeStatus.PROCESSED
            if trial.skew >= 0.68:
                assert taken, report[-1]
                assert trial.taken_over_at is not None and trial.taken_over_at < LEASE / 3 + 1
                assert trial.holder_status is OutcomeStatus.LEASE_LOST
        held = [t for t in trials[backend] if t.taken_over_at is None]
        tolerance = min(_tolerance(store, t) for t in held)
        report.append(f"{backend:6} tolerance from the writes' landing times: {tolerance:.2f} s = "
                      f"{tolerance / LEASE:.4f} of the lease")
        assert 0.65 * LEASE < tolerance < (1 - 1 / LEASE_RENEWALS) * LEASE
    with capsys.disabled():
        print("\n" + "\n".join(report))
