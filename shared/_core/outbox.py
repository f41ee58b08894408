"""Outgoing messages of a consumer: what a transactional outbox stores and dispatches.

A consumer records the messages it sends in the same transaction as its dedup marker, on the
marker itself (so a duplicate's marker read already says whether any are pending), and sends
them only after that transaction committed. This module holds the parts that depend on no
store or broker: `OutgoingMessage`; `outgoing_message_id`, derived from the incoming key, the
destination and the message's ordinal, so a transaction rebuilt after a lost race yields the
same ids and the destination's duplicate detection absorbs any re-send; `outgoing`, which adds
the propagated key, correlation id and trace context; `encode_pending` / `decode_pending`, the
stored form as flat properties that fit both stores' item rules; and `EventPosition`, which a
marker of an Event Hubs batch carries instead of `PENDING_SINCE`: its messages are pending
exactly while the partition's mark does not cover it (the sweeper never sees them).

Sizes are checked when a message is recorded, never at dispatch: a body over `MAX_BODY_BYTES`
or a key's messages over `MAX_PENDING_BYTES` raise `OutgoingMessageTooLargeError` inside the
consumer's build.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from shared._core.exceptions import OutgoingMessageTooLargeError
from shared._core.jsontext import compact_encoder, json_encoder
from shared._core.keys import DedupKey
from shared._core.observability import IDEMPOTENCY_KEY_HEADER, downstream_headers, idempotency_key_value

# A Service Bus Standard message holds 256 KiB with its headers and properties.
MAX_BODY_BYTES = 192 * 1024
# All pending messages of one key, raw bytes: as base64 JSON (about 1.4x that in characters) they
# fit in a Table entity's 1 MiB (2 bytes a character) next to the marker's fields and result.
MAX_PENDING_BYTES = 256 * 1024
MAX_MESSAGES = 100
MAX_MESSAGE_ID_LENGTH = 128  # Service Bus MessageId

# A Table string property holds 64 KiB of UTF-16, 32,768 characters.
TABLE_CHUNK_CHARS = 32_000
# Chunks "o0", "o1", ... (one on Cosmos DB), read up to the first absent or empty one (Table
# Storage blanks what it cannot remove).
_PENDING_CHUNK = "o{}"
# When the messages became pending (epoch ms, > 0 only while some are): what the sweeper queries.
PENDING_SINCE = "oT"
# Instead of PENDING_SINCE on a marker of an Event Hubs batch: its event's position.
POSITION = "oP"
_CONTENT_TYPE = "application/json"  # OutgoingMessage's default: not stored

_ID_NAMESPACE = uuid.UUID("6f0e9a52-3c1d-5b7e-9a41-2d8c0f7b1e63")  # never change: the ids derive from it

PropertyValue = str | int | float | bool


@dataclass(frozen=True, kw_only=True)
class OutgoingMessage:
    """One message to send after the commit. `destination`: the queue, topic or event hub;
    `session_id` and `partition_key` keep related messages in order on the broker;
    `scheduled_enqueue_time` is honoured by Service Bus."""

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


class Dispatcher(Protocol):
    """Sends outgoing messages; raises `DispatchUnavailableError` or `DispatchRejectedError`.
    Here, beside the message, so the flows depend on the contract, not on an SDK."""

    def dispatch(self, messages: Sequence[OutgoingMessage]) -> None: ...

    def close(self) -> None: ...


class AsyncDispatcher(Protocol):
    """`Dispatcher` on the async variant."""

    async def dispatch(self, messages: Sequence[OutgoingMessage]) -> None: ...

    async def close(self) -> None: ...


# Exactly the `json.dumps` calls they replace, the circular check included, built once.
_ascii_json = json_encoder(separators=(",", ":"), check_circular=True)
_text_json = json_encoder(separators=(",", ":"), ensure_ascii=False, check_circular=True)
_strict_json = json_encoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                            check_circular=True)


@dataclass(frozen=True, slots=True)
class EventPosition:
    """An event's place in its hub (`enqueued_time`: ISO text as the trigger gives it, or None).

    Kept on a marker of an Event Hubs batch next to its messages: the partition's mark covering
    it is the record that they were dispatched (the mark moves only after dispatching them).
    """

    event_hub: str
    partition_id: str
    sequence_number: int
    enqueued_time: str | None = None

    def to_list(self) -> list[Any]:
        """[event hub, partition, sequence number(, enqueued time)]: the stored form."""
        fields: list[Any] = [self.event_hub, self.partition_id, self.sequence_number]
        if self.enqueued_time is not None:
            fields.append(self.enqueued_time)
        return fields

    def encode(self) -> str:
        return _ascii_json(self.to_list())

    @classmethod
    def decode(cls, stored: object) -> EventPosition | None:
        """The position `encode` or `to_list` wrote; None for an empty or absent value."""
        if not stored:
            return None
        values: Any = json.loads(stored) if isinstance(stored, str) else stored
        hub, partition, sequence, *rest = values
        enqueued = rest[0] if rest else None
        return cls(str(hub), str(partition), int(sequence),
                   None if enqueued is None else str(enqueued))


@functools.lru_cache(maxsize=4096)  # the commit encoding a message asks again what its send made
def outgoing_message_id(key: DedupKey, destination: str, ordinal: int) -> str:
    """The id of the `ordinal`-th message to `destination` for `key`: the same on every rebuild."""
    name = _text_json([key.consumer, key.key, destination, ordinal])
    return str(uuid.uuid5(_ID_NAMESPACE, name))


def outgoing(key: DedupKey, destination: str, body: bytes | str | Mapping[str, Any] | Sequence[Any],
             *, ordinal: int, message_id: str | None = None,
             content_type: str | None = None, correlation_id: str | None = None,
             properties: Mapping[str, PropertyValue] | None = None,
             session_id: str | None = None, partition_key: str | None = None,
             scheduled_enqueue_time: datetime.datetime | None = None) -> OutgoingMessage:
    """An `OutgoingMessage` for `key`'s effect, with a derived id and the propagated identity.

    A JSON value body is encoded as compact UTF-8 JSON, a str as UTF-8 text. The properties carry
    `Idempotency-Key` (per destination and ordinal), the correlation id and the current trace
    context, so the next hop can deduplicate and join the trace; the caller's properties win.
    """
    if isinstance(body, bytes):
        data, default_type = body, "application/octet-stream"
    elif isinstance(body, str):
        data, default_type = body.encode("utf-8"), "text/plain; charset=utf-8"
    else:
        data = _strict_json(body).encode("utf-8")
        default_type = "application/json"
    propagated = downstream_headers(key, correlation_id, operation=f"{destination}#{ordinal}")
    return OutgoingMessage(
        destination=destination, body=data,
        message_id=message_id or outgoing_message_id(key, destination, ordinal),
        content_type=content_type or default_type, correlation_id=correlation_id,
        properties={**propagated, **(properties or {})}, session_id=session_id,
        partition_key=partition_key, scheduled_enqueue_time=scheduled_enqueue_time)


def check_pending_size(messages: Sequence[OutgoingMessage]) -> None:
    """Refuse more messages per key than one marker can carry."""
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
# One message as a JSON object of short names, leaving out what a reader derives: the id and
# Idempotency-Key `outgoing` made from the marker's key (the n-th message to a destination has
# ordinal n), the default content type, and every absent value. A body that is compact JSON is
# kept as that value ("j"), any other as base64 ("b").
_body_json = compact_encoder()


def _embedded(body: bytes) -> tuple[bool, Any]:
    """(True, value) when `body` is the compact JSON text of `value`, byte for byte."""
    if not body or body[:1] not in b'{["':  # objects, arrays and strings: what is worth it
        return False, None
    try:
        value = json.loads(body.decode("utf-8"))  # a str: no encoding sniffing
        return _body_json(value).encode("utf-8") == body, value
    except (ValueError, RecursionError):  # UnicodeDecodeError and UnicodeEncodeError are ValueErrors
        return False, None


def _to_json(message: OutgoingMessage, key: DedupKey | None, ordinal: int) -> dict[str, Any]:
    value: dict[str, Any] = {"d": message.destination}
    embedded, body = _embedded(message.body)
    if embedded:
        value["j"] = body
    else:
        value["b"] = base64.b64encode(message.body).decode("ascii")
    if key is None or message.message_id != outgoing_message_id(key, message.destination, ordinal):
        value["i"] = message.message_id
    if message.content_type != _CONTENT_TYPE:
        value["t"] = message.content_type  # None included: no content type
    if message.correlation_id is not None:
        value["c"] = message.correlation_id
    properties: dict[str, Any] = dict(message.properties)
    if key is not None:
        header = properties.get(IDEMPOTENCY_KEY_HEADER)
        if header is None:
            properties[IDEMPOTENCY_KEY_HEADER] = None  # none: the reader must not derive one
        elif header == _derived_key_header(key, message.destination, ordinal):
            del properties[IDEMPOTENCY_KEY_HEADER]
    if properties:
        value["p"] = properties
    if message.session_id is not None:
        value["s"] = message.session_id
    if message.partition_key is not None:
        value["k"] = message.partition_key
    if message.scheduled_enqueue_time is not None:
        value["e"] = message.scheduled_enqueue_time.isoformat()
    return value


def _from_json(value: Mapping[str, Any], key: DedupKey | None, ordinal: int) -> OutgoingMessage:
    destination = value["d"]
    message_id = value.get("i")
    properties: dict[str, Any] = dict(value.get("p") or {})
    if key is not None:
        message_id = message_id or outgoing_message_id(key, destination, ordinal)
        if IDEMPOTENCY_KEY_HEADER not in properties:
            properties[IDEMPOTENCY_KEY_HEADER] = _derived_key_header(key, destination, ordinal)
        elif properties[IDEMPOTENCY_KEY_HEADER] is None:
            del properties[IDEMPOTENCY_KEY_HEADER]
    if message_id is None:
        raise ValueError(f"a stored message to {destination!r} has no id and no key to derive it")
    body = (_body_json(value["j"]).encode("utf-8") if "j" in value
            else base64.b64decode(value["b"], validate=True))
    scheduled = value.get("e")
    return OutgoingMessage(
        destination=destination, message_id=message_id, body=body,
        content_type=value.get("t", _CONTENT_TYPE), correlation_id=value.get("c"),
        properties=properties, session_id=value.get("s"), partition_key=value.get("k"),
        scheduled_enqueue_time=(datetime.datetime.fromisoformat(scheduled) if scheduled else None))


@functools.lru_cache(maxsize=4096)
def _derived_key_header(key: DedupKey, destination: str, ordinal: int) -> str:
    """The Idempotency-Key `outgoing` gives the `ordinal`-th message to `destination`."""
    return idempotency_key_value(key, f"{destination}#{ordinal}")


def _ordinals(destinations: Sequence[str]) -> list[int]:
    seen: Counter[str] = Counter()
    ordinals: list[int] = []
    for destination in destinations:
        ordinals.append(seen[destination])
        seen[destination] += 1
    return ordinals


def encode_pending(messages: Sequence[OutgoingMessage], *, key: DedupKey | None = None,
                   chunk_chars: int | None = TABLE_CHUNK_CHARS) -> dict[str, Any]:
    """Flat properties holding `messages` (none: `{}`): JSON text in strings of at most
    `chunk_chars`, or with `chunk_chars=None` the JSON value in one property (Cosmos DB: no
    escaping, one patch clears it). `key`: the marker's, whose derived ids and Idempotency-Keys
    are then not stored (`decode_pending` needs the same key)."""
    check_pending_size(messages)
    if not messages:
        return {}
    ordinals = _ordinals([m.destination for m in messages])
    values = [_to_json(m, key, n) for m, n in zip(messages, ordinals, strict=True)]
    if chunk_chars is None:
        return {_PENDING_CHUNK.format(0): values}
    text = _ascii_json(values)
    chunks = [text[i:i + chunk_chars] for i in range(0, len(text), chunk_chars)]
    return {_PENDING_CHUNK.format(n): chunk for n, chunk in enumerate(chunks)}


def cleared_pending(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` (a marker's properties) with its pending messages removed: recorded as dispatched."""
    drop = set(pending_field_names(fields))
    return {name: value for name, value in fields.items() if name not in drop}


def _chunks(fields: Mapping[str, Any]) -> list[Any]:
    """The stored chunks, up to the first absent or empty one (a JSON value: one chunk)."""
    chunks: list[Any] = []
    while chunk := fields.get(_PENDING_CHUNK.format(len(chunks))):
        chunks.append(chunk)
        if not isinstance(chunk, str):
            break
    return chunks


def pending_field_names(fields: Mapping[str, Any]) -> list[str]:
    """The names of the pending-message properties `fields` holds."""
    names = pending_chunk_names(len(_chunks(fields)))
    return [*names, *(name for name in (PENDING_SINCE, POSITION) if name in fields)]


def pending_chunk_names(count: int) -> list[str]:
    return [_PENDING_CHUNK.format(n) for n in range(count)]


def is_pending_field(name: str) -> bool:
    """Whether `name` is one a marker's pending messages may use (reserved on a document)."""
    return name in (PENDING_SINCE, POSITION) or (name[:1] == "o" and name[1:].isdigit())


def decode_pending(fields: Mapping[str, Any], *, key: DedupKey | None = None
                   ) -> list[OutgoingMessage]:
    """The pending messages stored in a marker's properties; `key` as given to `encode_pending`."""
    chunks = _chunks(fields)
    if not chunks:
        return []
    stored: Any = chunks[0] if not isinstance(chunks[0], str) else json.loads("".join(chunks))
    values: list[dict[str, Any]] = list(stored)
    ordinals = _ordinals([value["d"] for value in values])
    return [_from_json(value, key, n) for value, n in zip(values, ordinals, strict=True)]


def has_pending(fields: Mapping[str, Any]) -> bool:
    """Whether a marker still carries messages not yet recorded as dispatched (no decoding)."""
    return bool(fields.get(_PENDING_CHUNK.format(0)))


__all__ = [
    "IDEMPOTENCY_KEY_HEADER",
    "MAX_BODY_BYTES",
    "MAX_MESSAGES",
    "MAX_PENDING_BYTES",
    "PENDING_SINCE",
    "POSITION",
    "TABLE_CHUNK_CHARS",
    "AsyncDispatcher",
    "Dispatcher",
    "EventPosition",
    "OutgoingMessage",
    "check_pending_size",
    "cleared_pending",
    "decode_pending",
    "encode_pending",
    "has_pending",
    "is_pending_field",
    "outgoing",
    "outgoing_message_id",
    "pending_chunk_names",
    "pending_field_names",
]
