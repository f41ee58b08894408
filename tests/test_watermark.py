"""The Event Hubs high-water mark on the real servers: forward only, conditional, cheap."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from shared._core.keys import store_safe_id
from shared._core.store import Document, WriteOp
from shared._flows.watermark import Mark, PartitionWatermark


def mark(store) -> PartitionWatermark:
    return PartitionWatermark(store, consumer="payments", event_hub="hub", consumer_group="cg")


def test_the_mark_starts_absent_and_only_moves_forward(store):
    hwm = mark(store)
    assert hwm.read("0") is None
    assert hwm.advance("0", 10, known=None) == 10
    assert hwm.advance("0", 5) == 10  # never down
    assert hwm.read("0").sequence_number == 10
    assert hwm.advance("0", 12, known=hwm.read("0")) == 12


def test_marks_are_kept_per_partition_hub_and_consumer_group(store):
    mark(store).advance("0", 7)
    other_group = PartitionWatermark(store, consumer="payments", event_hub="hub",
                                     consumer_group="other")
    assert other_group.read("0") is None
    assert mark(store).read("1") is None


def test_a_stale_known_mark_loses_the_race_and_re_reads(store):
    hwm = mark(store)
    hwm.advance("0", 5)
    stale = hwm.read("0")
    hwm.advance("0", 20)
    assert hwm.advance("0", 9, known=stale) == 20  # etag mismatch, re-read, 20 >= 9


def test_concurrent_instances_after_a_rebalance_end_at_the_highest_mark(store):
    hwm = mark(store)
    barrier = threading.Barrier(8)

    def owner(n: int) -> int:
        barrier.wait()
        return hwm.advance("3", 100 + n)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(owner, range(8)))
    assert hwm.read("3").sequence_number == 107


# -- sequence numbers that restart (hub recreated, disaster-recovery failover) ------------------
OLD = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # the first incarnation of the hub
NEW = OLD + timedelta(days=1)  # the recreated hub, or the secondary namespace after a failover


def test_the_mark_keeps_the_marked_events_time_and_offset(store):
    hwm = mark(store)
    hwm.advance("0", 5099, known=None, enqueued_time=OLD.isoformat().replace("+00:00", "Z"),
                offset="8800")
    fresh = mark(store).read("0")
    assert (fresh.sequence_number, fresh.enqueued_time, fresh.offset) == (5099, OLD, "8800")


def test_the_mark_covers_only_events_at_or_below_it_and_not_newer():
    stored = Mark(5099, Document("0", "p", {}), enqueued_time=OLD)
    assert stored.covers(5000, OLD - timedelta(seconds=1))  # a replay
    assert stored.covers(5099, OLD)
    assert not stored.covers(5100, OLD + timedelta(seconds=1))  # next event: fresh
    assert not stored.covers(0, NEW)  # below, but newer: the numbers restarted
    assert stored.is_reset(0, NEW) and not stored.is_reset(5100, NEW)
    assert not stored.is_reset(5000, OLD)
    assert stored.covers(0, None)  # an event without a time: sequence numbers only, as before
    assert stored.covers(0, "not a time") and not stored.covers(5100, "not a time")
    assert not stored.covers(0, "2026-03-02T12:00:00.1234567Z")  # the host's 7 digits, newer
    untimed = Mark(5099, Document("0", "p", {}))  # a mark stored before times were kept
    assert untimed.covers(0, NEW) and not untimed.is_reset(0, NEW)


def test_after_a_restart_the_mark_moves_down_to_the_new_sequence(store):
    hwm = mark(store)
    hwm.advance("0", 5099, known=None, enqueued_time=OLD)
    before = hwm.read("0")
    assert hwm.advance("0", 99, known=before, enqueued_time=NEW + timedelta(seconds=9)) == 99
    assert mark(store).read("0").sequence_number == 99
    # ...and never back up to an event of the old incarnation, nor down to an older one.
    assert hwm.advance("0", 5099, enqueued_time=OLD) == 99
    assert hwm.advance("0", 50, enqueued_time=NEW + timedelta(seconds=5)) == 99
    assert hwm.advance("0", 120, enqueued_time=NEW + timedelta(seconds=12)) == 120


def test_the_downward_move_is_conditional_on_the_mark_as_read(store):
    """Two instances after a restart: the slower one, holding the old mark, must not write over
    the newer mark the other wrote; its etag is stale, it re-reads and keeps the newer one."""
    hwm = mark(store)
    hwm.advance("0", 5099, known=None, enqueued_time=OLD)
    old = hwm.read("0")
    assert mark(store).advance("0", 199, known=old, enqueued_time=NEW + timedelta(seconds=19)) == 199
    assert hwm.advance("0", 99, known=old, enqueued_time=NEW + timedelta(seconds=9)) == 199
    assert mark(store).read("0").sequence_number == 199


def test_a_mark_stored_without_a_time_is_read_and_keeps_the_old_rule(store):
    document_id = store_safe_id("0")
    partition = store_safe_id("hwm|payments|hub|cg")
    store.write_documents(partition, [WriteOp("create", document_id,
                                              {"sequenceNumber": 40, "partitionId": "0"})])
    hwm = mark(store)
    stored = hwm.read("0")
    assert (stored.sequence_number, stored.enqueued_time) == (40, None)
    assert stored.covers(10, NEW)  # unknown: judged by sequence number alone
    assert hwm.advance("0", 30, known=stored, enqueued_time=NEW) == 40
    assert hwm.advance("0", 41, known=stored, enqueued_time=NEW) == 41  # now with its time
    assert mark(store).read("0").enqueued_time == NEW
