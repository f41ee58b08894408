"""Transport-neutral views of what a trigger receives."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.cloudevents import InvalidEventError
from shared.exceptions import IdempotencyError
from shared.payload import InvalidPayloadError
from shared.payload import parse_json_object as parse_payload_object
from shared.records import Outcome
from shared.settlement import Action, Decision, decision_for, decision_for_error

logger = logging.getLogger(__name__)


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


def message_context(message: InboundMessage) -> dict[str, Any]:
    """What a consumer's logs and metrics say about the message."""
    return {"message_id": message.message_id, "correlation_id": message.correlation_id,
            "delivery_count": message.delivery_count}


def settle_outcome(consumer: str, run: Callable[[], Outcome], message: InboundMessage) -> Decision:
    """How to settle `message` once `run` took it through the dedup flow: the outcome decides
    (`decision_for`); a store failure follows the one rule (transient: retry, never
    dead-letter; rejected for good: dead-letter), logged with the message's context."""
    try:
        return decision_for(run())
    except IdempotencyError as error:
        decision = decision_for_error(error, delivery_count=message.delivery_count)
        if decision is None:
            raise
        logger.warning("%s: %s: %s", consumer, "store rejected the request"
                       if decision.action is Action.DEADLETTER
                       else f"transient failure, {decision.action.value}", error,
                       extra=message_context(message))
        return decision
