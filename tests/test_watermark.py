"""The Event Hubs high-water mark on the real servers: forward only, conditional, cheap."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from shared.watermark import PartitionWatermark


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
