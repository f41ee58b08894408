"""The outbox under the chaos harness: what `orders` commits is delivered to notify and audit
through the simulated broker, once each, whatever happens between the commit and the
dispatch; and the two ways of publishing without an outbox are caught."""

from __future__ import annotations

import pytest

from simulator.faults import FaultKind
from simulator.report import format_report
from simulator.scenario import ScenarioConfig, run_scenario

OUTBOX_FAULTS = (FaultKind.CRASH_BEFORE_DISPATCH, FaultKind.CRASH_MID_DISPATCH,
                 FaultKind.DISPATCH_TIMEOUT, FaultKind.BROKER_OUTAGE)


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_every_committed_order_is_announced_once_per_subscription_through_dispatch_faults(
        chaos_stacks, seed, backend):
    config = ScenarioConfig(backend=backend, seed=seed, messages=400, events=60,
                            fault_rate=0.6, outages=0, hostile=False, oversize_bytes=0,
                            tag="ob1")
    result = run_scenario(config, chaos_stacks[backend])
    report = format_report(result)
    assert result.ok, report
    for kind in OUTBOX_FAULTS:
        assert result.faults.get(kind.value, 0) > 0, (kind, report)
    check = result.check
    orders = check.effects["order"]
    assert orders > 0
    for channel in ("notify", "audit"):
        assert check.effects[f"OrderAccepted ({channel})"] == orders, report
    assert not check.phantoms and check.outbox_pending == 0, report


def test_publishing_before_the_commit_is_caught(chaos_stacks, seed):
    config = ScenarioConfig(backend="table", seed=seed, messages=300, events=60, fault_rate=0.3,
                            outages=0, hostile=False, oversize_bytes=0, publish="before-commit",
                            tag="ob2")
    result = run_scenario(config, chaos_stacks["table"])
    report = format_report(result)
    assert not result.ok, report
    check = result.check
    doubles = sum(n for k, n in check.double_effects.items() if k.startswith("OrderAccepted"))
    assert check.phantoms or doubles, report


def test_publishing_after_the_commit_without_the_outbox_is_caught_as_lost(chaos_stacks, seed):
    config = ScenarioConfig(backend="cosmos", seed=seed, messages=300, events=60, fault_rate=0.3,
                            outages=0, hostile=False, oversize_bytes=0, publish="after-commit",
                            tag="ob3")
    result = run_scenario(config, chaos_stacks["cosmos"])
    report = format_report(result)
    assert not result.ok, report
    assert any(k.startswith("OrderAccepted") for k in result.check.lost), report
