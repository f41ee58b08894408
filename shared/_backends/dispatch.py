"""Dispatchers: send a committed key's outgoing messages to their broker.

A dispatcher runs after the transaction that recorded the messages committed, and again for
whatever is still pending when a copy arrives or the sweeper finds it, so a message can be
sent twice: it keeps the id it was recorded with, which Service Bus duplicate detection drops
within its window and the next consumer's dedup absorbs beyond it.

Errors: `DispatchUnavailableError` (throttled, unreachable, timed out: the broker may or may
not have the message; retry, never park) or `DispatchRejectedError` (no such entity, too
large, not authorised: retrying will not fix it; alert). Either way the messages stay pending.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any, Self

from shared._core.exceptions import DispatchRejectedError, DispatchUnavailableError
from shared._core.outbox import OutgoingMessage


def grouped[K](messages: Sequence[OutgoingMessage], key: Callable[[OutgoingMessage], K]
               ) -> list[tuple[K, list[OutgoingMessage]]]:
    """Messages grouped by `key`, groups in first-seen order, recorded order within each."""
    groups: dict[K, list[OutgoingMessage]] = {}
    for message in messages:
        groups.setdefault(key(message), []).append(message)
    return list(groups.items())


def by_destination(messages: Sequence[OutgoingMessage]) -> list[tuple[str, list[OutgoingMessage]]]:
    return grouped(messages, lambda m: m.destination)


def by_partition_key(messages: Sequence[OutgoingMessage]
                     ) -> list[tuple[str | None, list[OutgoingMessage]]]:
    """One hub's messages by partition key (an Event Hubs batch is one partition's)."""
    return grouped(messages, lambda m: m.partition_key)


# -- Service Bus -----------------------------------------------------------------------
def service_bus_message(message: OutgoingMessage) -> Any:
    """The azure-servicebus `ServiceBusMessage` for `message`, every recorded field carried."""
    from azure.servicebus import ServiceBusMessage

    properties: dict[str | bytes, Any] = {name: value for name, value in message.properties.items()}
    return ServiceBusMessage(
        message.body, message_id=message.message_id, content_type=message.content_type,
        correlation_id=message.correlation_id,
        application_properties=properties or None,
        session_id=message.session_id, partition_key=message.partition_key,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time)


def translate_service_bus_error(error: BaseException, destination: str) -> Exception:
    """A Service Bus SDK error as the library's transient or permanent dispatch error."""
    from azure.servicebus.exceptions import (
        MessageSizeExceededError,
        MessagingEntityDisabledError,
        MessagingEntityNotFoundError,
        ServiceBusAuthenticationError,
        ServiceBusAuthorizationError,
    )

    text = f"sending to {destination!r} failed: {type(error).__name__}: {error}"
    if isinstance(error, MessageSizeExceededError | MessagingEntityNotFoundError
                  | MessagingEntityDisabledError | ServiceBusAuthenticationError
                  | ServiceBusAuthorizationError | ValueError | TypeError):
        return DispatchRejectedError(text, error=error)
    return DispatchUnavailableError(text, error=error)


class ServiceBusSenders:
    """What the sync and the async Service Bus dispatchers share: the client and its senders.

    Opening a sender (an AMQP link) costs round trips, so senders are kept and reused, each
    by one dispatch at a time (a sender is not safe for concurrent sends); a sender whose
    send failed is closed and dropped, since its link may be the broken part.
    """

    def __init__(self, fully_qualified_namespace: str, credential: Any = None, *,
                 topics: Collection[str] = (), client: Any = None, **client_options: Any) -> None:
        self._topics = frozenset(topics)
        self._owned = client is None
        if client is None:
            client = self._client_class()(fully_qualified_namespace, credential, **client_options)
        self._client = client
        # Idle senders by destination (list append/pop are atomic: threads may share them).
        self._idle: dict[str, list[Any]] = {}

    @staticmethod
    def _client_class() -> Any:
        raise NotImplementedError

    @classmethod
    def from_connection_string(cls, conn_str: str, *, topics: Collection[str] = (),
                               **client_options: Any) -> Self:
        client = cls._client_class().from_connection_string(conn_str, **client_options)
        dispatcher = cls("", topics=topics, client=client)
        dispatcher._owned = True
        return dispatcher

    @classmethod
    def from_client(cls, client: Any, *, topics: Collection[str] = ()) -> Self:
        return cls("", topics=topics, client=client)

    def _take(self, destination: str) -> Any:
        """An idle sender of `destination`, or a new one."""
        with contextlib.suppress(IndexError):
            return self._idle.get(destination, []).pop()
        if destination in self._topics:
            return self._client.get_topic_sender(topic_name=destination)
        return self._client.get_queue_sender(queue_name=destination)

    def _give_back(self, destination: str, sender: Any) -> None:
        self._idle.setdefault(destination, []).append(sender)

    def _drain(self) -> list[Any]:
        """Every idle sender, forgotten (to close them)."""
        senders = [sender for idle in self._idle.values() for sender in idle]
        self._idle.clear()
        return senders


class ServiceBusDispatcher(ServiceBusSenders):
    """Sends to Service Bus queues and topics of one namespace (`<name>.servicebus.windows.net`).

    `topics` names the destinations that are topics (the rest are queues). A destination's
    messages go in as few sends as fit (`send_plan`); sessions, partition keys and scheduled
    enqueue are honoured.
    """

    @staticmethod
    def _client_class() -> Any:
        from azure.servicebus import ServiceBusClient

        return ServiceBusClient

    def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        for destination, group in by_destination(messages):
            try:
                sender = self._take(destination)
                try:
                    for send in send_plan(group):
                        sender.send_messages([service_bus_message(m) for m in send])
                except BaseException:
                    with contextlib.suppress(Exception):
                        sender.close()
                    raise
                self._give_back(destination, sender)
            except Exception as error:
                raise translate_service_bus_error(error, destination) from error

    def close(self) -> None:
        for sender in self._drain():
            with contextlib.suppress(Exception):
                sender.close()
        if self._owned:
            self._client.close()


# Service Bus Standard takes 256 KiB per send (a batch included); this leaves room
# for each message's AMQP headers beyond the body and properties counted here.
SEND_BYTES = 200 * 1024
_HEADER_ALLOWANCE = 1024


def send_plan(group: list[OutgoingMessage], *, limit: int = SEND_BYTES) -> list[list[OutgoingMessage]]:
    """One destination's messages cut into sends that fit one batch, in recorded order; a
    message over the limit goes alone (a Premium namespace takes more)."""
    plan: list[list[OutgoingMessage]] = []
    size = 0
    for message in group:
        weight = len(message.body) + _HEADER_ALLOWANCE + sum(
            len(str(k)) + len(str(v)) for k, v in message.properties.items())
        if not plan or size + weight > limit:
            plan.append([])
            size = 0
        plan[-1].append(message)
        size += weight
    return plan


# -- Event Hubs ------------------------------------------------------------------------
def event_data(message: OutgoingMessage) -> Any:
    """The azure-eventhub `EventData` for `message` (id, content type, correlation id, properties)."""
    from azure.eventhub import EventData

    event = EventData(message.body)
    event.message_id = message.message_id
    if message.content_type is not None:
        event.content_type = message.content_type
    if message.correlation_id is not None:
        event.correlation_id = message.correlation_id
    properties: dict[str | bytes, Any] = {name: value for name, value in message.properties.items()}
    event.properties = properties
    return event


def translate_event_hub_error(error: BaseException, destination: str) -> Exception:
    """An Event Hubs SDK error as the library's transient or permanent dispatch error."""
    from azure.eventhub.exceptions import AuthenticationError, EventDataError

    text = f"sending to event hub {destination!r} failed: {type(error).__name__}: {error}"
    if isinstance(error, AuthenticationError | EventDataError | ValueError | TypeError):
        return DispatchRejectedError(text, error=error)
    return DispatchUnavailableError(text, error=error)


class EventHubProducers:
    """What the sync and the async Event Hubs dispatchers share: a producer per hub, created
    on first use by the `producer` factory (`(event_hub_name) -> EventHubProducerClient`, the
    caller's) or by the dispatcher (then closed with it)."""

    def __init__(self, fully_qualified_namespace: str, credential: Any = None, *,
                 producer: Callable[[str], Any] | None = None, **client_options: Any) -> None:
        self._owned = producer is None
        if producer is None:
            producer_class = self._producer_class()

            def owned(name: str) -> Any:
                return producer_class(fully_qualified_namespace, name, credential, **client_options)
            producer = owned
        self._factory = producer
        self._producers: dict[str, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _producer_class() -> Any:
        raise NotImplementedError

    @classmethod
    def from_connection_string(cls, conn_str: str, **client_options: Any) -> Self:
        producer_class = cls._producer_class()
        dispatcher = cls("", producer=lambda name: producer_class.from_connection_string(
            conn_str, eventhub_name=name, **client_options))
        dispatcher._owned = True
        return dispatcher

    def _producer(self, name: str) -> Any:
        with self._lock:
            if name not in self._producers:
                self._producers[name] = self._factory(name)
            return self._producers[name]


class EventHubDispatcher(EventHubProducers):
    """Sends to event hubs of one namespace. The messages of one partition key go in one
    `send_batch` (an event hub batch is one partition's), so they stay in order."""

    @staticmethod
    def _producer_class() -> Any:
        from azure.eventhub import EventHubProducerClient

        return EventHubProducerClient

    def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        for destination, group in by_destination(messages):
            try:
                producer = self._producer(destination)
                for partition_key, part in by_partition_key(group):
                    producer.send_batch([event_data(m) for m in part], partition_key=partition_key)
            except Exception as error:
                raise translate_event_hub_error(error, destination) from error

    def close(self) -> None:
        if self._owned:
            for producer in self._producers.values():
                producer.close()
        self._producers.clear()
