"""Sustained store outages on both backends: 20 s of a store failing fast (503), and 20 s of
a store paused (SIGSTOP), while Service Bus deliveries and Event Hubs batches hit it.

Afterwards every invariant holds, in particular no valid message is dead-lettered or parked:
a store outage is transient, so Service Bus messages come back (abandoned once, then left to
their lock) and an Event Hubs batch is raised into the host's retry policy, never parked.

The outage hits the backend's store: the Cosmos server on the cosmos backend (notifications
and the parking lot stay up in Table Storage, the case the issue measured: 32 of 100 events
parked), Azurite on the table backend (everything down, parking included).

* **fail-fast** lasts 20 s of the simulation's virtual time, the clock that spaces
  redeliveries, lock expiries and the host's retry backoff. A host retry of a failed batch
  moves that shared clock by its backoff (5 s, then 10 s, ...), which would end the outage
  before the Service Bus consumers meet it; so Service Bus and Event Hubs get a fail-fast
  outage each, in separate runs. The producer sends over 60 virtual seconds (a busy system,
  about 10 sends a second), so the outage overlaps a few hundred sends.
* **pause** lasts 20 s of wall time (the SDKs' timeouts are wall time), with Service Bus and
  Event Hubs traffic in the same run. Each simulated instance runs every trigger on one
  thread, and a batch against a paused store holds its thread for the SDK's timeouts: with
  as many instances as partitions, every thread would sit in a batch for the whole pause.
  Six instances share two partitions, so four of them keep receiving Service Bus messages.
  There are two pauses, each begun at a consumer's first store call after its send point:
  the first at a `payments` call, the second at an `orders` call. One pause begun at the
  send point itself could find every thread in a Service Bus call and end before any batch
  met it; one begun at a batch could find no Service Bus message released (the simulated
  producer waits while events pile up behind the held batches) and meet no Service Bus call.
"""

from __future__ import annotations

import pytest

from simulator.scenario import ScenarioConfig

from .conftest import run_in_workers

BACKENDS = ("table", "cosmos")
OUTAGE_SECONDS = 20.0
# name: (outage mode, the functions each outage begins at (none: at its send point), Service
# Bus messages, events, consumers, partitions, store calls the outages must hit at least:
# failed, or held until a paused server resumed)
RUNS = {
    "fail-fast-servicebus": ("fail-fast", (), 400, 0, 4, 4, {"servicebus": 50}),
    "fail-fast-eventhubs": ("fail-fast", (), 0, 800, 4, 4, {"payments": 2}),
    "pause": ("pause", ("payments", "orders"), 300, 600, 6, 2, {"servicebus": 1, "payments": 1}),
}


def server_of(backend):
    return "cosmos" if backend == "cosmos" else "azurite"


@pytest.fixture(scope="module")
def outage_runs(chaos_stacks, seed, tmp_path_factory):
    logs = tmp_path_factory.mktemp("outage-logs")
    results = {}
    for name, (mode, meets, messages, events, consumers, partitions, _) in RUNS.items():
        configs = {backend: ScenarioConfig(  # both backends at once, one run at a time
            backend=backend, seed=seed, messages=messages, events=events, duplicate_rate=0.1,
            consumers=consumers, partitions=partitions,
            fault_rate=0, outages=max(len(meets), 1), outage_seconds=OUTAGE_SECONDS,
            outage_mode=mode, outage_servers=(server_of(backend),), outage_meets=meets,
            duration=60.0, hostile=False, oversize_bytes=0,
            tag=f"o{list(RUNS).index(name)}") for backend in BACKENDS}
        for backend, result in run_in_workers(configs, chaos_stacks, logs).items():
            results[(name, backend)] = result
    return results


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("run", list(RUNS))
def test_a_sustained_outage_leaves_no_valid_message_behind(outage_runs, run, backend, seed):
    result = outage_runs.get((run, backend))
    assert result is not None, f"{run} {backend}: the worker died (seed {seed})"
    print(result["report"])
    summary = result["summary"]
    mode, meets, *_, minimum = RUNS[run]
    # The outages happened, as asked, and hit the deliveries they were meant to hit.
    assert [tuple(o) for o in summary["outages"]] == \
        [(server_of(backend), mode, OUTAGE_SECONDS)] * max(len(meets), 1)
    hit = {"servicebus": 0, "payments": 0}  # store calls failed, or held while paused
    for calls in (summary["outageFailures"], summary["outageHeld"]):
        for key, n in calls.items():
            hit["payments" if key.endswith(": payments") else "servicebus"] += n
    assert all(hit[what] >= n for what, n in minimum.items()), (hit, result["report"])
    if mode == "fail-fast" and "payments" in minimum:
        # Calls fail at once: the account groups' own retries are spent within the outage and
        # the batch goes back to the host's retry policy. (Paused, a call holds for the SDK's
        # timeouts, so a group's retries may outlast the pause; either way nothing is parked.)
        assert summary["hostRetries"] >= 1
    # And no valid message was left behind.
    assert summary["validNotEffected"] == 0 and summary["validAlsoRefused"] == 0, result["report"]
    assert summary["doubleEffects"] == 0 and summary["lost"] == 0, result["report"]
    assert summary["stalledBatches"] == 0, result["report"]
    assert result["ok"], f"{run} {backend}: invariant broken with seed {seed}\n{result['report']}"
