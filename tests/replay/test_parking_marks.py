"""The parking lot's resolution API on the real stores: list, read, mark under the etag."""

from __future__ import annotations

import threading

import pytest

from replay.stores import document_lister
from shared.parking import ParkingLot


@pytest.fixture
def lot(store, clock):
    return ParkingLot(store, clock=clock, lister=document_lister(store))


def test_entries_marks_and_history(lot, clock):
    lot.park(consumer="c-one", entry_id="hub/0/1", reason="Bad", payload=b'{"a": 1}', alert=False,
             context={"partition_id": "0"})
    clock.advance(5)
    lot.park(consumer="c-two", entry_id="m|2", reason="Stale", payload="x", alert=False)
    assert [(e.consumer, e.entry_id) for e in lot.entries()] == [("c-one", "hub/0/1"), ("c-two", "m|2")]
    assert [e.entry_id for e in lot.entries("c-two")] == ["m|2"]
    entry = lot.entry("c-one", "hub/0/1")
    assert entry.payload_intact and entry.context == {"partition_id": "0"} and not entry.resolved

    clock.advance(60)
    failed = lot.mark("c-one", "hub/0/1", action="replay-failed", by="bob", outcome="still invalid",
                      resolved=False)
    assert not failed.resolved and failed.outcome == "still invalid"
    done = lot.mark("c-one", "hub/0/1", action="replayed", by="alice", outcome="applied",
                    note="after the fix", resolved=True)
    assert (done.resolved, done.resolution, done.resolved_by, done.resolved_at, done.note) == (
        True, "replayed", "alice", clock(), "after the fix")
    stored = lot.entry("c-one", "hub/0/1")
    assert [(s["action"], s["by"]) for s in stored.history] == [("replay-failed", "bob"),
                                                                 ("replayed", "alice")]
    assert stored.payload == '{"a": 1}' and stored.reason == "Bad"  # the rest is untouched
    assert [e.consumer for e in lot.entries()] == ["c-two"]
    assert len(lot.entries(include_resolved=True)) == 2
    with pytest.raises(KeyError):
        lot.mark("c-one", "missing", action="x", by="y", outcome="z", resolved=True)
    # Parked again (the same message failed again): open again, as a fresh entry.
    lot.park(consumer="c-one", entry_id="hub/0/1", reason="Bad", payload=b'{"a": 1}', alert=False)
    assert not lot.entry("c-one", "hub/0/1").resolved


def test_concurrent_marks_both_land(lot):
    """Two operators marking at once: the etag makes one retry; neither step is lost."""
    lot.park(consumer="c", entry_id="e", reason="R", payload="p", alert=False)
    barrier = threading.Barrier(2)

    def mark(who: str) -> None:
        barrier.wait()
        lot.mark("c", "e", action="replay-failed", by=who, outcome="x", resolved=False)

    threads = [threading.Thread(target=mark, args=(who,)) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(s["by"] for s in lot.entry("c", "e").history) == ["a", "b"]


def test_a_lot_without_a_lister_says_so(store):
    with pytest.raises(TypeError, match="lister"):
        ParkingLot(store).entries()
