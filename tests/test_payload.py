"""The bounded JSON decoder: every hostile body gets a reason code, never an exception."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared._core.payload import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    InvalidPayloadError,
    _depth,  # the walk the shortcut skips: the oracle
    check_text,
    exact_integer,
    parse_json,
    parse_json_object,
)

HOSTILE = [
    (b"[" * 5000 + b"]" * 5000, "TooDeeplyNested"),
    (b'{"a":' * 3000 + b"1" + b"}" * 3000, "TooDeeplyNested"),
    (b'{"amount": NaN}', "InvalidNumber"),
    (b'{"amount": Infinity}', "InvalidNumber"),
    (b'{"amount": -Infinity}', "InvalidNumber"),
    (b'{"amount": 1e400}', "NumberOutOfRange"),
    (b'{"amount": ' + b"9" * 5000 + b"}", "NumberOutOfRange"),
    (b'{"accountId": "\\ud800"}', "InvalidText"),
    (b'{"\\udfff": 1}', "InvalidText"),
    (b"\xff\xfe{}", "MalformedJson"),
    (b"{broken", "MalformedJson"),
    (b"x" * 2048, "PayloadTooLarge"),
]


@pytest.mark.parametrize(("body", "reason"), HOSTILE)
def test_hostile_bodies_are_refused_with_a_reason(body, reason):
    with pytest.raises(InvalidPayloadError) as caught:
        parse_json(body, max_bytes=1024 if reason == "PayloadTooLarge" else 10**6)
    assert caught.value.reason == reason


def test_brackets_inside_strings_do_not_count_as_nesting():
    body = json.dumps({"note": "[" * 500 + '\\"{' * 100}).encode()
    assert parse_json(body, max_bytes=10**6)["note"].startswith("[[[")


def test_depth_limit_is_inclusive():
    assert parse_json(b"[" * 32 + b"]" * 32, max_bytes=1000) is not None
    with pytest.raises(InvalidPayloadError):
        parse_json(b"[" * 33 + b"]" * 33, max_bytes=1000)


def test_objects_only_where_an_object_is_required():
    with pytest.raises(InvalidPayloadError, match="MalformedJson"):
        parse_json_object(b"[1]", max_bytes=100)


@pytest.mark.parametrize(("value", "reason"), [
    ("12", "InvalidPayment"), (True, "InvalidPayment"), (0, "InvalidPayment"), (1.5, "InvalidPayment"),
    (2**53, "NumberOutOfRange"), (2**63, "NumberOutOfRange"),
])
def test_exact_integers_are_refused_outside_their_range_never_rounded(value, reason):
    with pytest.raises(InvalidPayloadError) as caught:
        exact_integer(value, "amountCents", reason="InvalidPayment")
    assert caught.value.reason == reason
    assert exact_integer(MAX_SAFE_INTEGER, "x") == MAX_SAFE_INTEGER


@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text()
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(), inner, max_size=4), max_leaves=10))
def test_ordinary_json_round_trips(value):
    body = json.dumps(value).encode()
    assert parse_json(body, max_bytes=10**6) == value


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_escape_as_another_exception(body):
    with contextlib.suppress(InvalidPayloadError):  # any other exception fails the test
        parse_json(body, max_bytes=200)


# Strings that put surrogates, escaped backslashes before "ud8..", brackets and quotes into a body.
_TRICKY = st.lists(st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d\ude00", "\\ud800",
                                    "\\", "[[[", "{", '"', "a", "\u00e9"]), max_size=4).map("".join)


def _hex_upper(match: re.Match[str]) -> str:
    return match.group(0)[:2] + match.group(0)[2:].upper()


def _outcome(parse, body: bytes) -> tuple[str, object]:
    try:
        return "ok", parse(body)
    except InvalidPayloadError as error:
        return "refused", error.reason


def _without_shortcuts(body: bytes) -> object:
    """The decoder as it was before its shortcuts: every body's nesting walked byte by byte,
    every decoded string checked for surrogates."""
    if _depth(body) > MAX_DEPTH:
        raise InvalidPayloadError("TooDeeplyNested", "")
    value = parse_json(body, max_bytes=10**6, max_depth=10**6)
    check_text(value)
    return value


@given(st.recursive(st.none() | st.integers(-99, 99) | _TRICKY,
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(_TRICKY, inner, max_size=3), max_leaves=8),
       st.integers(0, 40), st.booleans(), st.booleans())
def test_the_shortcuts_refuse_exactly_what_the_full_checks_refuse(value, wrap, upper, ascii_only):
    """Counting brackets before walking them, and checking strings only when the body holds a
    surrogate escape, decide every body as the full walk and check do."""
    text = "[" * wrap + json.dumps(value, ensure_ascii=ascii_only) + "]" * wrap
    if upper:
        text = re.sub(r"\\u[0-9a-f]{4}", _hex_upper, text)
    body = text.encode("utf-8", "surrogatepass")
    assert _outcome(lambda b: parse_json(b, max_bytes=10**6), body) == _outcome(_without_shortcuts, body)
