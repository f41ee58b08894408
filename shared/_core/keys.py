"""Dedup keys: where they come from, how they are scoped, and how they are stored.

A key is scoped by consumer (two consumers of one message each apply it once), built only from
stable message identity (never a delivery's), and encoded so any input is a valid Table Storage
PartitionKey/RowKey and Cosmos DB id: deterministic and injective, with long keys replaced by
their SHA-256 (the marker then carries the raw key). The request hash (`request_hash`) tells a
duplicate from a key reused for other content, however a producer serialised the same JSON.
"""

# Callers pass what a trigger delivered (untyped at run time): the isinstance checks on
# parameters typed str are the guard, not redundant.
# pyright: reportUnnecessaryIsInstance=false
from __future__ import annotations

import base64
import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any, cast

from shared._core.exceptions import ConfigurationError, InvalidKeyError, PoisonMessageError
from shared._core.jsontext import compact_encoder

# Characters kept as they are; everything else becomes "!XX" per UTF-8 byte.
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9\-_.:@]+")
_ESCAPE = "!"
_SEPARATOR = "|"  # never produced by encode_component
_HASHED = "~"  # never produced by encode_component
MAX_ENCODED_LENGTH = 250  # Cosmos id <= 255 chars; Table keys <= 1 KiB
MAX_RAW_KEY_BYTES = 16 * 1024
_CONSUMER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_compact_json = compact_encoder()
_sorted_json = compact_encoder(sort_keys=True)

# Broker-generated values that change on redelivery or group many messages.
TRANSPORT_FIELDS = frozenset({
    "lock_token", "locktoken", "delivery_count", "deliverycount", "enqueued_time",
    "enqueuedtime", "enqueued_time_utc", "enqueuedtimeutc", "correlation_id",
    "correlationid", "sequence_number", "sequencenumber", "offset", "receive_time",
    "locked_until", "lockeduntil", "lockeduntilutc",
})


def _escape(match: re.Match[str]) -> str:
    return _escaped_run(match.group())


@functools.lru_cache(maxsize=4096)  # keys of one stream share their unsafe runs ('["', '/', ...)
def _escaped_run(run: str) -> str:
    return "".join(f"{_ESCAPE}{byte:02X}" for byte in run.encode("utf-8"))


def encode_component(value: str) -> str:
    """Escape `value` into the store-safe alphabet; injective, not length-limited."""
    return _UNSAFE_RUN.sub(_escape, value)


_ESCAPED_RUN = re.compile(r"(?:![0-9A-F]{2})+")


def _unescape(match: re.Match[str]) -> str:
    return bytes.fromhex(match.group().replace(_ESCAPE, "")).decode("utf-8")


def decode_component(encoded: str) -> str:
    """The text `encode_component` turned into `encoded`; ValueError for text it never writes."""
    try:
        value = _ESCAPED_RUN.sub(_unescape, encoded)
    except UnicodeDecodeError as error:
        raise ValueError(f"{encoded!r} escapes bytes that are not UTF-8") from error
    if encode_component(value) != encoded:
        raise ValueError(f"{encoded!r} is not an encoded component")
    return value


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

    @property
    def hashed(self) -> bool:
        """Whether `encoded` holds the key's SHA-256 (a long key) rather than its text."""
        return self.encoded.startswith(_HASHED, len(self.consumer) + 1)

    @classmethod
    def from_encoded(cls, encoded: str) -> DedupKey | None:
        """The key whose `encoded` is `encoded`; None when it hashed a long key or is no key's
        encoding."""
        consumer, separator, rest = encoded.partition(_SEPARATOR)
        if not separator or rest.startswith(_HASHED):
            return None
        try:
            key = cls(consumer, decode_component(rest))
        except ValueError:  # InvalidKeyError is one
            return None
        return key if key.encoded == encoded else None

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
        raw = _compact_json([source, event_id])
        return cls(consumer, _check_text(raw, "CloudEvent source+id"))


def consumer_name(name: str) -> str:
    """A consumer's name as its keys scope it; ConfigurationError (at construction) for one
    no key can carry."""
    try:
        return DedupKey(name, "-").consumer
    except InvalidKeyError as error:
        raise ConfigurationError(str(error)) from error


def message_id_key(consumer: str, message_id: str | None) -> DedupKey:
    """The key of a message by its id; PoisonMessageError (InvalidMessageId) when it has none
    a key can carry."""
    try:
        return DedupKey.from_message_id(consumer, message_id)
    except InvalidKeyError as error:
        raise PoisonMessageError("InvalidMessageId", str(error)) from error


@dataclass(frozen=True, slots=True)
class Identified[T]:
    """A parsed message's item, key and request hash (what the dedup flow is called with)."""

    item: T
    key: DedupKey
    request_hash: str


# -- request hash ---------------------------------------------------------------------------
# SHA-256 of the canonical bytes below (of a bytes payload itself), as unpadded base64url. A
# marker's format version (shared._core.codec) names this algorithm: a change to it is a new
# marker version, never a second form here.
REQUEST_HASH_LENGTH = 43

# json.dumps writes every float as a digit followed by "." or a signed exponent, which no other
# token holds: without a hit there is no float (a hit inside a string only costs the exact pass).
_FLOAT_HINT = re.compile(r"\d(?:\.|e[-+])")
_STRING = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")')
_FLOAT = re.compile(r"-?\d+(?:\.\d+(?:e[-+]\d+)?|e[-+]\d+)")
# Characters whose UTF-16 order differs from code-point order (surrogate pairs sort below
# U+E000-U+FFFF in UTF-16): only text holding one of these needs the UTF-16 key sort.
_UTF16_ORDER_MATTERS = re.compile("[\ue000-\U0010ffff]")


def _number(value: float) -> str:
    """A float by its value: integral ones as exact integer digits (1.0 -> "1", as RFC 8785
    writes them below 2**53), others in ECMAScript's shortest form (RFC 8785 section 3.2.2.3)."""
    if value.is_integer():
        return str(int(value))  # also -0.0 -> "0"
    text = repr(value)  # shortest round-trip digits, as ECMAScript chooses them
    mantissa, _, exponent = text.partition("e")
    if not exponent:
        return text  # non-integral, so |value| < 2**52: positional in both notations
    power = int(exponent)  # negative: a non-integral double below 1e-4
    if power >= -6:  # ECMAScript is positional down to 1e-6; Python switches at 1e-4
        sign, digits = ("-", mantissa[1:]) if mantissa.startswith("-") else ("", mantissa)
        return f"{sign}0.{'0' * (-power - 1)}{digits.replace('.', '')}"
    return f"{mantissa}e{power}"  # "1.5e-7": no zero padding, as ECMAScript writes it


def _float_token(match: re.Match[str]) -> str:
    return _number(float(match.group()))  # repr's digits read back to the same double


def _rewrite_floats(text: str) -> str:
    """json.dumps output with its floats (outside strings) in the canonical number form."""
    pieces = _STRING.split(text)  # outside, string, outside, ..., outside
    for index in range(0, len(pieces), 2):
        if "." in pieces[index] or "e" in pieces[index]:
            pieces[index] = _FLOAT.sub(_float_token, pieces[index])
    return "".join(pieces)


def _utf16_key(key: Any) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"object keys must be strings, got {type(key).__name__}")
    return key.encode("utf-16-be", "surrogatepass")


def _utf16_ordered(value: Any) -> Any:
    """`value` with every object's keys in UTF-16 code-unit order (RFC 8785 section 3.2.3)."""
    if isinstance(value, dict):
        mapping = cast(dict[Any, Any], value)
        return {key: _utf16_ordered(mapping[key]) for key in sorted(mapping, key=_utf16_key)}
    if isinstance(value, (list, tuple)):
        return [_utf16_ordered(item) for item in cast(list[Any], value)]
    return value


def canonical_json(value: Any) -> bytes:
    """The canonical bytes of a JSON value: RFC 8785 (JCS), with exact integers beyond 2**53.

    JCS writes every number as an IEEE double, which would merge different integers above
    2**53, so here integral numbers are written as their exact digits and other floats in the
    ECMAScript form JCS prescribes: byte for byte RFC 8785 below 2**53, and above it equal
    values (2**60 and 2.0**60) still share one form. Object keys must be strings; ValueError
    for a value that is not JSON.

    json.dumps already writes JCS strings, ints and literals and sorts keys by code point,
    which is UTF-16 order unless the text holds a character at or above U+E000: only then are
    keys re-sorted, and only floats are rewritten.
    """
    try:
        text = _sorted_json(value)
        if not text.isascii() and _UTF16_ORDER_MATTERS.search(text):
            text = _compact_json(_utf16_ordered(value))
        if _FLOAT_HINT.search(text):
            text = _rewrite_floats(text)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as error:  # UnicodeEncodeError is a ValueError
        raise ValueError(f"payload is not canonical JSON: {error}") from error


def _digest_text(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def request_hash(payload: Any, *, fields: tuple[str, ...] | None = None) -> str:
    """SHA-256 of the payload's canonical form, or of selected immutable fields, as 43
    characters of unpadded base64url.

    Bytes are hashed as they are; anything else as `canonical_json`, so key order, whitespace,
    escapes and number spelling (1, 1.0, 1e0) do not matter, while any difference in value
    does. With `fields`, only those count, a missing one as null (serialisers differ in whether
    they write nulls). Two hashes are the same request exactly when they are equal.
    """
    if fields is not None:
        if not isinstance(payload, dict):
            raise ValueError("fields= needs a JSON object payload")
        mapping = cast(dict[str, Any], payload)
        payload = {name: mapping.get(name) for name in fields}
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return _digest_text(bytes(cast(bytes, payload)))
    return _digest_text(canonical_json(payload))
