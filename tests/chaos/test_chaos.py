"""Seeded chaos runs, one per store backend, both at once in worker processes.

All fault kinds are on; the invariants are read from the stores. A failure
prints the seed: `CHAOS_SEED=<seed> ./dev test tests/chaos` replays it.
"""

from __future__ import annotations

import os

import pytest

from simulator.faults import FaultKind
from simulator.host import CAUSES
from simulator.scenario import ScenarioConfig
from tests.chaos.conftest import run_in_workers

MESSAGES = int(os.environ.get("CHAOS_MESSAGES", "1500"))
EVENTS = int(os.environ.get("CHAOS_EVENTS", "2000"))
# Kinds that fire once per Event Hubs batch: counted over both backends' runs together.
BATCH_KINDS = {FaultKind.REBALANCE.value, FaultKind.CRASH_MID_BATCH.value}
BACKENDS = ("table", "cosmos")
# orders now publishes OrderAccepted through its outbox, so notify and audit consume one more
# message per order (about 1,200 more deliveries per backend): more than the default 300 s.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def chaos(chaos_stacks, seed, tmp_path_factory):
    configs = {backend: ScenarioConfig(backend=backend, seed=seed, messages=MESSAGES,
                                       events=EVENTS, duplicate_rate=0.25, fault_rate=0.08,
                                       consumers=4, max_batch=20, tag="ci")
               for backend in BACKENDS}
    return run_in_workers(configs, chaos_stacks, tmp_path_factory.mktemp("chaos-logs"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_chaos_run_keeps_every_invariant(chaos, backend, seed):
    result = chaos.get(backend)
    assert result is not None, f"{backend}: the worker died (seed {seed})"
    print(result["report"])
    summary = result["summary"]
    assert result["ok"], f"{backend}: invariant broken with seed {seed}\n{result['report']}"
    assert summary["doubleEffects"] == 0 and summary["lost"] == 0
    assert summary["balanceMismatches"] == 0 and summary["partialEffects"] == 0
    assert summary["validNotEffected"] == 0 and summary["validAlsoRefused"] == 0
    # The hostile inputs (10 MB bodies included) were in the mix and each was rejected with a
    # reason on its first delivery; no partition stalled.
    assert summary["hostileCases"] >= 35 and summary["invalidNotRejected"] == {}
    assert summary["rejectionReasons"] and summary["stalledBatches"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_chaos_run_exercised_every_fault_kind_and_duplicate_cause(chaos, backend, seed):
    summary = chaos[backend]["summary"]
    fired = set(summary["faultsInjected"])
    expected = {kind.value for kind in FaultKind} - {FaultKind.CRASH_BETWEEN_STEPS.value} - BATCH_KINDS
    assert expected <= fired, f"seed {seed}: never fired: {expected - fired}"
    fired_anywhere = {kind for result in chaos.values() for kind in result["summary"]["faultsInjected"]}
    assert fired_anywhere >= BATCH_KINDS, f"seed {seed}: never fired: {BATCH_KINDS - fired_anywhere}"
    assert all(summary["duplicatesByCause"][cause] > 0 for cause in CAUSES), summary["duplicatesByCause"]
    assert [mode for _, mode, _ in summary["outages"]] == ["pause", "pause"]
    assert summary["deliveriesTotal"] > summary["messagesSent"] + summary["eventsSent"]
