"""Pure key logic: sources of keys, refusal of transport values, encoding properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import DedupKey, InvalidKeyError, request_hash
from shared.keys import MAX_ENCODED_LENGTH, encode_component, store_safe_id

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
    assert request_hash("x").startswith("jcs:sha256:") and request_hash(b"x").startswith("sha256:")
