"""Transport-neutral views of what a trigger receives."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from shared.cloudevents import InvalidEventError


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


class InvalidMessageError(ValueError):
    """The message cannot be processed as it is; `reason` is the dead-letter reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def parse_json_object(body: bytes, *, max_bytes: int) -> dict[str, Any]:
    """Decode a JSON object body, refusing oversized or malformed input with a reason."""
    if len(body) > max_bytes:
        raise InvalidMessageError("PayloadTooLarge", f"{len(body)} bytes; at most {max_bytes}")
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidMessageError("MalformedJson", str(error)) from error
    if not isinstance(value, dict):
        raise InvalidMessageError("MalformedJson", "body must be a JSON object")
    return value


def invalid_event(error: InvalidEventError) -> InvalidMessageError:
    return InvalidMessageError(error.reason, error.detail)
