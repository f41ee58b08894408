"""Event Hubs delivery semantics, reproduced in memory.

* **Partitions** hold events in order; each event gets the partition's next
  sequence number (from 0) and an offset. Events with a partition key land in
  the partition the key hashes to; others are spread round-robin.
* **Batches**: an owner reads up to `max_batch` events after its position.
* **Checkpoints**: the host records the last sequence number of each batch
  after the function returns, *whether or not it raised* (the trigger's
  behaviour); the checkpoint store keeps the last write (no ownership check).
* **Ownership**: each partition has one owner at a time. When an owner dies
  (a crash before the checkpoint) its partitions go to other instances, which
  start reading again after the last checkpoint: a checkpoint replay. A
  **rebalance** hands a partition to another instance while the old owner is
  still in the middle of a batch, so for a moment two instances process the
  same events.
* Producers that retry after a lost acknowledgement append the same event
  again, at a new sequence number (Event Hubs has no duplicate detection).
* **Failover** (`fail_over`): the hub is recreated, or its alias fails over to a
  disaster-recovery namespace. Every partition starts again at sequence number
  and offset 0, with no checkpoints (consumers read the new hub from its
  start), and stamps its events after the failover; the app's high-water marks
  are not reset (the checks judge the workload's items, not what the hub holds).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from simulator.host_inputs import SentEvent
from simulator.servicebus import Origin


@dataclass(frozen=True)
class HubEvent:
    """One stored event and the logical event it carries."""

    partition_id: str
    sent: SentEvent
    origin: Origin
    incarnation: int = 0  # which hub (failovers so far) stored it

    @property
    def sequence_number(self) -> int:
        return self.sent.sequence_number


def partition_for_key(partition_key: str, partitions: int) -> int:
    """A stable partition for a partition key (Event Hubs hashes the key likewise)."""
    return zlib.crc32(partition_key.encode("utf-8")) % partitions


class EventHub:
    """An event hub with partitions and a checkpoint store for one consumer group."""

    def __init__(self, clock: Callable[[], float], *, name: str = "payments", partitions: int = 4,
                 consumer_group: str = "payments-processor") -> None:
        if partitions < 1:
            raise ValueError("an event hub has at least one partition")
        self.clock = clock
        self.name = name
        self.consumer_group = consumer_group
        self.partition_ids = [str(p) for p in range(partitions)]
        self._events: dict[str, list[HubEvent]] = {p: [] for p in self.partition_ids}
        self._offsets: dict[str, int] = dict.fromkeys(self.partition_ids, 0)
        self.checkpoints: dict[str, int | None] = dict.fromkeys(self.partition_ids)
        self.checkpoint_writes = 0
        self._next_round_robin = 0
        self.lock = threading.RLock()
        self.sent = 0
        self.incarnation = 0
        self._not_before = 0.0  # a recreated hub stamps its events after it was recreated

    def fail_over(self) -> None:
        """Recreate the hub (or fail over to the secondary namespace): sequence numbers, offsets
        and checkpoints start again from 0 in every partition."""
        with self.lock:
            for partition_id in self.partition_ids:
                self._events[partition_id] = []
                self._offsets[partition_id] = 0
                self.checkpoints[partition_id] = None
            self.incarnation += 1
            self._not_before = self.clock() + 0.001

    def send(self, body: bytes, *, properties: dict[str, Any] | None = None,
             partition_key: str | None = None, content_type: str | None = None,
             origin: Origin) -> HubEvent:
        with self.lock:
            if partition_key is not None:
                index = partition_for_key(partition_key, len(self.partition_ids))
            else:
                index = self._next_round_robin
                self._next_round_robin = (index + 1) % len(self.partition_ids)
            partition_id = self.partition_ids[index]
            events = self._events[partition_id]
            sent = SentEvent(body=body, sequence_number=len(events), properties=properties,
                             partition_key=partition_key, offset=self._offsets[partition_id],
                             enqueued_time=datetime.fromtimestamp(
                                 max(self.clock(), self._not_before), UTC),
                             content_type=content_type)
            self._offsets[partition_id] += len(body) + 64
            event = HubEvent(partition_id, sent, origin, self.incarnation)
            events.append(event)
            self.sent += 1
            return event

    def length(self, partition_id: str) -> int:
        with self.lock:
            return len(self._events[partition_id])

    def read(self, partition_id: str, from_sequence: int, max_count: int) -> list[HubEvent]:
        with self.lock:
            return self._events[partition_id][from_sequence:from_sequence + max_count]

    def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        """Record the last processed sequence number (last write wins, as in the blob store)."""
        with self.lock:
            self.checkpoints[partition_id] = sequence_number
            self.checkpoint_writes += 1

    def resume_position(self, partition_id: str) -> int:
        """Where a new owner starts reading: right after the last checkpoint."""
        with self.lock:
            mark = self.checkpoints[partition_id]
            return 0 if mark is None else mark + 1

    def fully_checkpointed(self) -> bool:
        with self.lock:
            return all(self.resume_position(p) >= len(self._events[p]) for p in self.partition_ids)


@dataclass
class PartitionState:
    partition_id: str
    owner: int
    epoch: int = 0
    position: int = 0  # next sequence number the current owner reads
    busy: dict[int, int] = field(default_factory=dict)  # instance -> epoch of its batch in flight


@dataclass(frozen=True)
class Batch:
    """A batch taken by one instance from one partition."""

    instance: int
    partition_id: str
    epoch: int
    events: list[HubEvent]

    @property
    def last_sequence_number(self) -> int:
        return self.events[-1].sequence_number


class PartitionOwnership:
    """Which instance owns which partition, and where each owner reads next."""

    def __init__(self, hub: EventHub, instances: int) -> None:
        self.hub = hub
        self.instances = instances
        self.lock = hub.lock
        self.partitions = {p: PartitionState(p, owner=i % instances)
                           for i, p in enumerate(hub.partition_ids)}
        self.crashes = 0
        self.rebalances = 0

    def pending(self) -> int:
        """Events after the current owners' positions."""
        with self.lock:
            return sum(max(0, self.hub.length(p) - s.position) for p, s in self.partitions.items())

    def owned(self, instance: int) -> list[str]:
        with self.lock:
            return [p for p, s in self.partitions.items() if s.owner == instance]

    def take(self, instance: int, max_batch: int, start: int = 0) -> Batch | None:
        """The next batch for `instance` from a partition it owns and is not already processing."""
        with self.lock:
            ids = self.hub.partition_ids
            for k in range(len(ids)):
                state = self.partitions[ids[(start + k) % len(ids)]]
                if state.owner != instance or instance in state.busy:
                    continue
                events = self.hub.read(state.partition_id, state.position, max_batch)
                if not events:
                    continue
                state.position = events[-1].sequence_number + 1
                state.busy[instance] = state.epoch
                return Batch(instance, state.partition_id, state.epoch, events)
            return None

    def finish(self, batch: Batch, *, checkpoint: bool) -> None:
        """The batch is over: checkpoint it (unless the instance died) and free the slot."""
        with self.lock:
            if checkpoint:
                self.hub.checkpoint(batch.partition_id, batch.last_sequence_number)
            state = self.partitions[batch.partition_id]
            if state.busy.get(batch.instance) == batch.epoch:
                del state.busy[batch.instance]

    def move(self, partition_id: str, to_instance: int) -> None:
        """Give a partition to another instance, which resumes after the last checkpoint."""
        with self.lock:
            state = self.partitions[partition_id]
            state.owner = to_instance
            state.epoch += 1
            state.position = self.hub.resume_position(partition_id)
            self.rebalances += 1

    def restart(self) -> None:
        """After a failover: every owner reads its partition of the new hub from the start."""
        with self.lock:
            for state in self.partitions.values():
                state.epoch += 1
                state.position = self.hub.resume_position(state.partition_id)

    def idle(self) -> bool:
        """No batch in flight in any partition."""
        with self.lock:
            return not any(state.busy for state in self.partitions.values())

    def crash(self, instance: int, choose: Callable[[list[int]], int]) -> list[str]:
        """`instance` died: its partitions go to other owners (or to it, restarted)."""
        with self.lock:
            self.crashes += 1
            moved = []
            for state in self.partitions.values():
                state.busy.pop(instance, None)
                if state.owner == instance:
                    state.owner = choose(list(range(self.instances)))
                    state.epoch += 1
                    state.position = self.hub.resume_position(state.partition_id)
                    moved.append(state.partition_id)
            return moved
