"""Dead-letter queues behind one small interface: read them, resubmit with identity, complete.

A resubmission is a new message carrying the dead-lettered one's identity
and content: the same MessageId, body, content type, correlation id, subject,
session/partition key and application properties (less the two the broker
adds when dead-lettering). The consumer's dedup then decides: processed once,
or absorbed as a duplicate when the effect had in fact happened.

Two implementations:

* `ServiceBusDeadLetters`: azure-servicebus against Azure (a namespace and
  `DefaultAzureCredential`) or the Docker emulator (a connection string). The
  dead-lettered copy is locked first (received from the dead-letter queue by
  sequence number), the copy sent, then the dead-lettered one completed; any
  failure abandons what was locked, so nothing is lost.
* `SimulatorDeadLetters`: the delivery simulator's in-memory broker (tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared._core.cloudevents import as_text

#: Application properties Service Bus adds to a dead-lettered message: not the producer's.
DEAD_LETTER_PROPERTIES = frozenset({"DeadLetterReason", "DeadLetterErrorDescription"})


class NotInDeadLetterQueueError(LookupError):
    """The message is no longer in the dead-letter queue (completed or locked elsewhere)."""


class ResubmitDroppedError(RuntimeError):
    """The broker's duplicate detection dropped the resubmitted copy; nothing was completed."""


@dataclass(frozen=True)
class EntityRef:
    """Where a consumer receives from: a queue, or a topic subscription."""

    consumer: str  # the app's consumer (function) name
    queue_or_topic: str
    subscription: str | None = None

    @property
    def is_topic(self) -> bool:
        return self.subscription is not None

    @property
    def path(self) -> str:
        if self.subscription is None:
            return self.queue_or_topic
        return f"{self.queue_or_topic}/subscriptions/{self.subscription}"


@dataclass(frozen=True)
class DeadLetteredMessage:
    """One message in a dead-letter queue, as the tool shows and resubmits it."""

    entity: EntityRef
    sequence_number: int
    message_id: str | None
    body: bytes
    reason: str
    description: str
    enqueued_at: float | None  # epoch seconds
    delivery_count: int
    content_type: str | None = None
    correlation_id: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)  # the producer's
    subject: str | None = None
    session_id: str | None = None
    partition_key: str | None = None
    reply_to: str | None = None
    reply_to_session_id: str | None = None
    to: str | None = None


class DeadLetterSource(Protocol):
    """What the replay tool needs from a broker."""

    @property
    def entities(self) -> Sequence[EntityRef]: ...
    @property
    def duplicate_detection_window(self) -> float:  # seconds the broker drops a MessageId it has seen
        ...

    def peek(self, entity: EntityRef, *, max_messages: int = 1000) -> list[DeadLetteredMessage]:
        """The entity's dead-lettered messages, oldest first; nothing is locked or removed."""
        ...

    def resubmit_and_complete(self, message: DeadLetteredMessage) -> None:
        """Send a copy with the original identity to the queue/topic, then complete the
        dead-lettered one. NotInDeadLetterQueueError / ResubmitDroppedError say why not."""
        ...

    def complete(self, message: DeadLetteredMessage) -> None:
        """Remove the dead-lettered message without resubmitting (a discard)."""
        ...

    def close(self) -> None: ...


def _str_or_none(value: Any) -> str | None:
    value = as_text(value)
    return None if value is None else str(value)


def from_received(entity: EntityRef, message: Any) -> DeadLetteredMessage:
    """A view of an `azure.servicebus.ServiceBusReceivedMessage` read from a dead-letter queue."""
    body = message.body
    if isinstance(body, (bytes, bytearray)):
        raw = bytes(body)
    elif isinstance(body, str):
        raw = body.encode("utf-8")
    else:
        raw = b"".join(bytes(part) for part in body)  # AMQP data sections
    properties = {str(as_text(k)): as_text(v) for k, v in (message.application_properties or {}).items()}
    enqueued = message.enqueued_time_utc
    return DeadLetteredMessage(
        entity=entity, sequence_number=int(message.sequence_number), message_id=_str_or_none(
            message.message_id), body=raw,
        reason=str(message.dead_letter_reason or ""),
        description=str(message.dead_letter_error_description or ""),
        enqueued_at=enqueued.timestamp() if enqueued is not None else None,
        delivery_count=int(message.delivery_count or 0),
        content_type=_str_or_none(message.content_type),
        correlation_id=_str_or_none(message.correlation_id),
        application_properties={k: v for k, v in properties.items()
                                if k not in DEAD_LETTER_PROPERTIES},
        subject=_str_or_none(message.subject), session_id=_str_or_none(message.session_id),
        partition_key=_str_or_none(message.partition_key), reply_to=_str_or_none(message.reply_to),
        reply_to_session_id=_str_or_none(message.reply_to_session_id),
        to=_str_or_none(message.to))


def resubmission(message: DeadLetteredMessage) -> Any:
    """The `azure.servicebus.ServiceBusMessage` to send: the dead-lettered message's identity."""
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(
        message.body, message_id=message.message_id, content_type=message.content_type,
        correlation_id=message.correlation_id,
        application_properties=_properties(message.application_properties),
        subject=message.subject, session_id=message.session_id,
        partition_key=message.partition_key, reply_to=message.reply_to,
        reply_to_session_id=message.reply_to_session_id, to=message.to)


class ServiceBusDeadLetters:
    """Dead-letter queues of a real namespace (Azure or the Docker emulator) via azure-servicebus.

    Rights needed: receive (peek, lock, complete) on the dead-letter queues and
    send to the queues/topics: the Azure Service Bus Data Receiver and Data
    Sender roles.
    """

    def __init__(self, client: Any, entities: Sequence[EntityRef], *,
                 duplicate_detection_window: float = 600.0, max_scan: int = 5000,
                 max_wait_time: float = 5.0) -> None:
        self.client = client
        self.entities = list(entities)
        self.duplicate_detection_window = duplicate_detection_window
        self.max_scan = max_scan
        self.max_wait_time = max_wait_time

    @classmethod
    def connect(cls, entities: Sequence[EntityRef], *, connection_string: str | None = None,
                namespace: str | None = None, credential: Any = None, **options: Any
                ) -> ServiceBusDeadLetters:
        """From a connection string (Docker emulator) or a namespace with an Entra credential."""
        from azure.servicebus import ServiceBusClient

        if connection_string:
            client = ServiceBusClient.from_connection_string(connection_string)
        elif namespace:
            if credential is None:
                from azure.identity import DefaultAzureCredential

                credential = DefaultAzureCredential()
            client = ServiceBusClient(namespace, credential)
        else:
            raise ValueError("a Service Bus connection string or namespace is needed")
        return cls(client, entities, **options)

    def _receiver(self, entity: EntityRef, **options: Any) -> Any:
        from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

        options = {"sub_queue": ServiceBusSubQueue.DEAD_LETTER,
                   "receive_mode": ServiceBusReceiveMode.PEEK_LOCK, **options}
        if entity.subscription is None:
            return self.client.get_queue_receiver(entity.queue_or_topic, **options)
        return self.client.get_subscription_receiver(entity.queue_or_topic, entity.subscription,
                                                     **options)

    def _sender(self, entity: EntityRef) -> Any:
        if entity.is_topic:
            return self.client.get_topic_sender(entity.queue_or_topic)
        return self.client.get_queue_sender(entity.queue_or_topic)

    def peek(self, entity: EntityRef, *, max_messages: int = 1000) -> list[DeadLetteredMessage]:
        found: list[DeadLetteredMessage] = []
        with self._receiver(entity) as receiver:
            sequence = 0
            while len(found) < max_messages:
                batch = receiver.peek_messages(max_message_count=min(250, max_messages - len(found)),
                                               sequence_number=sequence)
                if not batch:
                    break
                for message in batch:
                    found.append(from_received(entity, message))
                    sequence = max(sequence, int(message.sequence_number) + 1)
        return found

    def _locked(self, receiver: Any, sequence_number: int) -> tuple[Any | None, list[Any]]:
        """Lock dead-lettered messages until the wanted one comes; the others stay locked
        (so the next receive moves on) and are abandoned by the caller."""
        held: list[Any] = []
        scanned = 0
        while scanned < self.max_scan:
            batch = receiver.receive_messages(max_message_count=50, max_wait_time=self.max_wait_time)
            if not batch:
                return None, held
            for message in batch:
                scanned += 1
                if int(message.sequence_number) == sequence_number:
                    held.extend(m for m in batch if m is not message and m not in held)
                    return message, held
                held.append(message)
        return None, held

    def _settle(self, message: DeadLetteredMessage, *, resubmit: bool) -> None:
        with self._receiver(message.entity, prefetch_count=0) as receiver:
            found, held = self._locked(receiver, message.sequence_number)
            try:
                if found is None:
                    raise NotInDeadLetterQueueError(
                        f"{message.entity.path}: sequence number {message.sequence_number} is not "
                        "in the dead-letter queue (completed, or locked by someone else)")
                if resubmit:
                    try:
                        with self._sender(message.entity) as sender:
                            sender.send_messages(resubmission(from_received(message.entity, found)))
                    except BaseException:
                        held.append(found)  # not sent: leave it dead-lettered
                        raise
                receiver.complete_message(found)
            finally:
                for other in held:
                    with contextlib.suppress(Exception):  # the lock runs out anyway
                        receiver.abandon_message(other)

    def resubmit_and_complete(self, message: DeadLetteredMessage) -> None:
        self._settle(message, resubmit=True)

    def complete(self, message: DeadLetteredMessage) -> None:
        self._settle(message, resubmit=False)

    def close(self) -> None:
        self.client.close()


class SimulatorDeadLetters:
    """The delivery simulator's broker (`simulator.servicebus.ServiceBusNamespace`)."""

    def __init__(self, namespace: Any, entities: Sequence[EntityRef]) -> None:
        self.namespace = namespace
        self.entities = list(entities)
        self.duplicate_detection_window = float(namespace.duplicate_detection_window)

    def _view(self, entity: EntityRef, message: Any) -> DeadLetteredMessage:
        sent = message.sent
        return DeadLetteredMessage(
            entity=entity, sequence_number=message.sequence_number, message_id=sent.message_id,
            body=bytes(sent.body), reason=message.dead_letter_reason or "",
            description=message.dead_letter_description or "", enqueued_at=message.enqueued_at,
            delivery_count=message.delivery_count, content_type=sent.content_type,
            correlation_id=sent.correlation_id,
            application_properties=dict(sent.application_properties or {}))

    def peek(self, entity: EntityRef, *, max_messages: int = 1000) -> list[DeadLetteredMessage]:
        with self.namespace.lock:
            letters = list(self.namespace.entity(entity.path).dead_letters)
        return [self._view(entity, m) for m in letters[:max_messages]]

    def _take(self, message: DeadLetteredMessage) -> tuple[Any, Any]:
        entity = self.namespace.entity(message.entity.path)
        for held in entity.dead_letters:
            if held.sequence_number == message.sequence_number:
                return entity, held
        raise NotInDeadLetterQueueError(f"{message.entity.path}: sequence number "
                                        f"{message.sequence_number} is not in the dead-letter queue")

    def resubmit_and_complete(self, message: DeadLetteredMessage) -> None:
        from simulator.host_inputs import SentMessage

        with self.namespace.lock:
            entity, held = self._take(message)
            current = self._view(message.entity, held)
            copy = SentMessage(current.body, message_id=current.message_id,
                               correlation_id=current.correlation_id,
                               content_type=current.content_type,
                               application_properties=dict(current.application_properties) or None)
            if not self.namespace.send(message.entity.queue_or_topic, copy, held.origin):
                raise ResubmitDroppedError(
                    f"duplicate detection on {message.entity.queue_or_topic} dropped MessageId "
                    f"{current.message_id}; the dead-lettered copy was kept")
            entity.dead_letters.remove(held)
            held.state, held.settled_by = "completed", "replay"

    def complete(self, message: DeadLetteredMessage) -> None:
        with self.namespace.lock:
            entity, held = self._take(message)
            entity.dead_letters.remove(held)
            held.state, held.settled_by = "completed", "discard"

    def close(self) -> None:
        pass


def _properties(properties: Mapping[str, Any]) -> dict[str | bytes, Any] | None:
    """Application properties as the SDK's message takes them (None when there are none)."""
    return {str(name): value for name, value in properties.items()} or None
