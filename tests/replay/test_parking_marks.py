"""The parking lot's resolution API on the real stores: list, read, mark under the etag."""

from __future__ import annotations

import threading

import pytest

from replay.stores import document_lister
from shared._flows.parking import EntryClaimedError, EntryResolvedError, ParkingLot


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


def test_a_claim_keeps_others_out_until_it_is_marked_released_or_expired(lot, clock):
    lot.park(consumer="c", entry_id="e", reason="R", payload="p", alert=False)
    alice = lot.claim("c", "e", by="alice", lease_seconds=60)
    assert (alice.claimed_by, alice.claimed_at, alice.claim_expires_at) == ("alice", clock(), clock() + 60)
    with pytest.raises(EntryClaimedError) as busy:
        lot.claim("c", "e", by="alice", lease_seconds=60)  # the same person's second run: apart
    assert busy.value.entry.claimed_by == "alice"
    assert lot.claim("c", "e", by="alice", lease_seconds=90, token=alice.claim_token).claimed(clock())
    lot.release("c", "e", "someone-elses-token")  # not this claim: left alone
    assert lot.entry("c", "e").claimed_by == "alice"
    lot.release("c", "e", alice.claim_token)
    bob = lot.claim("c", "e", by="bob", lease_seconds=60)
    clock.advance(61)  # bob's run died: his claim expires like a lease
    carol = lot.claim("c", "e", by="carol", lease_seconds=60)
    assert carol.claimed_by == "carol" and carol.claim_token != bob.claim_token
    failed = lot.mark("c", "e", action="replay-failed", by="carol", outcome="x", resolved=False,
                      claim=carol.claim_token)
    assert not failed.resolved and failed.claimed_by is None  # a mark drops the claim with it
    with pytest.raises(KeyError):
        lot.claim("c", "missing", by="x", lease_seconds=1)


def test_a_resolved_entry_is_neither_claimed_nor_marked_again(lot):
    lot.park(consumer="c", entry_id="e", reason="R", payload="p", alert=False)
    held = lot.claim("c", "e", by="alice", lease_seconds=60)
    done = lot.mark("c", "e", action="replayed", by="alice", outcome="applied", resolved=True,
                    claim=held.claim_token)
    assert done.resolved and done.claim_token is None
    with pytest.raises(EntryResolvedError) as resolved:
        lot.claim("c", "e", by="bob", lease_seconds=60)
    assert (resolved.value.entry.resolved_by, resolved.value.entry.outcome) == ("alice", "applied")
    with pytest.raises(EntryResolvedError):
        lot.mark("c", "e", action="replay-failed", by="bob", outcome="message gone", resolved=False)
    stored = lot.entry("c", "e")
    assert (stored.resolution, stored.outcome, [s["by"] for s in stored.history]) == (
        "replayed", "applied", ["alice"])


def test_concurrent_claims_one_wins(lot):
    lot.park(consumer="c", entry_id="e", reason="R", payload="p", alert=False)
    barrier = threading.Barrier(4)
    won: list[str] = []
    lost: list[str] = []

    def claim(who: str) -> None:
        barrier.wait()
        try:
            lot.claim("c", "e", by=who, lease_seconds=60)
            won.append(who)
        except EntryClaimedError as error:
            assert error.entry.claimed_by is not None
            lost.append(error.entry.claimed_by)

    threads = [threading.Thread(target=claim, args=(who,)) for who in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and lost == [won[0]] * 3
    assert lot.entry("c", "e").claimed_by == won[0]


def test_park_if_absent_keeps_an_existing_entry_and_its_marks(lot):
    first = lot.park_if_absent(consumer="c", entry_id="j", reason="R", payload="one")
    assert first.payload == "one" and not first.resolved
    lot.mark("c", "j", action="replayed", by="alice", outcome="done", resolved=True)
    again = lot.park_if_absent(consumer="c", entry_id="j", reason="R", payload="two")
    assert (again.payload, again.resolved, again.resolved_by) == ("one", True, "alice")


def test_an_identity_keeps_two_messages_that_share_an_entry_id_apart(lot):
    """Event hub sequence numbers restart: the same entry id can name two events."""
    first = lot.park(consumer="payments", entry_id="hub/0/3", reason="MalformedJson",
                     payload=b"{old", identity="2026-03-01T12:00:00+00:00")
    again = lot.park(consumer="payments", entry_id="hub/0/3", reason="MalformedJson",
                     payload=b"{old", identity="2026-03-01T12:00:00+00:00")
    other = lot.park(consumer="payments", entry_id="hub/0/3", reason="MalformedJson",
                     payload=b"{new", identity="2026-03-01T14:00:00+00:00")
    assert first == again != other
    assert sorted(e.payload for e in lot.entries("payments")) == ["{new", "{old"]


def test_an_entry_parked_without_an_identity_is_told_apart_by_its_payload(lot):
    lot.park(consumer="payments", entry_id="hub/0/7", reason="MalformedJson", payload=b"{old")
    same = lot.park(consumer="payments", entry_id="hub/0/7", reason="MalformedJson",
                    payload=b"{old", identity="t1")
    other = lot.park(consumer="payments", entry_id="hub/0/7", reason="MalformedJson",
                     payload=b"{new", identity="t2")
    assert same != other
    assert sorted(e.payload for e in lot.entries("payments")) == ["{new", "{old"]
