"""Transport-neutral views of what a trigger receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shared.cloudevents import InvalidEventError
from shared.payload import InvalidPayloadError
from shared.payload import parse_json_object as parse_payload_object


@dataclass(frozen=True)
class InboundMessage:
    """A Service Bus message as the domain code sees it."""

    message_id: str | None
    body: bytes
    correlation_id: str | None = None
    delivery_count: int = 1
    content_type: str | None = None
    application_properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InboundEvent:
    """An Event Hubs event as the domain code sees it."""

    sequence_number: int
    body: bytes
    properties: dict[str, Any] = field(default_factory=dict)
    content_type: str | None = None
    offset: str | None = None
    enqueued_time: str | None = None
    partition_key: str | None = None


#: The message cannot be processed as it is; `reason` is the dead-letter reason.
InvalidMessageError = InvalidPayloadError


def parse_json_object(body: bytes, *, max_bytes: int) -> dict[str, Any]:
    """Decode a JSON object body with the library's bounded decoder (depth, size, numbers,
    text), refusing hostile or malformed input with a reason on the first delivery."""
    return parse_payload_object(body, max_bytes=max_bytes)


def invalid_event(error: InvalidEventError) -> InvalidMessageError:
    return InvalidMessageError(error.reason, error.detail)
