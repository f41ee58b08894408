"""The data the Functions host sends a Python worker for this app's triggers, as plain values.

`local_stack.worker` wraps these into the host-worker messages; the delivery
simulator and the tests describe deliveries with `SentMessage` / `SentEvent`.

* **Service Bus, SDK-type binding** (`ServiceBusReceivedMessage` annotation):
  the host sends model binding data (source `AzureServiceBusReceivedMessage`)
  whose content is the message's lock token (16 bytes, .NET GUID byte order),
  the marker `x-opt-lock-token`, then the AMQP-encoded message; this is the
  layout the servicebus extension's converter decodes.
* **Event Hubs, cardinality many**: one collection of bodies plus trigger
  metadata describing the batch: `PartitionContext`, and per event
  `PropertiesArray`, `SystemPropertiesArray` (SequenceNumber, Offset,
  PartitionKey, EnqueuedTimeUtc), `SequenceNumberArray`, `OffsetArray`,
  `PartitionKeyArray`, `EnqueuedTimeUtcArray`.
* **Storage queue** (`QueueMessage`): the message text (decoded from base64 by the host,
  per host.json `messageEncoding`) as a string, plus trigger metadata `QueueTrigger`, `Id`,
  `DequeueCount`, `InsertionTime`, `ExpirationTime`, `NextVisibleTime`, `PopReceipt` (the
  names azure.functions' `QueueMessageInConverter` reads).
* **Timer**: the timer info as JSON (`Schedule`, `ScheduleStatus`, `IsPastDue`).

Metadata values are plain Python values here; `local_stack.worker` converts
them as the host's RPC conversion does (strings as string, a string array as
collection_string, a long array as collection_sint64, a double as double,
anything else — ints, dates, objects — as JSON).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

LOCK_TOKEN_MARKER = b"x-opt-lock-token"
SERVICE_BUS_SOURCE = "AzureServiceBusReceivedMessage"
MODEL_BINDING_CONTENT_TYPE = "application/octet-stream"
MODEL_BINDING_VERSION = "1.0"


@dataclass(frozen=True)
class SentMessage:
    """What a producer put on a queue or topic."""

    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    content_type: str | None = "application/json"
    application_properties: dict[str, Any] | None = None


#: When a test's hub started taking events: an event without its own enqueued time was enqueued
#: `sequence_number` milliseconds after it. The hub stamps an event once, so a replay carries the
#: same time as the first delivery (a hub recreated later gives its events later times).
HUB_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class SentEvent:
    """What a producer put on an event hub partition (with the broker's numbering)."""

    body: bytes
    sequence_number: int
    properties: dict[str, Any] | None = None
    partition_key: str | None = None
    offset: int | None = None
    enqueued_time: datetime | None = None
    content_type: str | None = None

    @property
    def enqueued_at(self) -> datetime:
        """The enqueued time the hub gave it (see `HUB_EPOCH` for events without one)."""
        return self.enqueued_time or HUB_EPOCH + timedelta(milliseconds=self.sequence_number)


def service_bus_content(sent: SentMessage, *, lock_token: uuid.UUID, delivery_count: int = 1,
                        sequence_number: int = 1, enqueued_time: datetime | None = None) -> bytes:
    """The model binding data content of one received message (lock token + AMQP message)."""
    import uamqp  # the servicebus extension's own AMQP codec (a dependency of the extension)
    from uamqp.message import MessageHeader, MessageProperties

    header = MessageHeader()
    header.delivery_count = delivery_count
    message = uamqp.Message(
        body=sent.body,
        properties=MessageProperties(message_id=sent.message_id, correlation_id=sent.correlation_id,
                                     content_type=sent.content_type),
        application_properties=sent.application_properties or None,
        header=header,
    )
    enqueued = enqueued_time or datetime.now(UTC)
    message.annotations = {b"x-opt-enqueued-time": int(enqueued.timestamp() * 1000),
                           b"x-opt-sequence-number": sequence_number}
    return lock_token.bytes_le + LOCK_TOKEN_MARKER + message.encode_message()


def service_bus_metadata(sent: SentMessage, *, lock_token: uuid.UUID, delivery_count: int,
                         sequence_number: int, enqueued_time: datetime | None) -> dict[str, Any]:
    """Trigger metadata the host sends alongside a received message (JSON-able values)."""
    enqueued = enqueued_time or datetime.now(UTC)
    metadata: dict[str, Any] = {
        "MessageId": sent.message_id, "CorrelationId": sent.correlation_id,
        "ContentType": sent.content_type, "DeliveryCount": delivery_count,
        "SequenceNumber": sequence_number, "LockToken": str(lock_token),
        "EnqueuedTimeUtc": enqueued,
        "ApplicationProperties": sent.application_properties or {},
        "UserProperties": sent.application_properties or {},
    }
    return {key: value for key, value in metadata.items() if value is not None}


def event_system_properties(event: SentEvent) -> dict[str, Any]:
    """One entry of `SystemPropertiesArray`."""
    return {
        "SequenceNumber": event.sequence_number,
        "Offset": event.offset if event.offset is not None else event.sequence_number * 100,
        "PartitionKey": event.partition_key,
        "EnqueuedTimeUtc": iso(event.enqueued_at),
        **({"content-type": event.content_type} if event.content_type else {}),
    }


def event_batch_metadata(events: list[SentEvent], *, partition_id: str, event_hub: str,
                         consumer_group: str, namespace: str) -> dict[str, Any]:
    """Trigger metadata of a cardinality-many batch (JSON-able values)."""
    system = [event_system_properties(e) for e in events]
    return {
        "PartitionContext": {"EventHubName": event_hub, "ConsumerGroup": consumer_group,
                             "FullyQualifiedNamespace": namespace, "PartitionId": partition_id},
        "PropertiesArray": [e.properties or {} for e in events],
        "SystemPropertiesArray": system,
        "SequenceNumberArray": [s["SequenceNumber"] for s in system],
        "OffsetArray": [str(s["Offset"]) for s in system],
        "PartitionKeyArray": [s["PartitionKey"] or "" for s in system],
        "EnqueuedTimeUtcArray": [e.enqueued_at for e in events],
    }


@dataclass(frozen=True)
class ReceivedQueueMessage:
    """A Storage queue message as the host received it (the queue's own values)."""

    message_id: str
    body: bytes  # after the host's messageEncoding decoding
    dequeue_count: int
    pop_receipt: str
    insertion_time: datetime | None = None
    expiration_time: datetime | None = None
    next_visible_time: datetime | None = None


def queue_text(body: bytes) -> str:
    """The body as the host hands a string-typed queue trigger its text: UTF-8, with invalid
    bytes replaced (.NET's `Encoding.UTF8.GetString`)."""
    return body.decode("utf-8", errors="replace")


def queue_metadata(message: ReceivedQueueMessage) -> dict[str, Any]:
    """Trigger metadata the host sends with a queue message (JSON-able values)."""
    metadata: dict[str, Any] = {
        "QueueTrigger": queue_text(message.body), "Id": message.message_id,
        "DequeueCount": message.dequeue_count, "PopReceipt": message.pop_receipt,
        "InsertionTime": message.insertion_time, "ExpirationTime": message.expiration_time,
        "NextVisibleTime": message.next_visible_time,
    }
    return {key: value for key, value in metadata.items() if value is not None}


def timer_info(*, past_due: bool = False, now: datetime | None = None,
               interval: timedelta = timedelta(minutes=15)) -> dict[str, Any]:
    """The timer trigger's payload."""
    now = now or datetime.now(UTC)
    return {"Schedule": {"AdjustForDST": True},
            "ScheduleStatus": {"Last": iso(now - interval), "Next": iso(now + interval),
                               "LastUpdated": iso(now - interval)},
            "IsPastDue": past_due}


def system_metadata(method_name: str) -> dict[str, Any]:
    """The `sys` entry the host adds to every trigger's metadata."""
    return {"MethodName": method_name, "UtcNow": iso(datetime.now(UTC)),
            "RandGuid": str(uuid.uuid4())}


def iso(moment: datetime) -> str:
    """A UTC timestamp as JSON carries it (`...Z`)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def json_text(value: Any) -> str:
    """Compact JSON, as the host serializes (dates as ISO strings)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                      default=lambda v: iso(v) if isinstance(v, datetime) else str(v))
