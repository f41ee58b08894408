"""Dedup keys: where they come from, how they are scoped, and how they are stored.

A key is scoped by consumer (two consumers of one message each apply it
once), built only from stable message identity (never a delivery's), and
encoded so any input is a valid Table Storage PartitionKey/RowKey and Cosmos
DB id: deterministic and injective, with long keys replaced by their SHA-256.
The raw key stays on the record for operators.
"""

# Callers pass what a trigger delivered (untyped at run time): the isinstance checks on
# parameters typed str are the guard, not redundant.
# pyright: reportUnnecessaryIsInstance=false
from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, cast

from shared.exceptions import InvalidKeyError

# Characters kept as they are; everything else becomes "!XX" per UTF-8 byte.
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9\-_.:@]+")
_ESCAPE = "!"
_SEPARATOR = "|"  # never produced by encode_component
_HASHED = "~"  # never produced by encode_component
MAX_ENCODED_LENGTH = 250  # Cosmos id <= 255 chars; Table keys <= 1 KiB
MAX_RAW_KEY_BYTES = 16 * 1024
_CONSUMER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")

# Broker-generated values that change on redelivery or group many messages.
TRANSPORT_FIELDS = frozenset({
    "lock_token", "locktoken", "delivery_count", "deliverycount", "enqueued_time",
    "enqueuedtime", "enqueued_time_utc", "enqueuedtimeutc", "correlation_id",
    "correlationid", "sequence_number", "sequencenumber", "offset", "receive_time",
    "locked_until", "lockeduntil", "lockeduntilutc",
})


def _escape(match: re.Match[str]) -> str:
    return "".join(f"{_ESCAPE}{byte:02X}" for byte in match.group().encode("utf-8"))


def encode_component(value: str) -> str:
    """Escape `value` into the store-safe alphabet; injective, not length-limited."""
    return _UNSAFE_RUN.sub(_escape, value)


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


def store_safe_id(value: str) -> str:
    """One store-safe id for `value`: escaped, or `~` + SHA-256 when too long."""
    encoded = encode_component(value)
    if len(encoded) <= MAX_ENCODED_LENGTH:
        return encoded
    return _HASHED + sha256_hex(value)


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidKeyError(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidKeyError(f"{what} is empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as error:
        raise InvalidKeyError(f"{what} is not valid Unicode text: {error.reason}") from error
    if size > MAX_RAW_KEY_BYTES:
        raise InvalidKeyError(f"{what} is {size} bytes; at most {MAX_RAW_KEY_BYTES} are accepted")
    return value


@dataclass(frozen=True)
class DedupKey:
    """A message's identity as seen by one consumer."""

    consumer: str
    key: str

    def __post_init__(self) -> None:
        if not isinstance(self.consumer, str) or not _CONSUMER_RE.match(self.consumer):
            raise InvalidKeyError(
                f"consumer name {self.consumer!r} must be 1-64 chars of letters, digits, '_.:-'"
            )
        _check_text(self.key, "dedup key")

    @functools.cached_property
    def encoded(self) -> str:
        """Store-safe record id, unique per (consumer, key)."""
        encoded = encode_component(self.key)
        if len(self.consumer) + 1 + len(encoded) > MAX_ENCODED_LENGTH:
            encoded = _HASHED + sha256_hex(self.key)
        return f"{self.consumer}{_SEPARATOR}{encoded}"

    @classmethod
    def from_message_id(cls, consumer: str, message_id: str | None) -> DedupKey:
        """Key from a producer-assigned Service Bus `MessageId` (or AMQP message-id)."""
        if message_id is None or (isinstance(message_id, str) and not message_id.strip()):
            raise InvalidKeyError("message has no MessageId; the producer must set one")
        return cls(consumer, _check_text(message_id, "MessageId"))

    @classmethod
    def from_business_key(cls, consumer: str, value: str | None, *, field: str = "key") -> DedupKey:
        """Key from a business idempotency key (order id, payment reference, header)."""
        if field.replace("-", "_").lower() in TRANSPORT_FIELDS or field.lower() in TRANSPORT_FIELDS:
            raise InvalidKeyError(
                f"{field!r} is a transport-level value that changes on redelivery or groups "
                "many messages; it cannot identify a message"
            )
        if value is None or (isinstance(value, str) and not value.strip()):
            raise InvalidKeyError(f"business key {field!r} is missing")
        return cls(consumer, _check_text(value, field))

    @classmethod
    def from_cloudevent(cls, consumer: str, source: str | None, event_id: str | None) -> DedupKey:
        """Key from a CloudEvent: `source` + `id` identify it (CloudEvents spec)."""
        if not source or not isinstance(source, str):
            raise InvalidKeyError("CloudEvent has no 'source'")
        if not event_id or not isinstance(event_id, str):
            raise InvalidKeyError("CloudEvent has no 'id'")
        # A JSON pair keeps ("a b", "c") and ("a", "b c") apart and stays readable.
        raw = json.dumps([source, event_id], ensure_ascii=False, separators=(",", ":"))
        return cls(consumer, _check_text(raw, "CloudEvent source+id"))


def canonical_json(value: Any) -> bytes:
    """Stable bytes for a JSON-compatible value: sorted keys, no whitespace, UTF-8."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"payload is not canonical JSON: {error}") from error
    return text.encode("utf-8")


def request_hash(payload: Any, *, fields: tuple[str, ...] | None = None) -> str:
    """SHA-256 of the payload's canonical form, or of selected immutable fields.

    Bytes are hashed as they are; anything else as canonical JSON, so key order
    and whitespace in the producer's JSON do not matter.
    """
    if fields is not None:
        if not isinstance(payload, dict):
            raise ValueError("fields= needs a JSON object payload")
        mapping = cast(dict[str, Any], payload)
        payload = {name: mapping.get(name) for name in fields}
    data = (bytes(cast(bytes, payload)) if isinstance(payload, (bytes, bytearray, memoryview))
            else canonical_json(payload))
    return "sha256:" + hashlib.sha256(data).hexdigest()
