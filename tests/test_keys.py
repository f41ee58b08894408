"""Pure key logic: sources of keys, refusal of transport values, encoding properties (and
reading a key back from its encoding), and the request hash (RFC 8785 canonical JSON, held to
the rfc8785 package; one form: base64url of the SHA-256 digest)."""

from __future__ import annotations

import base64
import hashlib
import json
import struct

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import DedupKey, request_hash
from shared._core.exceptions import InvalidKeyError
from shared._core.keys import (
    MAX_ENCODED_LENGTH,
    REQUEST_HASH_LENGTH,
    canonical_json,
    decode_component,
    encode_component,
    store_safe_id,
)
from shared._core.payload import parse_json

TABLE_FORBIDDEN = set("/\\#?") | {chr(c) for c in range(0x20)} | {chr(c) for c in range(0x7F, 0xA0)}


@given(st.text(min_size=1, max_size=3000))
def test_encoded_ids_are_store_safe_and_bounded(value):
    encoded = DedupKey("c", value).encoded
    assert len(encoded) <= MAX_ENCODED_LENGTH
    assert not set(encoded) & TABLE_FORBIDDEN


@given(st.text(min_size=1), st.text(min_size=1))
def test_distinct_inputs_never_share_an_encoding(a, b):
    if a != b:
        assert DedupKey("c", a).encoded != DedupKey("c", b).encoded
        assert encode_component(a) != encode_component(b)
        assert store_safe_id(a) != store_safe_id(b)


def test_encoding_is_deterministic_and_readable_for_plain_ids():
    assert DedupKey("orders", "ORD-1001").encoded == "orders|ORD-1001"
    assert DedupKey("orders", "a/b?c#d").encoded == DedupKey("orders", "a/b?c#d").encoded
    assert DedupKey("orders", "a/b").encoded == "orders|a!2Fb"


def test_long_keys_are_hashed_with_sha256():
    encoded = DedupKey("orders", "x" * 1000).encoded
    assert encoded.startswith("orders|~") and len(encoded) == len("orders|~") + 64


def test_consumer_scoping_gives_two_records_for_one_message():
    assert DedupKey("notify", "m1").encoded != DedupKey("audit", "m1").encoded


def test_cloudevent_key_is_source_plus_id_and_unambiguous():
    assert DedupKey.from_cloudevent("c", "a b", "c") != DedupKey.from_cloudevent("c", "a", "b c")
    assert DedupKey.from_cloudevent("c", "/src", "1").key == '["/src","1"]'
    with pytest.raises(InvalidKeyError, match="source"):
        DedupKey.from_cloudevent("c", None, "1")
    with pytest.raises(InvalidKeyError, match="'id'"):
        DedupKey.from_cloudevent("c", "/src", "")


@pytest.mark.parametrize("field", ["lock_token", "LockToken", "delivery_count", "enqueued_time",
                                   "CorrelationId", "correlation-id", "sequence_number"])
def test_transport_level_values_are_refused_as_keys(field):
    with pytest.raises(InvalidKeyError, match="transport-level"):
        DedupKey.from_business_key("c", "value", field=field)


@pytest.mark.parametrize("bad", [None, "", "   "])
def test_missing_message_id_is_refused(bad):
    with pytest.raises(InvalidKeyError, match="MessageId"):
        DedupKey.from_message_id("c", bad)


def test_oversized_and_undecodable_keys_are_refused():
    with pytest.raises(InvalidKeyError, match="bytes"):
        DedupKey("c", "x" * 20000)
    with pytest.raises(InvalidKeyError, match="Unicode"):
        DedupKey("c", "\ud800")
    with pytest.raises(InvalidKeyError, match="consumer"):
        DedupKey("bad/consumer", "k")


def test_request_hash_ignores_key_order_and_whitespace_but_not_values():
    assert request_hash({"a": 1, "b": [1, 2]}) == request_hash({"b": [1, 2], "a": 1})
    assert request_hash({"a": 1}) != request_hash({"a": 2})
    assert request_hash(b'{"a":1}') != request_hash(b'{"a": 1}')  # bytes hashed as they are
    assert request_hash({"id": 1, "ts": 5}, fields=("id",)) == request_hash({"id": 1, "ts": 9},
                                                                             fields=("id",))



def test_the_request_hash_is_the_sha256_digest_in_unpadded_base64url():
    digest = hashlib.sha256(canonical_json({"b": 1, "a": [1.0, "x"]})).digest()
    assert request_hash({"a": [1, "x"], "b": 1}) == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert request_hash(b"raw") == base64.urlsafe_b64encode(hashlib.sha256(b"raw").digest()).decode()[:43]
    assert request_hash(b"raw") != request_hash("raw")  # bytes as they are, text as JSON
    assert request_hash(canonical_json({"b": [1.0], "a": 2})) == request_hash({"a": 2, "b": [1]})
    for value in ({"a": 1}, b"", "text", [None]):
        digest_text = request_hash(value)
        assert type(digest_text) is str and len(digest_text) == REQUEST_HASH_LENGTH
        assert set(digest_text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        assert len(base64.urlsafe_b64decode(digest_text + "=")) == 32  # the whole digest


@given(st.text(min_size=1, max_size=600))
def test_a_key_reads_back_from_its_encoding_unless_it_was_hashed(value):
    key = DedupKey("c", value)
    assert decode_component(encode_component(value)) == value
    back = DedupKey.from_encoded(key.encoded)
    assert back == (None if key.hashed else key)


def test_texts_that_are_no_encoding_read_back_as_no_key():
    for text in ("no-separator", "c|~" + "0" * 64, "c|a!2f", "c|a!2Fb!", "c|!FF", "bad/c|k", "c|a/b"):
        assert DedupKey.from_encoded(text) is None, text
    assert DedupKey.from_encoded("orders|a!2Fb") == DedupKey("orders", "a/b")
    assert DedupKey.from_encoded('payments|!5B!22!2Fsrc!22!2C!221!22!5D') == DedupKey.from_cloudevent(
        "payments", "/src", "1")


# -- request hash: RFC 8785 canonical form -------------------------------------------------------
SAFE = 2**53 - 1  # the integer domain of an IEEE double, where RFC 8785 is defined for ints


_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_jcs_scalars = (st.none() | st.booleans() | st.integers(-SAFE, SAFE) | _text
                | st.floats(-(2.0**53), 2.0**53, allow_nan=False, allow_infinity=False))
_jcs_values = st.recursive(_jcs_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(_text, inner, max_size=4), max_leaves=20)


@settings(max_examples=1000, deadline=None)
@given(_jcs_values)
def test_canonical_json_is_rfc8785_within_the_double_integer_domain(value):
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=1000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_is_written_by_its_value(number):
    text = canonical_json(number).decode()
    if abs(number) < 2**53:
        assert text == rfc8785.dumps(number).decode()
    if number.is_integer():
        assert text == str(int(number))  # exact, also where a double no longer holds every integer
    assert float(text) == number


@settings(max_examples=1000, deadline=None)
@given(st.integers(-(2**70), 2**70), st.integers(-(2**70), 2**70))
def test_integers_beyond_2_53_are_hashed_exactly(a, b):
    assert (request_hash({"n": a}) == request_hash({"n": b})) == (a == b)
    assert canonical_json(a) == str(a).encode()


def test_big_integers_do_not_collide_with_their_nearest_double():
    assert request_hash(2**53 + 1) != request_hash(2**53)  # one double: RFC 8785 would merge them
    assert request_hash(2**53 + 1) != request_hash(float(2**53 + 1))
    assert request_hash(2**60) == request_hash(2.0**60)  # the same value in either type
    assert request_hash(1152921504606847000) != request_hash(2.0**60)  # JCS writes 2.0**60 so


@pytest.mark.parametrize("forms", [
    ("1", "1.0", "1e0", "1E0", "10e-1", "1.00000", "0.1e1"),
    ("-0", "0", "0.0", "-0.0", "0e5"),
    ("0.000001", "1e-6", "1.0E-6"),
    ("1e21", "1000000000000000000000.0"),
    ('"caf\\u00e9 \\ud83d\\ude00"', '"café 😀"'),
    ('"a/b"', '"a\\/b"'),
    ('"\\u0009\\u0022"', '"\\t\\""'),
])
def test_equivalent_serialisations_hash_alike(forms):
    hashes = {request_hash({"v": parse_json(form, max_bytes=1000)}) for form in forms}
    assert len(hashes) == 1


@pytest.mark.parametrize("body", [
    '{"accountId": "acct-1", "amountCents": 1200, "type": "payment.credit"}',
    '{"type":"payment.credit","amountCents":1.2e3,"accountId":"acct-1"}',
    '{\n  "amountCents" : 1200.0,\n  "accountId" : "\\u0061cct-1",\n  "type" : "payment\\u002ecredit"\n}',
])
def test_one_payment_serialised_by_three_runtimes_hashes_alike(body):
    expected = request_hash({"accountId": "acct-1", "amountCents": 1200, "type": "payment.credit"})
    assert request_hash(parse_json(body, max_bytes=1000)) == expected


@pytest.mark.parametrize(("a", "b"), [
    ({"a": 1}, {"a": 2}), ({"a": 1}, {"a": "1"}), ({"a": 1}, {"a": True}), ({"a": 0}, {"a": False}),
    ({"a": None}, {}), ({"a": 0.1}, {"a": 0.10000000000000002}), ({"a": [1, 2]}, {"a": [2, 1]}),
    ({"a": "é"}, {"a": "e\u0301"}), ({"a": 1}, {"A": 1}), ([{}], [[]]), ("1", 1),
])
def test_different_values_hash_differently(a, b):
    assert request_hash(a) != request_hash(b)


def test_keys_sort_by_utf16_code_units():
    # U+1F600 is a surrogate pair (D83D DE00): below U+E000 in UTF-16, above it by code point.
    assert canonical_json({"\ue000": 1, "\U0001f600": 2, "a": 3}) == (
        '{"a":3,"\U0001f600":2,"\ue000":1}'.encode())
    # RFC 8785 section 3.2.3's own example of the sort order.
    example = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet",
               "1": "One", "\U0001f600": "Emoji: Grinning Face", "\u0080": "Control",
               "\u00f6": "Latin Small Letter O With Diaeresis"}
    assert list(json.loads(canonical_json(example))) == [
        "\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


def test_rfc8785_number_examples():
    # RFC 8785 appendix B: IEEE 754 values and their canonical text.
    for bits, text in [("0000000000000000", "0"), ("8000000000000000", "0"),
                       ("0000000000000001", "5e-324"), ("8000000000000001", "-5e-324"),
                       ("4340000000000000", "9007199254740992"), ("c340000000000000", "-9007199254740992"),
                       ("3eb0c6f7a0b5ed8d", "0.000001"), ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
                       ("41b3de4355555553", "333333333.3333332"), ("41b3de4355555554", "333333333.33333325"),
                       ("41b3de4355555556", "333333333.3333334"), ("41b3de4355555557", "333333333.33333343"),
                       ("3fd5555555555555", "0.3333333333333333"), ("4037000000000000", "23")]:
        number = struct.unpack(">d", bytes.fromhex(bits))[0]
        assert canonical_json(number) == text.encode(), bits


def test_refused_values_say_so():
    for bad in (float("nan"), float("inf"), {"a": {1, 2}}, "\ud800", {"\U0001f600": 1, "\ud800": 2}):
        with pytest.raises(ValueError, match="not canonical JSON"):
            request_hash(bad)


def test_selected_fields_are_canonical_and_a_missing_field_counts_as_null():
    assert request_hash({"id": 1, "amount": 5.0, "ts": 1}, fields=("id", "amount")) == request_hash(
        {"amount": 5, "id": 1.0, "ts": 2}, fields=("id", "amount"))
    assert request_hash({"id": 1}, fields=("id", "note")) == request_hash({"id": 1, "note": None},
                                                                          fields=("id", "note"))
    assert request_hash({"id": 1}, fields=("id",)) != request_hash({"id": 2}, fields=("id",))
    with pytest.raises(ValueError, match="fields"):
        request_hash([1], fields=("id",))
