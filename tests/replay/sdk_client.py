"""The azure-servicebus client surface the replay tool uses, served by the simulator's broker.

`replay.deadletters.ServiceBusDeadLetters` is the code that runs against Azure
and the Docker emulator; no broker of that kind runs here, so these tests drive
it through the same calls (dead-letter receivers that peek, receive under a
lock, complete and abandon; queue and topic senders) answered by the in-memory
broker. What it receives are real `azure.servicebus.ServiceBusReceivedMessage`
objects, decoded from AMQP by the Functions extension's converter, with the
dead-letter reason and description as the broker stores them (application
properties); what it sends are real `ServiceBusMessage` objects, read back field
by field. Like the real broker, a send that duplicate detection drops is
accepted silently.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from simulator.host_inputs import SentMessage, service_bus_message
from simulator.servicebus import Origin, ServiceBusNamespace


class SimulatedServiceBusClient:
    def __init__(self, namespace: ServiceBusNamespace, clock: Any) -> None:
        self.namespace = namespace
        self.clock = clock
        self.origins: dict[tuple[str | None, bytes], Origin] = {}
        self.sent: list[Any] = []  # every ServiceBusMessage handed to a sender
        self.closed = False

    def get_queue_receiver(self, queue_name: str, **options: Any) -> DeadLetterReceiver:
        return DeadLetterReceiver(self, queue_name, options)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str,
                                  **options: Any) -> DeadLetterReceiver:
        return DeadLetterReceiver(self, f"{topic_name}/subscriptions/{subscription_name}", options)

    def get_queue_sender(self, queue_name: str) -> Sender:
        return Sender(self, queue_name)

    def get_topic_sender(self, topic_name: str) -> Sender:
        return Sender(self, topic_name)

    def close(self) -> None:
        self.closed = True


class DeadLetterReceiver:
    def __init__(self, client: SimulatedServiceBusClient, path: str, options: dict[str, Any]) -> None:
        from azure.servicebus import ServiceBusSubQueue

        assert options.get("sub_queue") == ServiceBusSubQueue.DEAD_LETTER, "dead-letter queue only"
        self.client = client
        self.entity = client.namespace.entity(path)
        self.locked: dict[str, Any] = {}  # lock token -> broker message

    def __enter__(self) -> DeadLetterReceiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.locked.clear()  # closing a receiver releases its locks

    def _received(self, message: Any, lock_token: uuid.UUID) -> Any:
        sent = message.sent
        properties = {**(sent.application_properties or {}),
                      "DeadLetterReason": message.dead_letter_reason or "",
                      "DeadLetterErrorDescription": message.dead_letter_description or ""}
        view = SentMessage(sent.body, message_id=sent.message_id, correlation_id=sent.correlation_id,
                           content_type=sent.content_type, application_properties=properties)
        self.client.origins[(sent.message_id, bytes(sent.body))] = message.origin
        return service_bus_message(view, delivery_count=message.delivery_count,
                                   sequence_number=message.sequence_number, lock_token=lock_token,
                                   enqueued_time=datetime.fromtimestamp(message.enqueued_at, UTC))

    def _letters(self) -> list[Any]:
        with self.client.namespace.lock:
            return sorted(self.entity.dead_letters, key=lambda m: m.sequence_number)

    def peek_messages(self, max_message_count: int = 1, *, sequence_number: int = 0,
                      **_: Any) -> list[Any]:
        letters = [m for m in self._letters() if m.sequence_number >= sequence_number]
        return [self._received(m, uuid.uuid4()) for m in letters[:max_message_count]]

    def receive_messages(self, max_message_count: int = 1, max_wait_time: float | None = None
                         ) -> list[Any]:
        held = {id(m) for m in self.locked.values()}
        batch = []
        for message in self._letters():
            if len(batch) >= max_message_count:
                break
            if id(message) not in held:
                token = uuid.uuid4()
                self.locked[str(token)] = message
                batch.append(self._received(message, token))
        return batch

    def complete_message(self, message: Any) -> None:
        held = self.locked.pop(str(message.lock_token))
        with self.client.namespace.lock:
            self.entity.dead_letters.remove(held)
            held.state, held.settled_by = "completed", "complete"

    def abandon_message(self, message: Any) -> None:
        self.locked.pop(str(message.lock_token))


class Sender:
    def __init__(self, client: SimulatedServiceBusClient, address: str) -> None:
        self.client = client
        self.address = address

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def send_messages(self, message: Any) -> None:
        self.client.sent.append(message)
        body = b"".join(message.body)
        properties = {str(k): v for k, v in (message.application_properties or {}).items()}
        sent = SentMessage(body, message_id=message.message_id, correlation_id=message.correlation_id,
                           content_type=message.content_type, application_properties=properties or None)
        origin = self.client.origins.get((message.message_id, body), Origin("unknown"))
        self.client.namespace.send(self.address, sent, origin)  # dropped silently by detection
