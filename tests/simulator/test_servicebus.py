"""The in-memory Service Bus: PeekLock, lock expiry, delivery count, DLQ, duplicate detection, topics."""

from __future__ import annotations

import pytest

from simulator.clock import SimClock
from simulator.host_inputs import SentMessage
from simulator.servicebus import (
    MAX_DELIVERY_COUNT_EXCEEDED,
    MessageLockLostError,
    Origin,
    ServiceBusNamespace,
)


@pytest.fixture
def clock():
    return SimClock(start=1_800_000_000.0)


@pytest.fixture
def bus(clock):
    namespace = ServiceBusNamespace(clock, lock_duration=60, max_delivery_count=3,
                                    duplicate_detection_window=600)
    namespace.create_queue("orders")
    namespace.create_topic("notifications", ["notify", "audit"])
    return namespace


def send(bus, message_id="m-1", address="orders", body=b"{}"):
    return bus.send(address, SentMessage(body, message_id=message_id), Origin(f"x:{message_id}"))


def test_receive_locks_and_counts_deliveries_and_complete_removes(bus, clock):
    send(bus)
    queue = bus.entity("orders")
    first = queue.receive(clock())
    assert first.delivery_count == 1 and queue.receive(clock()) is None  # locked: not visible
    queue.complete(first.lock_token, clock())
    assert queue.active_count == 0 and queue.completed == 1


def test_abandon_makes_the_message_available_at_once_with_a_higher_delivery_count(bus, clock):
    send(bus)
    queue = bus.entity("orders")
    first = queue.receive(clock())
    queue.abandon(first.lock_token, clock())
    second = queue.receive(clock())
    assert second.message is first.message and second.delivery_count == 2
    assert second.lock_token != first.lock_token


def test_expired_lock_redelivers_and_the_slow_consumer_cannot_settle(bus, clock):
    send(bus)
    queue = bus.entity("orders")
    slow = queue.receive(clock())
    clock.advance(59)
    assert queue.receive(clock()) is None
    clock.advance(2)
    copy = queue.receive(clock())  # redelivered while the first consumer may still be working
    assert copy.delivery_count == 2
    with pytest.raises(MessageLockLostError):
        queue.complete(slow.lock_token, clock())
    queue.complete(copy.lock_token, clock())
    assert queue.completed == 1 and queue.lock_losses == 1


def test_lock_taken_back_mid_processing_is_redelivered_at_once(bus, clock):
    send(bus)
    queue = bus.entity("orders")
    first = queue.receive(clock())
    assert queue.take_lock_back(first.lock_token)
    assert queue.receive(clock()).delivery_count == 2
    with pytest.raises(MessageLockLostError):
        queue.abandon(first.lock_token, clock())


def test_max_delivery_count_dead_letters_with_the_broker_reason(bus, clock):
    send(bus)
    queue = bus.entity("orders")
    for _ in range(3):
        queue.abandon(queue.receive(clock()).lock_token, clock())
    assert queue.receive(clock()) is None
    [letter] = queue.dead_letters
    assert letter.dead_letter_reason == MAX_DELIVERY_COUNT_EXCEEDED and letter.delivery_count == 3
    assert "3 delivery attempts" in letter.dead_letter_description


def test_lock_expiry_counts_towards_max_delivery_count(bus, clock):
    send(bus)
    queue = bus.entity("orders")
    for _ in range(3):
        queue.receive(clock())
        clock.advance(61)
    bus.expire_locks()
    assert [m.dead_letter_reason for m in queue.dead_letters] == [MAX_DELIVERY_COUNT_EXCEEDED]


def test_explicit_dead_letter_keeps_reason_and_description(bus, clock):
    send(bus)
    queue = bus.entity("orders")
    delivery = queue.receive(clock())
    queue.deadletter(delivery.lock_token, clock(), "IdempotencyKeyConflict", "hashes differ")
    [letter] = queue.dead_letters
    assert (letter.dead_letter_reason, letter.dead_letter_description) == (
        "IdempotencyKeyConflict", "hashes differ")
    assert letter.settled_by == "deadletter"


def test_duplicate_detection_drops_a_resend_inside_the_window_only(bus, clock):
    assert send(bus, "m-1")
    clock.advance(599)
    assert not send(bus, "m-1")  # the producer sees success; the broker drops it
    clock.advance(2)
    assert send(bus, "m-1")  # past the window: a second copy for the consumer to absorb
    assert bus.entity("orders").available_count == 2 and bus.dropped_duplicates == 1


def test_topic_copies_to_each_subscription_with_its_own_lock_and_count(bus, clock):
    send(bus, "n-1", address="notifications")
    notify = bus.entity("notifications/subscriptions/notify")
    audit = bus.entity("notifications/subscriptions/audit")
    got = notify.receive(clock())
    notify.abandon(got.lock_token, clock())
    assert notify.receive(clock()).delivery_count == 2
    assert audit.receive(clock()).delivery_count == 1


def test_messages_are_delivered_in_sequence_order(bus, clock):
    for n in range(5):
        send(bus, f"m-{n}")
    queue = bus.entity("orders")
    ids = [queue.receive(clock()).message.sent.message_id for _ in range(5)]
    assert ids == [f"m-{n}" for n in range(5)]
