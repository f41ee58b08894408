"""The simulated host around the real functions, one scripted fault at a time."""

from __future__ import annotations

from collections import Counter

import pytest

from local_stack.worker import WorkerHost
from simulator.faults import Fault, FaultKind, FaultPlan
from simulator.host import registered_functions, resolve, worker_host
from simulator.scenario import Endpoints, ScenarioConfig, run_scenario
from simulator.workload import generate


class ScriptedPlan(FaultPlan):
    """No random faults: `script` maps an invocation-key prefix to the fault it gets."""

    def __init__(self, script: dict[str, Fault]) -> None:
        super().__init__(0, fault_rate=0, duplicate_rate=0)
        self.script = script

    def draw(self, key, table, *, calls=2):
        for prefix, fault in self.script.items():
            if key.startswith(prefix):
                return fault
        return None


@pytest.fixture
def stack(sim_endpoints):
    """The harness's own servers (see conftest), in place of the session stack."""
    return sim_endpoints


def endpoints_of(stack) -> Endpoints:
    return Endpoints(stack.table_connection_string, stack.cosmos_endpoint, stack.cosmos_key,
                     stack.cosmos_verify)


def small(kind: str, tag: str, *, messages: int = 12, events: int = 0):
    config = ScenarioConfig(backend="table", seed=5, messages=messages, events=events,
                            duplicate_rate=0, fault_rate=0, outages=0, tag=tag)
    workload = generate(seed=5, messages=messages, events=events, duplicate_rate=0,
                        run_id=config.run_id)
    item = next(i for i in workload.items if i.kind == kind and i.expect == "effect")
    return config, workload, item


def test_functions_and_retry_policy_come_from_the_workers_metadata():
    functions = registered_functions()
    assert set(functions) == {"orders", "order_status", "notify", "audit", "payments",
                              "balance_projection", "http_payments", "maintenance", "order_audit"}
    retry = functions["payments"].retry
    assert (retry.strategy, retry.max_retry_count) == ("exponential_backoff", -1)
    assert [retry.interval(n) for n in (1, 2, 7)] == [5.0, 10.0, 300.0]
    assert functions["orders"].retry is None
    assert resolve(functions["orders"].trigger["queueName"], {"ORDERS_QUEUE_NAME": "q"}) == "q"
    assert all(status.ok for status in worker_host().loads.values())


def test_every_delivery_is_an_invocation_request_into_the_worker(stack, monkeypatch):
    config, workload, _ = small("order", "h0", messages=12, events=30)
    invoked: Counter[str] = Counter()
    real_invoke = WorkerHost.invoke

    def spy(self, function, *args, **kwargs):
        invoked[function] += 1
        return real_invoke(self, function, *args, **kwargs)

    monkeypatch.setattr(WorkerHost, "invoke", spy)
    result = run_scenario(config, endpoints_of(stack), plan=ScriptedPlan({}), workload=workload)
    assert result.ok, result.check.invariants
    service_bus = {name: n for name, n in result.stats.deliveries.items() if name != "payments"}
    assert {name: invoked[name] for name in service_bus} == service_bus
    assert invoked["payments"] == result.stats.batches > 0
    settled = sum(n for outcome, n in result.stats.outcomes.items()
                  if outcome.split(": ")[1].startswith(("complete", "deadletter", "abandon")))
    assert settled == sum(service_bus.values())  # every delivery settled through the gRPC server


def test_crash_after_the_commit_is_redelivered_after_the_lock_expires_and_absorbed(stack):
    config, workload, order = small("order", "h1")
    plan = ScriptedPlan({f"sb|orders|{order.logical}|0|0|1": Fault(FaultKind.CRASH_AFTER_CLAIM)})
    result = run_scenario(config, endpoints_of(stack), plan=plan, workload=workload)
    assert result.ok, result.check.invariants
    assert result.stats.outcomes["orders: crash"] == 1
    assert result.stats.duplicates["redelivery"] == 1  # delivery 2, after the 60 s lock
    assert result.virtual_seconds >= config.lock_duration


def test_lock_lost_mid_processing_gives_a_concurrent_copy_and_one_effect(stack):
    config, workload, order = small("order", "h2")
    plan = ScriptedPlan({f"sb|orders|{order.logical}|0|0|1": Fault(FaultKind.LOCK_EXPIRY)})
    result = run_scenario(config, endpoints_of(stack), plan=plan, workload=workload)
    assert result.ok, result.check.invariants
    assert result.faults == {FaultKind.LOCK_EXPIRY.value: 1}
    assert result.stats.duplicates["concurrent copy"] == 1
    assert result.stats.lock_lost_settlements == 1  # the slow consumer could not complete


def test_notification_that_died_mid_call_is_never_lost(stack):
    config, workload, note = small("notification", "h3")
    plan = ScriptedPlan({f"sb|notifications/subscriptions/notify|{note.logical}|0|0|1":
                         Fault(FaultKind.CRASH_AFTER_CLAIM)})
    result = run_scenario(config, endpoints_of(stack), plan=plan, workload=workload)
    assert result.ok, result.check.invariants
    # The claim stays in progress for its lease (300 s). Each redelivery finds it busy and
    # leaves the message unsettled (abandoning would redeliver at once and burn the delivery
    # count); it comes back after the 60 s lock, and once the lease ran out the stale claim
    # is taken over and the notification sent, once, with the same Idempotency-Key.
    assert result.check.dead_lettered["notify: MaxDeliveryCountExceeded"] == 0
    deliveries = [t for t in result.stats.trace if t[0] == "notify" and t[1] == note.logical]
    assert 2 <= len(deliveries) < config.max_delivery_count


def test_event_hubs_crash_before_checkpoint_replays_and_the_mark_absorbs_it(stack):
    config, workload, _ = small("payment", "h4", messages=0, events=30)
    plan = ScriptedPlan({"eh|": Fault(FaultKind.CRASH_BEFORE_ACK)})

    class FirstBatchOnly(ScriptedPlan):
        fired = False

        def draw(self, key, table, *, calls=2):
            if key.startswith("eh|") and not FirstBatchOnly.fired:
                FirstBatchOnly.fired = True
                return Fault(FaultKind.CRASH_BEFORE_ACK)
            return None

    plan = FirstBatchOnly({})
    result = run_scenario(config, endpoints_of(stack), plan=plan, workload=workload)
    assert result.ok, result.check.invariants
    assert result.stats.duplicates["checkpoint replay"] > 0
    assert result.check.effects["payment"] == sum(1 for i in workload.items if i.expect == "effect")


@pytest.mark.parametrize("kind", [FaultKind.SENDER_TIMEOUT, FaultKind.CRASH_AFTER_EFFECT])
def test_notification_api_sees_the_same_idempotency_key_on_a_resend(stack, kind):
    config, workload, note = small("notification", f"h5{kind.name[:3].lower()}")
    plan = ScriptedPlan({f"sb|notifications/subscriptions/audit|{note.logical}|0|0|1": Fault(kind)})
    result = run_scenario(config, endpoints_of(stack), plan=plan, workload=workload)
    assert result.ok, result.check.invariants
    assert result.check.effects["notification (audit)"] >= 1


def test_api_without_idempotency_keys_gets_no_second_send_after_a_timeout(stack):
    """A timeout after the API accepted: the claim is kept and parked, never re-sent."""
    config, workload, note = small("notification", "h6")
    config.api_honours_key = False
    plan = ScriptedPlan({f"sb|notifications/subscriptions/notify|{note.logical}|0|0|1":
                         Fault(FaultKind.SENDER_TIMEOUT)})
    result = run_scenario(config, endpoints_of(stack), plan=plan, workload=workload)
    assert result.check.double_effects["notification (notify)"] == 0
