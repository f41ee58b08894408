"""The outbox under the chaos harness, on both hops: what `orders` commits is delivered to
notify and audit, and what each `payments` account transaction commits to balance_projection,
through the simulated broker, once each, whatever happens between the commit and the
dispatch; and the ways of publishing without an outbox are caught (before the commit, right
after it without recording, and on Event Hubs with the mark moved before the dispatch)."""

from __future__ import annotations

import pytest

from simulator.faults import OUTBOX_FAULTS
from simulator.report import format_report
from simulator.scenario import ScenarioConfig, ScenarioResult, run_scenario

PAYMENTS_HOP = "payments -> balance_projection"


def through_dispatch_faults(stacks, seed, backend, *, messages: int, events: int, tag: str
                            ) -> tuple[ScenarioResult, str]:
    """A run at fault rate 0.6 without outages or hostile input: every invariant holds and
    each of the outbox's fault kinds fired."""
    config = ScenarioConfig(backend=backend, seed=seed, messages=messages, events=events,
                            fault_rate=0.6, outages=0, hostile=False, oversize_bytes=0, tag=tag)
    result = run_scenario(config, stacks[backend])
    report = format_report(result)
    assert result.ok, report
    for kind in OUTBOX_FAULTS:
        assert result.faults.get(kind.value, 0) > 0, (kind, report)
    return result, report


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_every_committed_order_is_announced_once_per_subscription_through_dispatch_faults(
        chaos_stacks, seed, backend):
    result, report = through_dispatch_faults(chaos_stacks, seed, backend, messages=400,
                                             events=60, tag="ob1")
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


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_every_committed_balance_change_reaches_the_projection_once_through_dispatch_faults(
        chaos_stacks, seed, backend):
    """Events only: every dispatch fault that fires hits an Event Hubs batch's one dispatch
    (after its groups committed, before its mark moves), and the batch is retried or replayed
    from the checkpoint."""
    result, report = through_dispatch_faults(chaos_stacks, seed, backend, messages=0,
                                             events=800, tag="ob4")
    check = result.check
    committed = check.logical["BalanceChanged"]
    assert committed > 0 and check.effects["BalanceChanged"] == committed, report
    assert check.hops()[PAYMENTS_HOP] == {"double": 0, "lost": 0, "phantom": 0, "pending": 0,
                                          "effected": committed}, report
    assert check.views_checked > 0 and not check.view_mismatches, report
    assert result.stats.deliveries["balance_projection"] >= committed, report


@pytest.mark.parametrize(("mode", "backend"), [("before-commit", "cosmos"),
                                               ("after-commit", "table"),
                                               ("mark-first", "cosmos")])
def test_balance_changes_published_without_the_outbox_are_caught(chaos_stacks, seed, mode,
                                                                  backend):
    """Before the commit: what a failed or duplicate commit published shows as phantoms or
    doubles. Right after the commit, not recorded: a crash in between loses the message and
    the retry, a duplicate, has nothing to send. Mark before dispatch: a crash in between
    loses it, the replay finding its events under the mark."""
    # 20-event batches: 60 to 110 of them, so dispatch faults land on several (a loss needs one
    # in the right place; with 100-event batches a run could see none).
    config = ScenarioConfig(backend=backend, seed=seed, messages=0, events=600, fault_rate=0.3,
                            max_batch=20, outages=0, hostile=False, oversize_bytes=0,
                            publish=mode, tag=f"ob{mode[:2]}")
    result = run_scenario(config, chaos_stacks[backend])
    report = format_report(result)
    assert not result.ok, report
    hop = result.check.hops()[PAYMENTS_HOP]
    failed = {i.name for i in result.check.invariants if not i.ok}
    if mode == "before-commit":
        assert hop["phantom"] or hop["double"], report
        assert any(name.startswith(("no BalanceChanged for a transaction", "exactly one effect"))
                   for name in failed), report
    else:
        assert hop["lost"] > 0 and hop["phantom"] == hop["double"] == 0, report
        assert "nothing lost (effected, dead-lettered or parked with a reason)" in failed, report
