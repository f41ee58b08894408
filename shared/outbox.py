"""Outgoing messages of a consumer: what a transactional outbox stores and dispatches.

A consumer whose effect includes telling someone records the messages it
sends in the same transaction as its dedup marker, and sends them only after
that transaction committed. This module holds the parts that do not depend on
a store or a broker:

* `OutgoingMessage`: one message as the commit stores it and a dispatcher
  sends it (a frozen value; bodies are bytes).
* `outgoing_message_id`: the default message id, derived from the incoming
  dedup key, the destination and the message's ordinal, so a transaction
  rebuilt after a lost race yields the same ids and the destination's
  duplicate detection and the next consumer's dedup absorb any re-send.
* `outgoing`: builds a message with that id and the propagated key,
  correlation id and trace context (the same rules as `downstream_headers`).
* `encode_pending` / `decode_pending`: the messages as flat string
  properties that fit both stores' item rules (a Table string property holds
  at most 32 Ki UTF-16 characters; Cosmos keeps them as JSON strings), to be
  written on the marker itself, so a duplicate's marker read already says
  whether anything is still pending.
* `EventPosition`: where the Event Hubs event sits whose commit recorded the
  messages. An Event Hubs batch records no dispatch per marker: its
  partition's high-water mark moves only after the batch's messages went out,
  so a marker's messages are pending exactly while the mark does not cover
  its position (no `outboxPendingSince`: the sweeper never sees them).

Sizes are checked when a message is recorded, never at dispatch: a body over
`MAX_BODY_BYTES` or a key's messages over `MAX_PENDING_BYTES` raise
`OutgoingMessageTooLargeError` inside the consumer's build.
"""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shared.exceptions import OutgoingMessageTooLargeError
from shared.keys import DedupKey
from shared.observability import IDEMPOTENCY_KEY_HEADER, downstream_headers

# A Service Bus Standard message holds 256 KiB with its headers and properties;
# 192 KiB of body leaves room for them.
MAX_BODY_BYTES = 192 * 1024
# All pending messages of one key, raw bytes: encoded as base64 JSON they take
# about 1.4x that in characters, inside the 1 MiB of a Table entity (2 bytes a
# character) next to the marker's own fields and its result (16 KiB at most).
MAX_PENDING_BYTES = 256 * 1024
MAX_MESSAGES = 100
MAX_MESSAGE_ID_LENGTH = 128  # Service Bus MessageId

# A Table string property holds 64 KiB of UTF-16, 32,768 characters.
TABLE_CHUNK_CHARS = 32_000
PENDING_COUNT = "outboxChunks"
# When the messages became pending (epoch seconds); present only while some are: the
# sweeper's query (an indexed path on Cosmos DB) finds pending markers by it.
PENDING_SINCE = "outboxPendingSince"
# Instead of PENDING_SINCE on a marker of an Event Hubs batch: the position of its event; its
# messages are pending while the partition's mark does not cover it.
POSITION = "outboxPosition"
_PENDING_CHUNK = "outbox{}"

# Fixed namespace of the ids derived here (uuid5 of key, destination, ordinal).
_ID_NAMESPACE = uuid.UUID("6f0e9a52-3c1d-5b7e-9a41-2d8c0f7b1e63")

PropertyValue = str | int | float | bool


@dataclass(frozen=True, kw_only=True)
class OutgoingMessage:
    """One message to send after the commit; a frozen value the store can keep.

    `destination` is the queue, topic or event hub name as the dispatcher
    knows it. `session_id` (Service Bus sessions) and `partition_key` keep
    related messages in order on the broker; `scheduled_enqueue_time` is
    honoured by Service Bus (a scheduled message).
    """

    destination: str
    body: bytes
    message_id: str
    content_type: str | None = "application/json"
    correlation_id: str | None = None
    properties: Mapping[str, PropertyValue] = field(default_factory=lambda: MappingProxyType({}))
    session_id: str | None = None
    partition_key: str | None = None
    scheduled_enqueue_time: datetime.datetime | None = None

    def __post_init__(self) -> None:
        if not self.destination or not isinstance(self.destination, str):  # pyright: ignore[reportUnnecessaryIsInstance] - callers may be untyped
            raise ValueError("an outgoing message needs a destination name")
        if not isinstance(self.body, bytes):  # pyright: ignore[reportUnnecessaryIsInstance] - callers may be untyped
            raise TypeError(f"body must be bytes, got {type(self.body).__name__}")
        if not self.message_id or len(self.message_id) > MAX_MESSAGE_ID_LENGTH:
            raise ValueError(f"message_id must be 1-{MAX_MESSAGE_ID_LENGTH} characters")
        if len(self.body) > MAX_BODY_BYTES:
            raise OutgoingMessageTooLargeError(
                f"message {self.message_id!r} to {self.destination!r} has a {len(self.body)}-byte body; "
                f"at most {MAX_BODY_BYTES} bytes can be recorded with the marker")
        if self.scheduled_enqueue_time is not None and self.scheduled_enqueue_time.tzinfo is None:
            raise ValueError("scheduled_enqueue_time must be timezone-aware")
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))


@dataclass(frozen=True, slots=True)
class EventPosition:
    """An event's place in its hub: `event_hub`, `partition_id`, `sequence_number` and
    `enqueued_time` (ISO text as the trigger gives it; None when it gave none).

    Kept on a marker of an Event Hubs batch next to its messages. The partition's mark
    covering this position (`shared.watermark.Mark.covers`) is the record that they were
    dispatched: the batch processor moves the mark only after dispatching them.
    """

    event_hub: str
    partition_id: str
    sequence_number: int
    enqueued_time: str | None = None

    def encode(self) -> str:
        return json.dumps([self.event_hub, self.partition_id, self.sequence_number,
                           self.enqueued_time], ensure_ascii=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: object) -> EventPosition | None:
        """The position `encode` wrote; None for an empty or absent value (cleared)."""
        if not text:
            return None
        hub, partition, sequence, enqueued = json.loads(str(text))
        return cls(str(hub), str(partition), int(sequence),
                   None if enqueued is None else str(enqueued))


def outgoing_message_id(key: DedupKey, destination: str, ordinal: int) -> str:
    """The id of the `ordinal`-th message to `destination` sent for `key`: the same on every rebuild."""
    name = json.dumps([key.consumer, key.key, destination, ordinal], ensure_ascii=False,
                      separators=(",", ":"))
    return str(uuid.uuid5(_ID_NAMESPACE, name))


def outgoing(key: DedupKey, destination: str, body: bytes | str | Mapping[str, Any] | Sequence[Any],
             *, ordinal: int, message_id: str | None = None,
             content_type: str | None = None, correlation_id: str | None = None,
             properties: Mapping[str, PropertyValue] | None = None,
             session_id: str | None = None, partition_key: str | None = None,
             scheduled_enqueue_time: datetime.datetime | None = None) -> OutgoingMessage:
    """An `OutgoingMessage` for `key`'s effect, with a derived id and the propagated identity.

    A JSON value body is encoded as compact UTF-8 JSON (`application/json`), a
    str as UTF-8 text. The application properties carry `Idempotency-Key`
    (the incoming key, per destination and ordinal, as for downstream calls),
    the correlation id and the current trace context, so the next hop can
    deduplicate its own work and join the trace; the caller's own properties
    win over them.
    """
    if isinstance(body, bytes):
        data, default_type = body, "application/octet-stream"
    elif isinstance(body, str):
        data, default_type = body.encode("utf-8"), "text/plain; charset=utf-8"
    else:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        default_type = "application/json"
    propagated: dict[str, PropertyValue] = dict(
        downstream_headers(key, correlation_id, operation=f"{destination}#{ordinal}"))
    return OutgoingMessage(
        destination=destination, body=data,
        message_id=message_id or outgoing_message_id(key, destination, ordinal),
        content_type=content_type or default_type, correlation_id=correlation_id,
        properties={**propagated, **(properties or {})}, session_id=session_id,
        partition_key=partition_key, scheduled_enqueue_time=scheduled_enqueue_time)


def check_pending_size(messages: Sequence[OutgoingMessage]) -> None:
    """Refuse more messages per key than one marker can carry (raised in the build, not at dispatch)."""
    if len(messages) > MAX_MESSAGES:
        raise OutgoingMessageTooLargeError(
            f"{len(messages)} outgoing messages for one key; at most {MAX_MESSAGES} can be recorded")
    total = sum(len(m.body) + sum(len(str(k)) + len(str(v)) for k, v in m.properties.items())
                for m in messages)
    if total > MAX_PENDING_BYTES:
        raise OutgoingMessageTooLargeError(
            f"the outgoing messages of one key take {total} bytes; at most {MAX_PENDING_BYTES} "
            "can be recorded with the marker (send a reference to the data instead)")


# -- stored form ---------------------------------------------------------------------------
def _to_json(message: OutgoingMessage) -> dict[str, Any]:
    return {
        "d": message.destination,
        "i": message.message_id,
        "b": base64.b64encode(message.body).decode("ascii"),
        "t": message.content_type,
        "c": message.correlation_id,
        "p": dict(message.properties),
        "s": message.session_id,
        "k": message.partition_key,
        "e": (message.scheduled_enqueue_time.isoformat()
              if message.scheduled_enqueue_time is not None else None),
    }


def _from_json(value: Mapping[str, Any]) -> OutgoingMessage:
    scheduled = value.get("e")
    return OutgoingMessage(
        destination=value["d"], message_id=value["i"], body=base64.b64decode(value["b"], validate=True),
        content_type=value.get("t"), correlation_id=value.get("c"), properties=value.get("p") or {},
        session_id=value.get("s"), partition_key=value.get("k"),
        scheduled_enqueue_time=(datetime.datetime.fromisoformat(scheduled) if scheduled else None))


def encode_pending(messages: Sequence[OutgoingMessage], *, chunk_chars: int = TABLE_CHUNK_CHARS
                   ) -> dict[str, str | int]:
    """Flat string properties holding `messages` (none: `{outboxChunks: 0}`), for a marker;
    strings of at most `chunk_chars` (a Table property's limit by default; Cosmos DB takes
    one string, so clearing it is one patch operation)."""
    check_pending_size(messages)
    if not messages:
        return {PENDING_COUNT: 0}
    text = json.dumps([_to_json(m) for m in messages], ensure_ascii=True, separators=(",", ":"))
    chunks = [text[i:i + chunk_chars] for i in range(0, len(text), chunk_chars)]
    fields: dict[str, str | int] = {PENDING_COUNT: len(chunks)}
    fields.update({_PENDING_CHUNK.format(n): chunk for n, chunk in enumerate(chunks)})
    return fields


def cleared_pending(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` (a marker's properties) with its pending messages removed: recorded as dispatched."""
    drop = set(pending_field_names(fields))
    out = {name: value for name, value in fields.items() if name not in drop}
    out[PENDING_COUNT] = 0
    return out


def pending_field_names(fields: Mapping[str, Any]) -> list[str]:
    """The names of the pending-message properties `fields` holds (chunks, and the time or
    the event position)."""
    count = int(fields.get(PENDING_COUNT) or 0)
    names = [_PENDING_CHUNK.format(n) for n in range(count)]
    return [*names, *(name for name in (PENDING_SINCE, POSITION) if name in fields)]


def pending_chunk_names(count: int) -> list[str]:
    return [_PENDING_CHUNK.format(n) for n in range(count)]


def decode_pending(fields: Mapping[str, Any]) -> list[OutgoingMessage]:
    """The pending messages stored in a marker's properties (an empty list when none)."""
    count = int(fields.get(PENDING_COUNT) or 0)
    if count == 0:
        return []
    text = "".join(str(fields[_PENDING_CHUNK.format(n)]) for n in range(count))
    return [_from_json(value) for value in json.loads(text)]


def has_pending(fields: Mapping[str, Any]) -> bool:
    """Whether a marker still carries messages not yet recorded as dispatched (no decoding)."""
    return int(fields.get(PENDING_COUNT) or 0) > 0


__all__ = [
    "IDEMPOTENCY_KEY_HEADER",
    "MAX_BODY_BYTES",
    "MAX_MESSAGES",
    "MAX_PENDING_BYTES",
    "PENDING_COUNT",
    "PENDING_SINCE",
    "POSITION",
    "TABLE_CHUNK_CHARS",
    "EventPosition",
    "OutgoingMessage",
    "check_pending_size",
    "cleared_pending",
    "decode_pending",
    "encode_pending",
    "has_pending",
    "outgoing",
    "outgoing_message_id",
    "pending_chunk_names",
    "pending_field_names",
]
