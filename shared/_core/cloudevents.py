"""CloudEvents 1.0 from Event Hubs events: structured (JSON body) and binary mode.

Binary mode carries the attributes as application properties: `ce_id` (Kafka-style) or
`cloudEvents:id` / `cloudEvents_id` (the AMQP binding). A structured event carries `data` (a
JSON value) or `data_base64`, never both; binary data and a binary-mode body are decoded as JSON
when the content type declares JSON (`*/json`, `*/*+json`) and kept as bytes otherwise.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from shared._core.payload import InvalidPayloadError, check_text, parse_json

REQUIRED = ("id", "source", "type", "specversion")
MAX_EVENT_BYTES = 1024 * 1024  # an Event Hubs event (Premium/Dedicated); Standard allows 1 MB
_SCALARS = (str, int, float, bool, type(None))
_PREFIXES = ("ce_", "cloudEvents:", "cloudEvents_", "ce-")
_KNOWN = frozenset({*REQUIRED, "data", "subject", "time", "datacontenttype", "data_base64"})


class InvalidEventError(InvalidPayloadError):
    """The event is not a usable CloudEvent; `reason` is a short stable code."""


@dataclass(frozen=True)
class CloudEvent:
    id: str
    source: str
    type: str
    specversion: str
    data: Any = None
    subject: str | None = None
    time: str | None = None
    datacontenttype: str | None = None
    extensions: dict[str, Any] = field(default_factory=dict[str, Any])


def as_text(value: Any) -> Any:
    """AMQP properties may arrive as bytes; text is what the code compares."""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _binary_attributes(properties: Mapping[Any, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for raw_name, value in properties.items():
        name = str(as_text(raw_name))
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                attributes[name[len(prefix):].lower()] = as_text(value)
                break
    return attributes


def _event_error(error: InvalidPayloadError) -> InvalidEventError:
    return InvalidEventError(error.reason, error.detail)


def _json(body: bytes, max_bytes: int) -> Any:
    try:  # try/except, not a context manager: it runs for every event
        return parse_json(body, max_bytes=max_bytes)
    except InvalidPayloadError as error:
        raise _event_error(error) from error


def declares_json(content_type: object) -> bool:
    """Whether a media type declares JSON data: `*/json` or `*/*+json`, parameters aside. An
    absent type declares nothing here; what it means is the caller's call."""
    if not isinstance(content_type, str):
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    subtype = media.partition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


def _data(body: bytes, content_type: str | None, max_bytes: int) -> Any:
    return _json(body, max_bytes) if declares_json(content_type) else body


def _base64_data(envelope: dict[str, Any], max_bytes: int) -> Any:
    encoded = envelope["data_base64"]
    if "data" in envelope:
        raise InvalidEventError("MalformedCloudEvent",
                                "has both data and data_base64; the JSON format allows one")
    if not isinstance(encoded, str):
        raise InvalidEventError("MalformedCloudEvent", "data_base64 must be a base64 string")
    try:  # strict RFC 4648: the standard alphabet, padded, nothing else (no line breaks)
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidEventError("MalformedCloudEvent",
                                f"data_base64 is not valid base64: {error}") from error
    content_type = envelope.get("datacontenttype")
    return _data(raw, content_type if isinstance(content_type, str) else None, max_bytes)


def parse_cloudevent(body: bytes, properties: Mapping[Any, Any] | None = None,
                     content_type: str | None = None, *,
                     max_bytes: int = MAX_EVENT_BYTES) -> CloudEvent:
    """Decode one CloudEvent, or raise InvalidEventError saying what is wrong. Binary-mode
    attributes must be scalars of valid Unicode text; `data` is a JSON value or, for binary data
    of a non-JSON content type, bytes."""
    attributes = _binary_attributes(properties) if properties else {}
    if attributes:
        if any(not isinstance(value, _SCALARS) for value in attributes.values()):
            raise InvalidEventError("MalformedCloudEvent", "attributes must be scalar values")
        try:
            check_text(attributes, "CloudEvent attributes")
        except InvalidPayloadError as error:
            raise _event_error(error) from error
    structured = (content_type or "").startswith("application/cloudevents") or not attributes
    if structured:
        envelope = _json(body, max_bytes)
        if not isinstance(envelope, dict):
            raise InvalidEventError("MalformedCloudEvent", "structured event must be a JSON object")
        attributes = cast(dict[str, Any], envelope)
        if attributes.get("data_base64") is not None:
            data = _base64_data(attributes, max_bytes)
        else:
            data = attributes.get("data")
    else:
        # The message's content type is the event's datacontenttype (protocol bindings); an
        # unlabelled body is read as JSON, as the JSON format implies and as it always was.
        media = content_type or attributes.get("datacontenttype")
        attributes["datacontenttype"] = media
        data = _data(body, media or "application/json", max_bytes) if body else None
    missing = [name for name in REQUIRED if not attributes.get(name)]
    if missing:
        raise InvalidEventError("MissingCloudEventAttributes", f"missing {', '.join(missing)}")
    wrong = [name for name in REQUIRED if not isinstance(attributes[name], str)]
    if not isinstance(attributes.get("datacontenttype") or "", str):
        wrong.append("datacontenttype")
    if wrong:
        raise InvalidEventError("MalformedCloudEvent", f"{', '.join(wrong)} must be strings")
    return CloudEvent(
        id=attributes["id"], source=attributes["source"], type=attributes["type"],
        specversion=attributes["specversion"], data=data, subject=attributes.get("subject"),
        time=attributes.get("time"), datacontenttype=attributes.get("datacontenttype"),
        extensions={k: v for k, v in attributes.items() if k not in _KNOWN},
    )
