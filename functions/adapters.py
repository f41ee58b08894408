"""Binding types -> the domain's transport-neutral views."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import azure.functions as func

from domain.messages import InboundEvent, InboundMessage
from functions.services import services
from shared.cloudevents import as_text
from shared.observability import message_span
from shared.settlement import Action, Decision, MessageActions, settle
from shared.telemetry import EVENT_CONFLICT


def message_body(message: Any) -> bytes:
    body = message.body
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(bytes(part) for part in body)  # AMQP data sections
    except TypeError:
        return str(message).encode("utf-8")  # AMQP value/sequence body


def message_view(message: Any) -> InboundMessage:
    """From azure.servicebus.ServiceBusReceivedMessage (SDK-type binding)."""
    message_id = message.message_id
    return InboundMessage(
        message_id=None if message_id is None else str(as_text(message_id)),
        body=message_body(message),
        correlation_id=None if message.correlation_id is None else str(as_text(message.correlation_id)),
        delivery_count=int(message.delivery_count or 1),
        content_type=as_text(message.content_type),
        application_properties={str(as_text(k)): as_text(v)
                                for k, v in (message.application_properties or {}).items()},
    )


def _content_type(properties: dict[str, Any], system: dict[str, Any]) -> str | None:
    for source in (system, properties):
        for name in ("ContentType", "content-type", "content_type", "contentType"):
            if source.get(name):
                return str(as_text(source[name]))
    return None


def event_views(events: list[func.EventHubEvent]) -> list[InboundEvent]:
    """Per-event views of a cardinality-many batch.

    Each event carries the whole batch's trigger metadata; its own application
    properties are entry i of `PropertiesArray` (system ones of
    `SystemPropertiesArray`).
    """
    views = []
    for index, event in enumerate(events):
        metadata = event.metadata or {}
        properties_array = metadata.get("PropertiesArray") or []
        system_array = metadata.get("SystemPropertiesArray") or []
        raw_properties = properties_array[index] if index < len(properties_array) else {}
        system = system_array[index] if index < len(system_array) else {}
        properties = {str(as_text(k)): as_text(v) for k, v in (raw_properties or {}).items()}
        views.append(InboundEvent(
            sequence_number=_sequence_number(event.sequence_number),
            body=event.get_body() or b"",
            properties=properties,
            content_type=_content_type(properties, system or {}),
            offset=None if event.offset is None else str(event.offset),
            enqueued_time=None if event.enqueued_time is None else event.enqueued_time.isoformat(),
            partition_key=event.partition_key,
        ))
    return views


def partition_id(events: list[func.EventHubEvent]) -> str:
    """The batch's partition, from the trigger metadata the host sends."""
    for event in events:
        context = (event.metadata or {}).get("PartitionContext") or {}
        if context.get("PartitionId") is not None:
            return str(context["PartitionId"])
    raise ValueError("Event Hubs trigger metadata has no PartitionContext.PartitionId")


def consume(name: str, handle: Callable[[InboundMessage], Decision], message: Any,
            actions: MessageActions) -> None:
    """One Service Bus delivery: view it, trace it (continuing the producer's trace),
    let the domain decide, settle explicitly."""
    view = message_view(message)
    with message_span(name, properties=view.application_properties, message_id=view.message_id,
                      correlation_id=view.correlation_id,
                      attributes={"messaging.delivery_count": view.delivery_count}):
        decision = handle(view)
        if decision.action is Action.DEADLETTER and decision.reason != EVENT_CONFLICT:
            # One alert event per dead-letter the app decides (a conflict has its own).
            services().telemetry.dead_lettered(
                consumer=name, reason=decision.reason or "",
                context={"message_id": view.message_id, "correlation_id": view.correlation_id,
                         "delivery_count": view.delivery_count,
                         "error": (decision.description or "")[:500]})
        settle(decision, message, actions)


def _sequence_number(value: int | None) -> int:
    """Every event the trigger delivers has one; refuse rather than invent one."""
    if value is None:
        raise ValueError("an Event Hubs event without a sequence number")
    return int(value)
