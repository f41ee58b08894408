"""Service Bus delivery semantics, reproduced in memory.

What the simulator keeps from the real broker:

* **PeekLock**: a received message is locked for `lock_duration` (virtual
  seconds); each delivery increments its delivery count. Settling with a lock
  that expired (or that the broker took back) fails with
  `MessageLockLostError`, and the message is delivered again, possibly while
  the first consumer is still working on it.
* **abandon** makes the message available again at once; **complete** removes
  it; **deadletter** moves it to the entity's dead-letter queue with a reason
  and description.
* **Max delivery count**: a message abandoned or whose lock expired after its
  `max_delivery_count`-th delivery is dead-lettered with reason
  `MaxDeliveryCountExceeded`.
* **Duplicate detection** (send side): a `MessageId` sent again within the
  window of the queue or topic is accepted by the sender but dropped.
* **Topics**: a message sent to a topic is copied to every subscription, each
  with its own locks, delivery counts and dead-letter queue.

Every entity shares the namespace lock and condition, so competing consumers
on threads see one consistent broker.
"""

from __future__ import annotations

import heapq
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from simulator.host_inputs import SentMessage

MAX_DELIVERY_COUNT_EXCEEDED = "MaxDeliveryCountExceeded"


class MessageLockLostError(Exception):
    """The lock on the message was lost (expired or taken back); settle failed."""


@dataclass(frozen=True)
class Origin:
    """Which logical message a broker copy carries, and why the copy exists."""

    logical: str  # the harness's id of the logical message, e.g. "orders:ORD-1"
    copy: int = 0  # 0: the producer's first send; >= 1: a producer retry of it
    variant: int = 0  # > 0: a different body sent under the same id (a key conflict)


@dataclass
class BrokerMessage:
    """One message in one queue or subscription."""

    sent: SentMessage
    origin: Origin
    sequence_number: int
    enqueued_at: float
    delivery_count: int = 0
    lock_token: uuid.UUID | None = None
    locked_until: float = 0.0
    state: str = "active"  # active, completed, deadlettered
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None
    settled_by: str | None = None  # "complete", "deadletter", "broker"


@dataclass(frozen=True)
class Delivery:
    """One delivery of a message under a lock."""

    entity: Entity
    message: BrokerMessage
    lock_token: uuid.UUID
    delivery_count: int
    received_at: float


class Entity:
    """A queue or a topic subscription: what consumers receive from."""

    def __init__(self, path: str, namespace: ServiceBusNamespace, *, lock_duration: float,
                 max_delivery_count: int) -> None:
        self.path = path
        self.namespace = namespace
        self.lock_duration = lock_duration
        self.max_delivery_count = max_delivery_count
        self._available: list[tuple[int, BrokerMessage]] = []
        self._locked: dict[uuid.UUID, BrokerMessage] = {}
        self.dead_letters: list[BrokerMessage] = []
        self.completed = 0
        self.enqueued = 0
        self.deliveries = 0
        self.lock_losses = 0

    # -- state ---------------------------------------------------------------------------
    @property
    def available_count(self) -> int:
        return len(self._available)

    @property
    def active_count(self) -> int:
        return len(self._available) + len(self._locked)

    def next_lock_expiry(self) -> float | None:
        return min((m.locked_until for m in self._locked.values()), default=None)

    def enqueue(self, message: BrokerMessage) -> None:
        with self.namespace.lock:
            heapq.heappush(self._available, (message.sequence_number, message))
            self.enqueued += 1

    def _dead_letter(self, message: BrokerMessage, reason: str, description: str,
                     settled_by: str) -> None:
        message.state = "deadlettered"
        message.dead_letter_reason = reason
        message.dead_letter_description = description
        message.settled_by = settled_by
        message.lock_token = None
        self.dead_letters.append(message)

    def _release(self, message: BrokerMessage) -> None:
        """The lock ended without settlement: make it available, or dead-letter it."""
        if message.lock_token is not None:
            self._locked.pop(message.lock_token, None)
        message.lock_token = None
        if message.delivery_count >= self.max_delivery_count:
            self._dead_letter(message, MAX_DELIVERY_COUNT_EXCEEDED,
                              f"Message could not be consumed after {self.max_delivery_count} "
                              "delivery attempts.", "broker")
        else:
            heapq.heappush(self._available, (message.sequence_number, message))
        self.namespace.changed.notify_all()

    def expire_locks(self, now: float) -> None:
        with self.namespace.lock:
            for message in [m for m in self._locked.values() if m.locked_until <= now]:
                self.lock_losses += 1
                self._release(message)

    def receive(self, now: float) -> Delivery | None:
        """Lock and return the next available message, or None."""
        with self.namespace.lock:
            self.expire_locks(now)
            if not self._available:
                return None
            _, message = heapq.heappop(self._available)
            message.delivery_count += 1
            message.lock_token = uuid.uuid4()
            message.locked_until = now + self.lock_duration
            self._locked[message.lock_token] = message
            self.deliveries += 1
            self.namespace.changed.notify_all()
            return Delivery(self, message, message.lock_token, message.delivery_count, now)

    def _held(self, token: uuid.UUID, now: float) -> BrokerMessage:
        message = self._locked.get(token)
        if message is None:
            raise MessageLockLostError(f"{self.path}: the lock {token} is no longer held")
        if message.locked_until <= now:
            self.lock_losses += 1
            self._release(message)
            raise MessageLockLostError(f"{self.path}: the lock {token} expired")
        return message

    def complete(self, token: uuid.UUID, now: float) -> BrokerMessage:
        with self.namespace.lock:
            message = self._held(token, now)
            del self._locked[token]
            message.lock_token = None
            message.state = "completed"
            message.settled_by = "complete"
            self.completed += 1
            self.namespace.changed.notify_all()
            return message

    def abandon(self, token: uuid.UUID, now: float) -> BrokerMessage:
        with self.namespace.lock:
            message = self._held(token, now)
            self._release(message)
            return message

    def deadletter(self, token: uuid.UUID, now: float, reason: str | None,
                   description: str | None) -> BrokerMessage:
        with self.namespace.lock:
            message = self._held(token, now)
            del self._locked[token]
            self._dead_letter(message, reason or "", description or "", "deadletter")
            self.namespace.changed.notify_all()
            return message

    def take_lock_back(self, token: uuid.UUID) -> bool:
        """The lock expires now (renewal failed or processing outlived it); True if it was held."""
        with self.namespace.lock:
            message = self._locked.get(token)
            if message is None:
                return False
            self.lock_losses += 1
            self._release(message)
            return True


@dataclass
class _SendTarget:
    """A queue or a topic: the address producers send to, with its duplicate detection."""

    name: str
    entities: list[Entity]
    duplicate_detection: bool
    seen: dict[str, float] = field(default_factory=dict)


class ServiceBusNamespace:
    """Queues and topics (with subscriptions) sharing one lock and one virtual clock."""

    def __init__(self, clock: Callable[[], float], *, lock_duration: float = 60.0,
                 max_delivery_count: int = 10, duplicate_detection_window: float = 600.0) -> None:
        self.clock = clock
        self.lock_duration = lock_duration
        self.max_delivery_count = max_delivery_count
        self.duplicate_detection_window = duplicate_detection_window
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._targets: dict[str, _SendTarget] = {}
        self._entities: dict[str, Entity] = {}
        self._sequence = 0
        self.sent = 0
        self.dropped_duplicates = 0

    def _entity(self, path: str) -> Entity:
        entity = Entity(path, self, lock_duration=self.lock_duration,
                        max_delivery_count=self.max_delivery_count)
        self._entities[path] = entity
        return entity

    def create_queue(self, name: str, *, duplicate_detection: bool = True) -> Entity:
        with self.lock:
            entity = self._entity(name)
            self._targets[name] = _SendTarget(name, [entity], duplicate_detection)
            return entity

    def create_topic(self, name: str, subscriptions: list[str], *,
                     duplicate_detection: bool = True) -> list[Entity]:
        with self.lock:
            entities = [self._entity(f"{name}/subscriptions/{sub}") for sub in subscriptions]
            self._targets[name] = _SendTarget(name, entities, duplicate_detection)
            return entities

    def entity(self, path: str) -> Entity:
        return self._entities[path]

    @property
    def entities(self) -> list[Entity]:
        return list(self._entities.values())

    def send(self, address: str, sent: SentMessage, origin: Origin) -> bool:
        """Send to a queue or topic; False when duplicate detection dropped it."""
        with self.lock:
            target = self._targets[address]
            now = self.clock()
            self.sent += 1
            if target.duplicate_detection and sent.message_id is not None:
                first = target.seen.get(sent.message_id)
                if first is not None and now - first < self.duplicate_detection_window:
                    self.dropped_duplicates += 1
                    return False
                target.seen[sent.message_id] = now
            self._sequence += 1
            for entity in target.entities:
                entity.enqueue(BrokerMessage(sent, origin, self._sequence, now))
            self.changed.notify_all()
            return True

    # -- views (take the lock) -----------------------------------------------------
    def available_count(self) -> int:
        with self.lock:
            return sum(e.available_count for e in self._entities.values())

    def active_count(self) -> int:
        with self.lock:
            return sum(e.active_count for e in self._entities.values())

    def next_lock_expiry(self) -> float | None:
        with self.lock:
            times = [t for e in self._entities.values() if (t := e.next_lock_expiry()) is not None]
            return min(times, default=None)

    def expire_locks(self) -> None:
        with self.lock:
            now = self.clock()
            for entity in self._entities.values():
                entity.expire_locks(now)
