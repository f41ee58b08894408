"""A bounded JSON decoder for untrusted message bodies, shared by every entry point.

`json.loads` on a hostile body can raise RecursionError, accept NaN/Infinity, return lone
surrogates that fail later when encoded, and turn 1e400 into infinity; any of those escaping a
trigger is retried until the broker gives up (on Event Hubs, a stalled partition). `parse_json`
refuses each with a stable reason code on the first delivery instead.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, cast

from shared._core.exceptions import PoisonMessageError

MAX_DEPTH = 32
MAX_SAFE_INTEGER = 2**53 - 1  # exact in a Cosmos DB number (IEEE double) and in Edm.Int64
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
# Text decoded strictly from UTF-8 holds no surrogate, so only a \uD800-\uDFFF escape can put one
# in a decoded string (an escaped backslash before "uD8.." is a false alarm: the full check runs).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class InvalidPayloadError(PoisonMessageError, ValueError):
    """The body cannot be accepted as it is; `reason` is a short stable code for the dead-letter
    reason, the parking entry or a problem+json title."""


def _depth(data: bytes) -> int:
    """Deepest bracket nesting outside strings, in one linear pass (no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif byte in _CLOSE:
            depth -= 1
    return deepest


def _refuse_constant(name: str) -> Any:
    raise InvalidPayloadError("InvalidNumber", f"{name} is not a JSON number")


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > 20:  # also keeps int() away from its 4,300-digit limit
        raise InvalidPayloadError("NumberOutOfRange", f"integer with {len(text)} digits")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidPayloadError("NumberOutOfRange", f"{text[:40]} overflows a double")
    return value


# Built once: `json.loads` with hooks builds a decoder and its C scanner on every call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_int=_integer,
                            parse_float=_float)


def check_text(value: Any, where: str = "value") -> None:
    """Every string (keys included) must be encodable Unicode: no lone surrogates."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                raise InvalidPayloadError("InvalidText", f"{where} holds a lone surrogate at "
                                                         f"{error.start}") from error
        elif isinstance(item, dict):
            mapping = cast(dict[Any, Any], item)
            stack.extend(mapping.keys())
            stack.extend(mapping.values())
        elif isinstance(item, list):
            stack.extend(cast(list[Any], item))


def parse_json(body: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Decode an untrusted JSON body, or raise InvalidPayloadError with a reason code:
    PayloadTooLarge, MalformedJson, TooDeeplyNested, InvalidNumber, NumberOutOfRange,
    InvalidText."""
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    if len(data) > max_bytes:
        raise InvalidPayloadError("PayloadTooLarge", f"{len(data)} bytes; at most {max_bytes}")
    # Nesting is at most the number of opening brackets: count them in C before walking the bytes.
    if data.count(b"[") + data.count(b"{") > max_depth:
        depth = _depth(data)
        if depth > max_depth:
            raise InvalidPayloadError("TooDeeplyNested",
                                      f"nesting depth {depth}; at most {max_depth}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidPayloadError("MalformedJson", f"not UTF-8: {error.reason}") from error
    try:
        value = _DECODER.decode(text)
    except InvalidPayloadError:
        raise
    except (ValueError, RecursionError) as error:
        raise InvalidPayloadError("MalformedJson", str(error)[:200]) from error
    if _SURROGATE_ESCAPE.search(data):
        check_text(value, "body")
    return value


def parse_json_object(body: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH
                      ) -> dict[str, Any]:
    """`parse_json` for bodies that must be a JSON object."""
    value = parse_json(body, max_bytes=max_bytes, max_depth=max_depth)
    if not isinstance(value, dict):
        raise InvalidPayloadError("MalformedJson", "body must be a JSON object")
    return cast(dict[str, Any], value)


def exact_integer(value: Any, name: str, *, reason: str = "InvalidNumber", minimum: int = 1,
                  maximum: int = MAX_SAFE_INTEGER) -> int:
    """An integer in [minimum, maximum] that both stores hold exactly; never rounded. Not an
    integer or below `minimum`: `reason`; above `maximum`: NumberOutOfRange."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidPayloadError(reason, f"{name} must be an integer >= {minimum}")
    if value > maximum:
        raise InvalidPayloadError("NumberOutOfRange", f"{name}={value} is above {maximum}")
    return value
