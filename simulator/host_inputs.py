"""Build exactly what the Python worker hands a function, through the real converters.

Service Bus (SDK-type binding): model binding data whose content is the lock
token + AMQP-encoded message, decoded by the servicebus extension's converter
into `azure.servicebus.ServiceBusReceivedMessage`. Event Hubs (cardinality
many): `collection_bytes` plus host-shaped trigger metadata, decoded by
`azure.functions.eventhub.EventHubTriggerConverter`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import uamqp
from azure.functions import meta
from azure.functions.eventhub import EventHubTriggerConverter
from azurefunctions.extensions.base import Datum as ExtensionDatum
from azurefunctions.extensions.bindings.servicebus import ServiceBusConverter
from uamqp.message import MessageHeader, MessageProperties

LOCK_TOKEN_MARKER = b"x-opt-lock-token"


@dataclass(frozen=True)
class SentMessage:
    """What a producer put on a queue or topic."""

    body: bytes
    message_id: str | None = None
    correlation_id: str | None = None
    content_type: str | None = "application/json"
    application_properties: dict[str, Any] | None = None


def service_bus_message(sent: SentMessage, *, delivery_count: int = 1, sequence_number: int = 1,
                        lock_token: uuid.UUID | None = None,
                        enqueued_time: datetime | None = None) -> Any:
    """An `azure.servicebus.ServiceBusReceivedMessage` as the worker builds it."""
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
    token = lock_token or uuid.uuid4()
    content = token.bytes_le + LOCK_TOKEN_MARKER + message.encode_message()
    binding = SimpleNamespace(version="1.0", source="AzureServiceBusReceivedMessage",
                              content_type="application/octet-stream", content=content)
    return ServiceBusConverter.decode(ExtensionDatum(binding, "model_binding_data"),
                                      trigger_metadata={}, pytype=None)


@dataclass(frozen=True)
class SentEvent:
    """What a producer put on an event hub partition."""

    body: bytes
    sequence_number: int
    properties: dict[str, Any] | None = None
    partition_key: str | None = None
    offset: int | None = None
    enqueued_time: datetime | None = None
    content_type: str | None = None


def event_hub_batch(events: list[SentEvent], *, partition_id: str, event_hub: str = "payments",
                    consumer_group: str = "payments-processor") -> list[func.EventHubEvent]:
    """A cardinality-many batch with the trigger metadata the host sends."""
    system = [{
        "SequenceNumber": e.sequence_number,
        "Offset": e.offset if e.offset is not None else e.sequence_number * 100,
        "PartitionKey": e.partition_key,
        "EnqueuedTimeUtc": (e.enqueued_time or datetime.now(UTC)).isoformat(),
        **({"content-type": e.content_type} if e.content_type else {}),
    } for e in events]
    metadata = {
        "SystemPropertiesArray": meta.Datum(json.dumps(system), "json"),
        "PropertiesArray": meta.Datum(json.dumps([e.properties or {} for e in events]), "json"),
        "PartitionContext": meta.Datum(json.dumps({
            "EventHubName": event_hub, "ConsumerGroup": consumer_group,
            "FullyQualifiedNamespace": "sim.servicebus.windows.net", "PartitionId": partition_id,
        }), "json"),
    }
    data = meta.Datum(SimpleNamespace(bytes=[e.body for e in events]), "collection_bytes")
    return EventHubTriggerConverter.decode(data, trigger_metadata=metadata)


class RecordingActions:
    """A ServiceBusMessageActions stand-in that records each settlement."""

    def __init__(self) -> None:
        self.settled: list[tuple[str, Any, str | None, str | None]] = []

    def complete(self, message: Any) -> None:
        self.settled.append(("complete", message, None, None))

    def abandon(self, message: Any) -> None:
        self.settled.append(("abandon", message, None, None))

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self.settled.append(("deadletter", message, deadletter_reason, deadletter_error_description))

    @property
    def last(self) -> tuple[str, str | None, str | None]:
        if not self.settled:
            return ("unsettled", None, None)  # the lock runs out; redelivered later
        action, _, reason, description = self.settled[-1]
        return action, reason, description
