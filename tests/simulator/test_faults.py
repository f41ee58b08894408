"""Fault injection around the real stores: crashes, timeouts, the counter-proof variants."""

from __future__ import annotations

import time

import pytest

from shared import DedupKey, Idempotency, OutcomeStatus, request_hash
from shared._core.exceptions import StoreRequestError, StoreUnavailableError
from shared._core.store import WriteOp
from simulator.clock import SimClock
from simulator.faults import (
    DedupOffStore,
    FakeNotificationApi,
    Fault,
    FaultKind,
    FaultLog,
    FaultPlan,
    FaultySender,
    FaultyStore,
    Invocation,
    NonAtomicStore,
    OutageController,
    SimulatedCrash,
    invocation,
)


def faulty(store, fault=None, log=None):
    log = log or FaultLog()
    return FaultyStore(store, label="test", server="test"), Invocation("fn", fault, log), log


def key(n="k"):
    return DedupKey("consumer", n)


def test_crash_before_the_claim_writes_nothing(store):
    wrapped, inv, log = faulty(store, Fault(FaultKind.CRASH_BEFORE_CLAIM))
    with invocation(inv), pytest.raises(SimulatedCrash):
        Idempotency(wrapped).run(key(), request_hash("x"), lambda: 1)
    outcome = Idempotency(store).run(key(), request_hash("x"), lambda: 2)
    assert outcome.status is OutcomeStatus.PROCESSED and outcome.result == 2
    assert log.counts() == {FaultKind.CRASH_BEFORE_CLAIM.value: 1}


def test_crash_after_the_claim_leaves_it_in_progress_and_no_cleanup_reaches_the_store(store, clock):
    wrapped, inv, _ = faulty(store, Fault(FaultKind.CRASH_AFTER_CLAIM))
    calls = []
    with invocation(inv), pytest.raises(SimulatedCrash):
        Idempotency(wrapped).run(key(), request_hash("x"), lambda: calls.append(1))
    assert calls == [] and inv.dead
    # The dead process released nothing: a redelivery finds the key in progress.
    assert Idempotency(store).run(key(), request_hash("x"), lambda: 1).status is OutcomeStatus.IN_PROGRESS


def test_timeout_after_the_write_applied_reports_unavailable_but_the_write_is_there(store):
    wrapped, inv, _ = faulty(store, Fault(FaultKind.TIMEOUT, at=1))
    marker = Idempotency(wrapped)
    with invocation(inv), pytest.raises(StoreUnavailableError):
        marker.run_atomic(key(), request_hash("x"), lambda tx: tx.create("doc", {"v": 1}) or 1,
                          partition="p1")
    again = Idempotency(store).run_atomic(key(), request_hash("x"), lambda tx: 1, partition="p1")
    assert again.status is OutcomeStatus.DUPLICATE


def test_transient_error_fails_before_the_server_sees_the_request(store):
    wrapped, inv, _ = faulty(store, Fault(FaultKind.TRANSIENT, at=1))
    with invocation(inv), pytest.raises(StoreUnavailableError) as error:
        Idempotency(wrapped).run(key(), request_hash("x"), lambda: 1)
    assert error.value.status_code in (429, 503)
    assert Idempotency(store).run(key(), request_hash("x"), lambda: 1).status is OutcomeStatus.PROCESSED


def test_no_invocation_means_no_faults(store):
    wrapped, _, log = faulty(store, Fault(FaultKind.CRASH_BEFORE_CLAIM))
    assert Idempotency(wrapped).run(key(), request_hash("x"), lambda: 1).status is OutcomeStatus.PROCESSED
    assert log.total() == 0


def test_dedup_off_answers_every_claim_as_new(store):
    off = DedupOffStore(store)
    statuses = [Idempotency(off).run(key(), request_hash("x"), lambda: 1).status for _ in range(3)]
    assert statuses == [OutcomeStatus.PROCESSED] * 3
    atomic = [Idempotency(off).run_atomic(key("a"), request_hash("x"),
                                          lambda tx: tx.create("line", {"v": 1}) or 1,
                                          partition="p2").status for _ in range(2)]
    assert atomic == [OutcomeStatus.PROCESSED] * 2


def test_non_atomic_effect_first_crash_between_steps_leaves_an_effect_without_its_marker(store):
    broken = FaultyStore(NonAtomicStore(store, "effect-first"), label="t", server="t")
    inv = Invocation("fn", Fault(FaultKind.CRASH_BETWEEN_STEPS), FaultLog())
    with invocation(inv), pytest.raises(SimulatedCrash):
        Idempotency(broken).run_atomic(key("n"), request_hash("x"),
                                       lambda tx: tx.create("effect", {"v": 1}) or 1, partition="p3")
    assert store.read_document("p3", "effect") is not None  # the effect happened
    # ... and the key was not recorded, so a redelivery applies it again.
    redelivery = Idempotency(broken).run_atomic(
        key("n"), request_hash("x"), lambda tx: tx.upsert("effect2", {"v": 2}) or 2, partition="p3")
    assert redelivery.status is OutcomeStatus.PROCESSED


def test_non_atomic_marker_first_crash_loses_the_effect(store):
    broken = FaultyStore(NonAtomicStore(store, "marker-first"), label="t", server="t")
    inv = Invocation("fn", Fault(FaultKind.CRASH_BETWEEN_STEPS), FaultLog())
    with invocation(inv), pytest.raises(SimulatedCrash):
        Idempotency(broken).run_atomic(key("m"), request_hash("x"),
                                       lambda tx: tx.create("effect", {"v": 1}) or 1, partition="p4")
    assert store.read_document("p4", "effect") is None
    assert Idempotency(store).run_atomic(key("m"), request_hash("x"), lambda tx: 1,
                                         partition="p4").status is OutcomeStatus.DUPLICATE


def test_proxy_outage_fails_calls_for_its_stretch(store):
    log = FaultLog()
    outages = OutageController(log, duration=60)
    wrapped = FaultyStore(store, label="t", server="azurite", outages=outages)
    outages.start("azurite")
    inv = Invocation("fn", None, log)
    with invocation(inv), pytest.raises(StoreUnavailableError):
        wrapped.write_documents("p5", [WriteOp("upsert", "d", {"v": 1})])
    assert outages.history == [("azurite", "proxy", 60)]


def test_fail_fast_outage_lasts_its_stretch_of_the_simulations_clock(store):
    clock = SimClock(1000.0)
    log = FaultLog()
    outages = OutageController(log, duration=20, mode="fail-fast", clock=clock)
    wrapped = FaultyStore(store, label="t", server="cosmos", outages=outages)
    outages.start("cosmos")
    with invocation(Invocation("payments", None, log)):
        for _ in range(3):  # no wall time passes in between: the clock decides
            with pytest.raises(StoreUnavailableError) as raised:
                wrapped.read_document("p6", "d")
            assert raised.value.status_code == 503
        clock.advance(19.9)
        with pytest.raises(StoreUnavailableError):
            wrapped.read_document("p6", "d")
        clock.advance(0.2)
        assert wrapped.read_document("p6", "d") is None  # over: the store answers again
    assert outages.history == [("cosmos", "fail-fast", 20)]
    assert outages.failed_calls == {"cosmos: payments": 4}
    assert not outages.active("cosmos")


def test_an_outage_that_meets_a_function_begins_at_its_next_store_call(store):
    log = FaultLog()
    outages = OutageController(log, duration=60, meets=("payments",))
    wrapped = FaultyStore(store, label="t", server="azurite", outages=outages)
    outages.start("azurite")
    with invocation(Invocation("orders", None, log)):
        assert wrapped.read_document("p8", "d") is None  # armed, not begun: orders passes
    assert outages.history == [] and not outages.active("azurite")
    with invocation(Invocation("payments", None, log)), pytest.raises(StoreUnavailableError):
        wrapped.read_document("p8", "d")
    assert outages.history == [("azurite", "proxy", 60)]
    assert outages.failed_calls == {"azurite: payments": 1}


def test_outages_meet_their_functions_in_turn_and_never_overlap(store):
    log = FaultLog()
    clock = SimClock()
    outages = OutageController(log, duration=20, mode="fail-fast", clock=clock,
                               meets=("payments", "orders"))
    wrapped = FaultyStore(store, label="t", server="azurite", outages=outages)
    outages.start("azurite")
    outages.start("azurite")  # both armed before either began
    with invocation(Invocation("orders", None, log)), pytest.raises(StoreUnavailableError):
        wrapped.read_document("p9", "d")  # the second outage meets orders: it begins
    with invocation(Invocation("payments", None, log)), pytest.raises(StoreUnavailableError):
        wrapped.read_document("p9", "d")  # failed by the first; the payments one waits
    assert outages.history == [("azurite", "fail-fast", 20)]
    clock.advance(20.1)
    with invocation(Invocation("payments", None, log)), pytest.raises(StoreUnavailableError):
        wrapped.read_document("p9", "d")  # over: now the payments outage begins
    assert outages.history == [("azurite", "fail-fast", 20)] * 2
    assert outages.failed_calls == {"azurite: orders": 1, "azurite: payments": 2}

def test_pause_mode_refuses_a_server_the_harness_did_not_start():
    outages = OutageController(FaultLog(), mode="pause")
    with pytest.raises(RuntimeError):
        outages.start("cosmos")
    with pytest.raises(ValueError):
        OutageController(FaultLog(), mode="sometimes")


def test_transient_as_permanent_misreads_a_503_as_a_rejection(store):
    log = FaultLog()
    wrapped = FaultyStore(store, label="t", server="t", transient_as_permanent=True)
    with invocation(Invocation("orders", Fault(FaultKind.TRANSIENT), log)), \
            pytest.raises(StoreRequestError) as raised:
        wrapped.read_document("p7", "d")
    assert raised.value.status_code == 400 and not isinstance(raised.value, StoreUnavailableError)
    assert log.counts() == {FaultKind.TRANSIENT.value: 1}


def test_fault_plan_is_deterministic_per_seed_and_respects_rates():
    plan = FaultPlan(7, fault_rate=0.2, duplicate_rate=0.25)
    table = plan.service_bus("two_phase")
    draws = [plan.draw(f"k{n}", table) for n in range(2000)]
    assert draws == [FaultPlan(7, fault_rate=0.2, duplicate_rate=0.25).draw(f"k{n}", table)
                     for n in range(2000)]
    rate = sum(d is not None for d in draws) / len(draws)
    assert 0.23 < rate < 0.33  # 0.2 faults + 0.25 * 0.3 duplicate sources
    assert {d.kind for d in draws if d} >= {FaultKind.SENDER_TIMEOUT, FaultKind.LOCK_EXPIRY}
    quiet = FaultPlan(7, fault_rate=0, duplicate_rate=0)
    assert all(quiet.draw(f"k{n}", quiet.event_hubs()) is None for n in range(500))


def test_sender_faults_and_the_api_log():
    api = FakeNotificationApi(honours_key=True)
    sender = FaultySender(api)
    headers = {"Idempotency-Key": "notify|n-1"}
    body = b'{"channel": "notify", "notificationId": "n-1"}'
    with invocation(Invocation("notify", Fault(FaultKind.SENDER_ERROR), FaultLog())):
        assert sender("u", body, headers).status == 503
    assert api.calls == []
    with invocation(Invocation("notify", Fault(FaultKind.SENDER_TIMEOUT), FaultLog())), \
            pytest.raises(Exception, match="timed out"):
        sender("u", body, headers)
    assert sender("u", body, headers).status == 200  # replayed: the API knows the key
    assert [c.new_effect for c in api.calls] == [True, False]


def test_every_store_the_app_uses_comes_from_the_factory_seam():
    """The simulator injects faults through build_services' store factory: every role the
    services use is asked for there, so no store escapes the fault wrappers."""
    from functions.services import build_services
    from functions.settings import STORE_ROLES, Settings
    from shared.testing import InMemoryIdempotencyStore

    asked: list[str] = []

    def factory(role):
        asked.append(role)
        return FaultyStore(InMemoryIdempotencyStore(), label=role, server="memory")

    settings = Settings.from_env({"DEDUP_BACKEND": "table", "TABLE_CONNECTION_STRING": "unused",
                                  "NOTIFICATION_API_URL": "http://127.0.0.1:1/n"})
    services = build_services(settings, stores=factory, sender=FakeNotificationApi())
    assert sorted(asked) == sorted(STORE_ROLES)
    assert all(isinstance(store, FaultyStore) for store in services.stores.values())
    assert services.parking.store is services.stores["parked"]
    assert services.async_stores["orders"].sync is services.stores["orders"]
    assert services.orders.consumer.store is services.async_stores["orders"]
    assert services.notify.idempotency.store is services.async_stores["notifications"]


def test_calls_during_a_pause_are_counted_failed_or_held(store):
    log = FaultLog()
    outages = OutageController(log, duration=60, mode="auto")
    outages._paused_until["azurite"] = time.monotonic() + 60  # as start() does for a pause
    wrapped = FaultyStore(store, label="t", server="azurite", outages=outages)
    with invocation(Invocation("orders", None, log)):
        assert wrapped.read_document("p8", "d") is None  # answered (after the pause, in life)
    assert outages.held_calls == {"azurite: orders": 1} and not outages.failed_calls
