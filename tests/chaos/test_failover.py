"""An event hub recreated, or failed over to a disaster-recovery namespace, mid-run: every
partition's sequence numbers restart at 0 while the app's high-water marks still hold the first
hub's numbers. Under the usual faults (crashes, rebalances, transient errors) every valid event
of both hubs is still applied exactly once: nothing below the old mark is skipped as a replay."""

from __future__ import annotations

import pytest

from simulator.report import format_report
from simulator.scenario import ScenarioConfig, run_scenario


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_a_hub_failover_loses_no_event(chaos_stacks, seed, backend):
    config = ScenarioConfig(backend=backend, seed=seed, messages=0, events=600, consumers=2,
                            partitions=2, fault_rate=0.05, outages=0, duration=60.0,
                            hostile=False, oversize_bytes=0, hub_failovers=1, tag="fo")
    result = run_scenario(config, chaos_stacks[backend])
    report = format_report(result)
    assert result.hub_incarnations == 2, report
    assert result.ok, report
    check = result.check
    assert sum(check.lost.values()) == 0 and sum(check.double_effects.values()) == 0, report
    assert not check.balance_mismatches, report
