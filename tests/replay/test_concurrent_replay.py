"""Two operators replaying at once: `replay --all` in two runs over the same parked entries and
dead-lettered messages. Each run has its own services, stores clients and dead-letter source
(two processes, as two people on call would run them); they share the stores and the broker.
Every item must be replayed once and marked once, and no run may record `failed` for what the
other did. On both backends and both dead-letter sources.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

import pytest

from functions.services import build_services
from replay.deadletters import ServiceBusDeadLetters, SimulatorDeadLetters
from replay.stores import document_lister
from replay.tool import Filters, Options, ReplayTool
from shared._flows.parking import ParkingLot

from .conftest import WINDOW
from .sdk_client import SimulatedServiceBusClient

SOURCES = ("simulator", "sdk")


def run_for(w, operator: str, dead_letters: str) -> ReplayTool:
    """A second process's tool: services of its own on the same stores and broker."""
    services = build_services(w.settings, stores=lambda role: w.stores[role], sender=w.api,
                              clock=w.clock, sleep=lambda _: None)
    source = (SimulatorDeadLetters(w.namespace, w.entities) if dead_letters == "simulator"
              else ServiceBusDeadLetters(SimulatedServiceBusClient(w.namespace, w.clock), w.entities,
                                         duplicate_detection_window=WINDOW, max_wait_time=0.0))
    parked = services.stores["parked"]
    parking = ParkingLot(parked, clock=w.clock, lister=document_lister(parked))
    return ReplayTool(services, parking, source, operator=operator, clock=w.clock)


def stage(w):
    """Three orders dead-lettered behind an outage, three payments parked while the ledger
    refused the app, one notification dead-lettered after the API kept timing out (it honours
    Idempotency-Key, so each delivery was retried); all replayable now."""
    orders = [w.order(n) for n in range(1, 4)]
    w.stores["orders"].down = True
    for order in orders:
        w.send(order)
    w.drain()
    w.stores["orders"].down = False
    payments = [w.payment(n, amount=100 * n, account=n) for n in range(1, 4)]
    w.stores["ledger"].forbidden = True
    for p in payments:
        assert w.process_payments([p]).parked == {"StoreRejected": 1}
    w.stores["ledger"].forbidden = False
    note = w.notification(1)
    w.api.unreachable.add(("notify", note.key))
    w.send(note)
    w.drain()
    w.api.unreachable.clear()
    w.clock.advance(WINDOW + 1)  # past duplicate detection: resubmissions reach the queue
    return orders, payments, note


def replay_at_once(tools):
    """Both runs list, wait for each other, then replay what they listed: every item is in
    both lists, so the runs meet on each one."""
    barrier = threading.Barrier(len(tools))
    results: dict[str, list] = {}
    errors: list[BaseException] = []

    def run(tool: ReplayTool) -> None:
        listed = tool.items

        def items_then_wait(filters=None):
            found = listed(filters)
            barrier.wait(timeout=60)
            return found

        tool.items = items_then_wait
        try:
            results[tool.operator] = tool.replay(filters=Filters(), options=Options())
        except BaseException as error:  # reported below, not lost in the thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(tool,)) for tool in tools]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    return results


def history_of(tool, item_id):
    return [(step["action"], step["by"]) for step in tool.find(item_id).entry.history]


@pytest.mark.parametrize("dead_letters", SOURCES)
def test_two_runs_at_once_replay_every_item_once_and_mark_it_once(make_world, backend, dead_letters):
    w = make_world(backend, honours_key=True)
    orders, _, note = stage(w)
    alice, bob = run_for(w, "alice", dead_letters), run_for(w, "bob", dead_letters)
    listed = {i.id for i in alice.items()}
    assert len(listed) == 7

    results = replay_at_once([alice, bob])

    by_item: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for operator, run in results.items():
        assert {r.id for r in run} == listed  # both runs met every item
        for r in run:
            by_item[r.id].append((operator, r.status, r.outcome))
    for item_id, seen in by_item.items():
        statuses = Counter(status for _, status, _ in seen)
        assert statuses == {"replayed": 1, "skipped": 1}, (item_id, seen)
        [(winner, _, _)] = [s for s in seen if s[1] == "replayed"]
        [(_, _, why)] = [s for s in seen if s[1] == "skipped"]
        assert why.startswith((f"being replayed by {winner}", f"already replayed by {winner}")), why
        # Marked once: one replay step, by the run that replayed it, and nothing failed.
        assert history_of(alice, item_id) == [("replayed", winner)], item_id
        entry = alice.find(item_id).entry
        assert (entry.resolved, entry.resolved_by, entry.claimed_by) == (True, winner, None)

    # Replayed once: one resubmission per message (the notification's reaches both
    # subscriptions; audit absorbs its copy), one effect each.
    deliveries = w.drain()
    assert sorted(deliveries) == sorted([*(("orders", o.key, "complete") for o in orders),
                                         ("notify", note.key, "complete"),
                                         ("audit", note.key, "complete")])
    assert all(w.order_document(o.key) is not None for o in orders)
    assert [w.balance(n) for n in range(1, 4)] == [100, 200, 300]
    assert w.api_calls("notify", note.key) == 1 and w.api_calls("audit", note.key) == 1
    assert w.dead_lettered() == {}


@pytest.mark.parametrize("dead_letters", SOURCES)
def test_a_run_acting_on_a_stale_list_reports_what_the_other_did_and_overwrites_nothing(
        make_world, backend, dead_letters):
    """Bob listed before Alice replayed everything: the dead-lettered messages are gone from
    the queue when he gets to them (resubmitted by Alice), the entries resolved. He is told
    so, item by item; no `failed` lands over Alice's outcome."""
    w = make_world(backend, honours_key=True)
    stage(w)
    alice, bob = run_for(w, "alice", dead_letters), run_for(w, "bob", dead_letters)
    stale = bob.items()
    done = alice.replay(filters=Filters())
    assert [r.status for r in done] == ["replayed"] * 7
    bob._items = lambda filters, hold: stale  # the list he acts on is the one he read

    late = bob.replay(filters=Filters())

    assert [r.status for r in late] == ["skipped"] * 7
    for r in late:
        assert r.outcome.startswith("already replayed by alice"), r.outcome
        assert history_of(alice, r.id) == [("replayed", "alice")]
    resubmitted = [r for r in late if r.id.startswith("dlq:")]
    assert len(resubmitted) == 4 and all("resubmitted to" in r.outcome for r in resubmitted)
    assert len(w.drain()) == 5  # Alice's resubmissions only: 3 orders, the notification twice
