"""Dispatchers: the SDK objects they build, how they group sends, and their error kinds.

No broker runs here. The Service Bus dispatcher is driven through the
azure-servicebus client calls it makes (senders per entity, `send_messages`),
answered by the simulator's broker, whose duplicate detection drops a re-send
as the real one does; what it sends are real `ServiceBusMessage` objects,
read back field by field. The Event Hubs dispatcher is driven through a
producer that keeps the real `EventData` objects and partition keys it was
given.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from azure.eventhub.exceptions import ConnectError, EventDataError
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusServerBusyError,
)

from shared._backends import dispatch, dispatch_aio
from shared._core.exceptions import DispatchRejectedError, DispatchUnavailableError
from shared._core.keys import DedupKey
from shared._core.outbox import outgoing
from simulator.host_inputs import SentMessage
from simulator.servicebus import Origin, ServiceBusNamespace
from tests.support.doubles import AsyncFailingDispatcher, FailingDispatcher

KEY = DedupKey("orders", "ORD-9")
WHEN = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class _BrokerClientBase:
    """The azure-servicebus client surface a dispatcher uses, sending into the simulated broker
    (`close` differs: the aio client's is awaited)."""

    def __init__(self, namespace: ServiceBusNamespace, fail: list[Exception] | None = None) -> None:
        self.namespace = namespace
        self.fail = fail or []
        self.sends: list[tuple[str, str, list[Any]]] = []  # (kind, entity, ServiceBusMessages)
        self.opened: list[Sender] = []  # every sender link opened, in order
        self.closed = False

    def get_queue_sender(self, queue_name: str) -> Sender:
        return Sender(self, "queue", queue_name)

    def get_topic_sender(self, topic_name: str) -> Sender:
        return Sender(self, "topic", topic_name)


class BrokerClient(_BrokerClientBase):
    def close(self) -> None:
        self.closed = True


class Sender:
    """A sender link: the client counts the ones opened; `close` is awaited on the aio client."""

    def __init__(self, client: _BrokerClientBase, kind: str, entity: str) -> None:
        self.client, self.kind, self.entity = client, kind, entity
        self.closed = False
        client.opened.append(self)

    def close(self) -> Any:
        self.closed = True
        if isinstance(self.client, AsyncBrokerClient):
            async def closed() -> None:
                pass
            return closed()
        return None

    def _send(self, messages: list[Any]) -> None:
        if self.client.fail:
            raise self.client.fail.pop(0)
        self.client.sends.append((self.kind, self.entity, messages))
        for message in messages:
            body = b"".join(message.body)
            sent = SentMessage(body, message_id=message.message_id, correlation_id=message.correlation_id,
                               content_type=message.content_type,
                               application_properties={str(k): v for k, v in
                                                       (message.application_properties or {}).items()})
            self.client.namespace.send(self.entity, sent, Origin(message.message_id))

    def send_messages(self, messages: list[Any]) -> Any:
        if isinstance(self.client, AsyncBrokerClient):
            async def send() -> None:
                self._send(messages)
            return send()
        self._send(messages)
        return None


class AsyncBrokerClient(_BrokerClientBase):
    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def namespace() -> ServiceBusNamespace:
    broker = ServiceBusNamespace(Clock(), duplicate_detection_window=600.0)
    broker.create_queue("orders-out")
    broker.create_topic("notifications", ["notify", "audit"])
    return broker


def messages() -> list[Any]:
    return [
        outgoing(KEY, "notifications", {"n": 0}, ordinal=0, correlation_id="c-1",
                 properties={"type": "OrderAccepted"}, session_id="S-1"),
        outgoing(KEY, "orders-out", b"raw", ordinal=0, partition_key="P-1", scheduled_enqueue_time=WHEN),
        outgoing(KEY, "notifications", {"n": 1}, ordinal=1),
    ]


def run(dispatcher: Any, batch: list[Any]) -> None:
    result = dispatcher.dispatch(batch)
    if asyncio.iscoroutine(result):
        asyncio.run(result)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return request.param


def service_bus(flavour: str, client: _BrokerClientBase) -> Any:
    module = dispatch if flavour == "sync" else dispatch_aio
    return module.ServiceBusDispatcher.from_client(client, topics={"notifications"})


def client_for(flavour: str, namespace: ServiceBusNamespace, fail: list[Exception] | None = None
               ) -> _BrokerClientBase:
    return (BrokerClient if flavour == "sync" else AsyncBrokerClient)(namespace, fail)


def test_service_bus_sends_every_recorded_field_one_send_per_destination(namespace, flavour):
    client = client_for(flavour, namespace)
    run(service_bus(flavour, client), messages())
    assert [(kind, entity, len(batch)) for kind, entity, batch in client.sends] == [
        ("topic", "notifications", 2), ("queue", "orders-out", 1)]
    first, scheduled = client.sends[0][2][0], client.sends[1][2][0]
    assert first.message_id == messages()[0].message_id
    assert first.session_id == "S-1" and first.correlation_id == "c-1"
    assert first.content_type == "application/json"
    assert first.application_properties["type"] == "OrderAccepted"
    assert first.application_properties["Idempotency-Key"] == messages()[0].properties["Idempotency-Key"]
    assert scheduled.scheduled_enqueue_time_utc == WHEN
    assert scheduled.partition_key == "P-1"
    assert [m.message_id for m in client.sends[0][2]] == [messages()[0].message_id,
                                                          messages()[2].message_id]
    assert {e.path: e.available_count for e in namespace.entities} == {
        "orders-out": 1, "notifications/subscriptions/notify": 2, "notifications/subscriptions/audit": 2}


def test_a_re_dispatch_is_absorbed_by_the_destinations_duplicate_detection(namespace, flavour):
    client = client_for(flavour, namespace)
    dispatcher = service_bus(flavour, client)
    run(dispatcher, messages())
    run(dispatcher, messages())  # e.g. the answer was lost and the copy re-sent it
    assert namespace.dropped_duplicates == 3
    assert sum(e.available_count for e in namespace.entities) == 5


def close(dispatcher: Any) -> None:
    result = dispatcher.close()
    if asyncio.iscoroutine(result):
        asyncio.run(result)


def test_senders_are_reused_and_a_failed_one_is_dropped(namespace, flavour):
    """A sender link costs round trips to open: dispatches to one destination reuse it; a
    sender whose send failed is closed and replaced; closing the dispatcher closes the idle."""
    client = client_for(flavour, namespace, fail=[])
    dispatcher = service_bus(flavour, client)
    batch = messages()
    run(dispatcher, batch)
    run(dispatcher, batch)
    opened = len(client.opened)
    assert opened == len({m.destination for m in batch})  # one per destination, not per call
    client.fail.append(ConnectionError("link detached"))
    with pytest.raises(DispatchUnavailableError):
        run(dispatcher, batch[:1])
    broken = [sender for sender in client.opened if sender.closed]
    assert len(broken) == 1 and broken[0].entity == batch[0].destination
    run(dispatcher, batch[:1])
    assert len(client.opened) == opened + 1  # the broken link was replaced
    close(dispatcher)
    assert all(sender.closed for sender in client.opened)


@pytest.mark.parametrize(("error", "kind"), [
    (ServiceBusServerBusyError(message="busy"), DispatchUnavailableError),
    (OperationTimeoutError(message="timed out"), DispatchUnavailableError),
    (MessagingEntityNotFoundError(message="no such entity"), DispatchRejectedError),
])
def test_service_bus_errors_become_the_librarys_two_kinds(namespace, flavour, error, kind):
    client = client_for(flavour, namespace, fail=[error])
    with pytest.raises(kind) as raised:
        run(service_bus(flavour, client), messages())
    assert raised.value.__cause__ is error


def test_a_large_destination_is_cut_into_sends_that_fit():
    big = [outgoing(KEY, "q", b"x" * 90_000, ordinal=n) for n in range(5)]
    plan = dispatch.send_plan(big)
    assert [len(send) for send in plan] == [2, 2, 1]
    assert [m for send in plan for m in send] == big


class _ProducerBase:
    def __init__(self, name: str, calls: list[tuple[str, str | None, list[Any]]],
                 fail: list[Exception]) -> None:
        self.name, self.calls, self.fail = name, calls, fail
        self.closed = False

    def _send(self, events: list[Any], partition_key: str | None) -> None:
        if self.fail:
            raise self.fail.pop(0)
        self.calls.append((self.name, partition_key, events))



class Producer(_ProducerBase):
    def send_batch(self, events: list[Any], *, partition_key: str | None = None) -> Any:
        self._send(events, partition_key)

    def close(self) -> None:
        self.closed = True


class AsyncProducer(_ProducerBase):
    async def send_batch(self, events: list[Any], *, partition_key: str | None = None) -> Any:
        self._send(events, partition_key)

    async def close(self) -> None:
        self.closed = True


def event_hub(flavour: str, fail: list[Exception] | None = None) -> tuple[Any, list[Any], list[Any]]:
    calls: list[tuple[str, str | None, list[Any]]] = []
    producers: list[_ProducerBase] = []
    kind = Producer if flavour == "sync" else AsyncProducer

    def producer(name: str) -> _ProducerBase:
        producers.append(kind(name, calls, fail if fail is not None else []))
        return producers[-1]

    module = dispatch if flavour == "sync" else dispatch_aio
    return module.EventHubDispatcher("", producer=producer), calls, producers


def test_event_hubs_batches_by_partition_key_in_recorded_order(flavour):
    dispatcher, calls, producers = event_hub(flavour)
    batch = [outgoing(KEY, "balances", {"n": n}, ordinal=n, partition_key=key, correlation_id="c")
             for n, key in enumerate(["A", "B", "A", None])]
    run(dispatcher, batch)
    assert [(hub, key, [e.body_as_json()["n"] for e in events]) for hub, key, events in calls] == [
        ("balances", "A", [0, 2]), ("balances", "B", [1]), ("balances", None, [3])]
    event = calls[0][2][0]
    assert event.message_id == batch[0].message_id and event.correlation_id == "c"
    assert event.content_type == "application/json"
    assert event.properties["Idempotency-Key"] == batch[0].properties["Idempotency-Key"]
    assert len(producers) == 1  # one producer per hub, reused


@pytest.mark.parametrize(("error", "kind"), [
    (ConnectError("down"), DispatchUnavailableError),
    (EventDataError("too large"), DispatchRejectedError),
])
def test_event_hubs_errors_become_the_librarys_two_kinds(flavour, error, kind):
    dispatcher, _, _ = event_hub(flavour, fail=[error])
    with pytest.raises(kind):
        run(dispatcher, [outgoing(KEY, "balances", {}, ordinal=0)])


def test_in_memory_dispatcher_fails_before_or_after_sending(flavour):
    memory = FailingDispatcher() if flavour == "sync" else AsyncFailingDispatcher()
    batch = [outgoing(KEY, "q", b"", ordinal=0)]
    memory.fail_next()
    with pytest.raises(DispatchUnavailableError):
        run(memory, batch)
    assert memory.sent == []
    memory.accept_then_fail_next()
    with pytest.raises(DispatchUnavailableError):
        run(memory, batch)
    assert memory.ids() == [batch[0].message_id]
    run(memory, batch)
    assert memory.calls == 3 and len(memory.sent) == 2
