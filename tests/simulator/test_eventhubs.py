"""The in-memory Event Hub: partitions, batches, checkpoints, ownership, rebalance, crash replay."""

from __future__ import annotations

import pytest

from simulator.clock import SimClock
from simulator.eventhubs import EventHub, PartitionOwnership, partition_for_key
from simulator.servicebus import Origin


@pytest.fixture
def hub():
    return EventHub(SimClock(), name="payments", partitions=2)


def fill(hub, n, key="acct-1"):
    return [hub.send(f'{{"n": {i}}}'.encode(), partition_key=key, origin=Origin(f"e:{i}"))
            for i in range(n)]


def test_partition_key_routes_to_one_partition_with_sequence_numbers_from_zero(hub):
    events = fill(hub, 5)
    assert {e.partition_id for e in events} == {str(partition_for_key("acct-1", 2))}
    assert [e.sequence_number for e in events] == [0, 1, 2, 3, 4]
    offsets = [e.sent.offset for e in events]
    assert offsets == sorted(offsets) and len(set(offsets)) == 5


def test_events_without_a_key_are_spread_round_robin(hub):
    events = [hub.send(b"{}", origin=Origin(f"e:{i}")) for i in range(4)]
    assert [e.partition_id for e in events] == ["0", "1", "0", "1"]


def test_batches_respect_max_size_and_checkpoint_moves_the_resume_position(hub):
    pid = fill(hub, 7)[0].partition_id
    owners = PartitionOwnership(hub, instances=1)
    batch = owners.take(0, max_batch=3)
    assert batch is not None
    assert [e.sequence_number for e in batch.events] == [0, 1, 2]
    assert owners.take(0, max_batch=3) is None  # one batch per partition at a time
    owners.finish(batch, checkpoint=True)
    assert hub.checkpoints[pid] == 2 and hub.resume_position(pid) == 3
    assert [e.sequence_number for e in owners.take(0, max_batch=10).events] == [3, 4, 5, 6]


def test_crash_before_checkpoint_replays_from_the_last_checkpoint(hub):
    pid = fill(hub, 6)[0].partition_id
    owners = PartitionOwnership(hub, instances=2)
    owner = owners.partitions[pid].owner
    first = owners.take(owner, max_batch=2)
    assert first is not None
    owners.finish(first, checkpoint=True)
    second = owners.take(owner, max_batch=2)
    assert second is not None
    owners.finish(second, checkpoint=False)  # the host died: no checkpoint
    moved = owners.crash(owner, lambda candidates: next(c for c in candidates if c != owner))
    assert moved == [pid]
    replay = owners.take(owners.partitions[pid].owner, max_batch=10)
    assert replay is not None
    assert [e.sequence_number for e in replay.events] == [2, 3, 4, 5]


def test_rebalance_lets_two_instances_process_the_same_events(hub):
    pid = fill(hub, 4)[0].partition_id
    owners = PartitionOwnership(hub, instances=2)
    old = owners.partitions[pid].owner
    new = 1 - old
    in_flight = owners.take(old, max_batch=4)
    assert in_flight is not None
    owners.move(pid, new)  # ownership moves while the old owner is mid-batch
    overlap = owners.take(new, max_batch=4)
    assert overlap is not None
    assert [e.sequence_number for e in overlap.events] == [e.sequence_number for e in in_flight.events]
    owners.finish(in_flight, checkpoint=True)  # the old owner still checkpoints (last write wins)
    assert owners.take(old, max_batch=4) is None
    owners.finish(overlap, checkpoint=True)
    assert hub.fully_checkpointed()


def test_a_failover_restarts_sequence_numbers_with_later_times_and_no_checkpoints(hub):
    old = fill(hub, 5)
    pid = old[0].partition_id
    owners = PartitionOwnership(hub, instances=1)
    first = owners.take(0, max_batch=10)
    assert first is not None
    owners.finish(first, checkpoint=True)
    hub.fail_over()  # same clock instant: the new hub still stamps its events later
    owners.restart()
    new = fill(hub, 3)
    assert [e.sequence_number for e in new] == [0, 1, 2] and new[0].sent.offset == 0
    assert {e.incarnation for e in new} == {1} and {e.incarnation for e in old} == {0}
    assert min(e.sent.enqueued_time for e in new) > max(e.sent.enqueued_time for e in old)
    assert hub.checkpoints[pid] is None
    assert [e.sequence_number for e in owners.take(0, max_batch=10).events] == [0, 1, 2]
