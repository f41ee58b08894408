"""Chaos on a real queue, on both backends: producer re-sends, host crashes after the commit
(the queue redelivers after its visibility timeout), a store outage (the function raises, the
queue redelivers), bad input; through the real worker, with the demo's checks
(demo/queue_run.py). The counter-proof seeds a host bug (delete before the commit) and the
same checks must catch it.
"""

from __future__ import annotations

import pytest

from demo.queue_run import QueueScenarioConfig, run_queue_scenario

pytestmark = pytest.mark.timeout(600)

SMALL = {"orders": 40, "customers": 6, "duplicate_rate": 0.2, "crash_rate": 0.1, "invalid": 5,
         "conflicts": 2, "undecodable": 1, "outage_seconds": 2.0, "outage_after_calls": 25,
         "long_outage_orders": 4, "long_outage_resends": 2, "long_outage_copies": 1}


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_queue_chaos_keeps_every_invariant_with_real_redeliveries(endpoints, backend):
    report = run_queue_scenario(QueueScenarioConfig(backend=backend, **SMALL), endpoints)
    print(report.format())
    assert report.violations() == []
    # The faults happened, and the queue service itself redelivered.
    assert report.crashes >= 4 and report.crashed_redelivered == report.crashes
    assert report.outage_failed_calls > 0 and report.host["released"] > 0
    assert report.redeliveries >= report.crashes + report.host["released"]
    assert report.sent["duplicate"] == 8
    assert sum(report.duplicates.values()) == report.duplicates_expected >= 8 + 4
    assert report.poison_envelopes["IdempotencyKeyConflict"] == 2
    assert sum(report.poison_envelopes.values()) == 5 + 2 and report.poison_host_copies == 1
    assert report.refused_first == 5 + 2
    # The long outage poisoned valid messages (4 new orders, 1 copy, 2 re-sends of audited
    # ones); the replay brought each back and refused the bad input (5 + 2 envelopes and the
    # host's copy); the re-sends and the copy were absorbed, as the duplicates count holds.
    assert report.poisoned == 4 + 1 + 2
    assert report.replayed == {"replayed": 7, "refused": 5 + 2 + 1}


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_counter_proof_a_host_that_deletes_before_the_commit_loses_orders(endpoints, backend):
    report = run_queue_scenario(QueueScenarioConfig(backend=backend, delete_first=True, **SMALL),
                                endpoints)
    print(report.format())
    assert report.lost > 0, "the outage's failed deliveries were deleted before their commit"
    assert f"lost {report.lost}" in report.violations()
    assert report.host["released"] == 0, "nothing left to come back: each was deleted on receipt"


def test_counter_proof_poison_envelopes_nobody_replays_are_lost_orders(endpoints):
    """The seeded bug: the long outage's envelopes are left in the poison queue (the state
    before `python -m replay` read it). The same checks report them lost and stranded."""
    report = run_queue_scenario(QueueScenarioConfig(backend="table", replay_poison=False,
                                                    **SMALL), endpoints)
    print(report.format())
    assert report.poisoned == 7 and report.lost == 4, "the 4 new orders never applied"
    assert report.valid_refused == 7, "their envelopes still in the poison queue"
    assert "7 valid messages poisoned by the long outage, 0 replayed ({})" in report.violations()
