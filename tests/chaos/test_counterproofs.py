"""Proof that the harness can fail: the same checks catch a consumer without dedup and a
consumer that writes its marker in a separate step (harness flags; the app is unchanged)."""

from __future__ import annotations

import json

from demo.__main__ import main as demo_main
from simulator.faults import FaultKind
from simulator.report import format_report
from simulator.scenario import ScenarioConfig, run_scenario


def test_dedup_off_reports_double_effects_and_the_demo_exits_non_zero(seed, tmp_path, capsys):
    report = tmp_path / "report.json"
    code = demo_main(["--backend", "table", "--messages", "300", "--events", "300", "--seed",
                      str(seed), "--dedup-off", "--api-ignores-idempotency-key", "--serial",
                      "--no-progress", "--json", str(report), "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out
    summary = json.loads(report.read_text())["backends"]["table"]
    assert summary["doubleEffects"] > 0 and summary["balanceMismatches"] > 0
    assert "[FAIL] exactly one effect per message" in out and "INVARIANT BROKEN" in out


def test_non_atomic_effect_first_is_caught_by_crashes_between_the_steps(chaos_stacks, seed):
    config = ScenarioConfig(backend="cosmos", seed=seed, messages=400, events=400,
                            fault_rate=0.1, non_atomic="effect-first", tag="na1")
    result = run_scenario(config, chaos_stacks["cosmos"])
    report = format_report(result)
    assert result.faults.get(FaultKind.CRASH_BETWEEN_STEPS.value, 0) > 0, report
    assert not result.ok, report
    check = result.check
    assert check.balance_mismatches or sum(check.double_effects.values()) or \
        sum(check.partial.values()), report


def test_non_atomic_marker_first_is_caught_as_lost_effects(chaos_stacks, seed):
    config = ScenarioConfig(backend="table", seed=seed, messages=300, events=300,
                            fault_rate=0.1, non_atomic="marker-first", tag="na2")
    result = run_scenario(config, chaos_stacks["table"])
    report = format_report(result)
    assert not result.ok, report
    check = result.check
    assert check.balance_mismatches or sum(check.partial.values()) or sum(check.lost.values()), report


def test_transient_failures_read_as_permanent_leave_valid_messages_not_effected(seed, tmp_path,
                                                                                capsys):
    """The seeded bug: a store client that reports a 429/503 as a permanent rejection (400).
    The app then dead-letters or parks valid messages. Nothing is lost in the old sense (each
    sits in a dead-letter queue with a reason): only the new invariant catches it."""
    report = tmp_path / "report.json"
    code = demo_main(["--backend", "table", "--messages", "300", "--events", "300", "--seed",
                      str(seed), "--fault-rate", "0.1", "--transient-as-permanent", "--serial",
                      "--no-progress", "--json", str(report), "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out
    summary = json.loads(report.read_text())["backends"]["table"]
    assert summary["faultsInjected"].get(FaultKind.TRANSIENT.value, 0) > 0, out
    assert summary["validNotEffected"] > 0, out
    assert all("StoreRejected" in reason for reason in summary["validNotEffectedByReason"]), out
    assert summary["lost"] == 0 and summary["doubleEffects"] == 0, out
    assert "[FAIL] every valid message effected" in out and "[PASS] nothing lost" in out
    assert f"valid messages not effected: {summary['validNotEffected']}" in out
    assert "INVARIANT BROKEN" in out


def test_the_demo_moving_the_mark_before_the_dispatch_reports_lost_balance_changes(seed, tmp_path,
                                                                                    capsys):
    """`--publish mark-first`: an Event Hubs batch's mark moves before its BalanceChanged go
    out, so a dispatch fault after the mark loses them (the replay finds the events covered)."""
    report = tmp_path / "report.json"
    code = demo_main(["--backend", "cosmos", "--messages", "0", "--events", "1200", "--seed",
                      str(seed), "--fault-rate", "0.3", "--publish", "mark-first", "--serial",
                      "--no-progress", "--json", str(report), "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out
    hop = json.loads(report.read_text())["backends"]["cosmos"]["hops"]["payments -> balance_projection"]
    assert hop["lost"] > 0 and hop["double"] == hop["phantom"] == 0, out
    assert "PUBLISH MARK-FIRST" in out and "[FAIL] nothing lost" in out
    assert "cosmos outbox hops: " in out and "INVARIANT BROKEN" in out
