"""Outgoing messages: derived ids, propagated identity, size rules and the stored form."""

from __future__ import annotations

import datetime
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared._core.exceptions import OutgoingMessageTooLargeError
from shared._core.keys import DedupKey
from shared._core.outbox import (
    MAX_BODY_BYTES,
    MAX_PENDING_BYTES,
    EventPosition,
    OutgoingMessage,
    check_pending_size,
    cleared_pending,
    decode_pending,
    encode_pending,
    has_pending,
    outgoing,
    outgoing_message_id,
)

KEY = DedupKey("orders", "ORD-1")


def test_message_id_is_the_same_on_every_rebuild_and_differs_by_key_destination_and_ordinal():
    first = outgoing_message_id(KEY, "notifications", 0)
    assert first == outgoing_message_id(DedupKey("orders", "ORD-1"), "notifications", 0)
    others = {
        outgoing_message_id(KEY, "notifications", 1),
        outgoing_message_id(KEY, "audit", 0),
        outgoing_message_id(DedupKey("orders", "ORD-2"), "notifications", 0),
        outgoing_message_id(DedupKey("billing", "ORD-1"), "notifications", 0),
    }
    assert first not in others and len(others) == 4
    assert len(first) <= 128


def test_outgoing_carries_the_incoming_key_and_correlation_id():
    message = outgoing(KEY, "notifications", {"orderId": "ORD-1", "total": 1.5}, ordinal=0,
                       correlation_id="corr-7", properties={"type": "OrderAccepted"})
    assert message.message_id == outgoing_message_id(KEY, "notifications", 0)
    assert json.loads(message.body) == {"orderId": "ORD-1", "total": 1.5}
    assert message.content_type == "application/json"
    assert message.correlation_id == "corr-7"
    assert str(message.properties["Idempotency-Key"]).startswith(KEY.encoded)
    assert message.properties["type"] == "OrderAccepted"


def test_caller_properties_and_id_win_over_the_derived_ones():
    message = outgoing(KEY, "q", b"\x00\x01", ordinal=3, message_id="mine",
                       properties={"Idempotency-Key": "theirs"})
    assert message.message_id == "mine"
    assert message.properties["Idempotency-Key"] == "theirs"
    assert message.content_type == "application/octet-stream"


def test_a_body_over_the_limit_is_refused_when_recorded():
    outgoing(KEY, "q", b"x" * MAX_BODY_BYTES, ordinal=0)
    with pytest.raises(OutgoingMessageTooLargeError, match="body"):
        outgoing(KEY, "q", b"x" * (MAX_BODY_BYTES + 1), ordinal=0)


def test_one_keys_messages_over_the_limit_are_refused_before_anything_is_stored():
    size = MAX_PENDING_BYTES // 3 + 1
    messages = [outgoing(KEY, "q", b"x" * size, ordinal=n) for n in range(3)]
    with pytest.raises(OutgoingMessageTooLargeError, match="at most"):
        check_pending_size(messages)
    with pytest.raises(OutgoingMessageTooLargeError):
        encode_pending(messages)
    check_pending_size(messages[:2])


def test_a_naive_scheduled_time_is_refused():
    with pytest.raises(ValueError, match="timezone"):
        OutgoingMessage(destination="q", body=b"", message_id="m",
                        scheduled_enqueue_time=datetime.datetime(2026, 1, 1))


def test_properties_are_frozen():
    message = outgoing(KEY, "q", b"", ordinal=0, properties={"a": 1})
    with pytest.raises(TypeError):
        message.properties["a"] = 2  # type: ignore[index]  # the point: a read-only mapping


def test_nothing_pending_is_no_field():
    assert encode_pending([]) == {}
    assert decode_pending({}) == [] and not has_pending({})
    assert decode_pending({"o0": ""}) == [] and not has_pending({"o0": ""})  # Table's blanked chunk


def test_cleared_pending_drops_every_chunk_and_keeps_the_other_fields():
    messages = [outgoing(KEY, "q", b"y" * 100_000, ordinal=n) for n in range(2)]
    fields = {"iV": 1, **encode_pending(messages)}
    assert has_pending(fields) and "o1" in fields  # more than one chunk
    cleared = cleared_pending(fields)
    assert cleared == {"iV": 1}
    assert not has_pending(cleared)


def test_what_the_carrying_key_derives_is_not_stored_and_reads_back():
    sent = [outgoing(KEY, "q", {"n": 1}, ordinal=0), outgoing(KEY, "q", [2], ordinal=1),
            outgoing(KEY, "r", "text", ordinal=0, message_id="own-id", properties={"a": 1})]
    (stored,) = encode_pending(sent, key=KEY, chunk_chars=None).values()
    # the derived id, the derived Idempotency-Key and the default content type are left out; a
    # compact JSON body is kept as its value
    assert stored[:2] == [{"d": "q", "j": {"n": 1}}, {"d": "q", "j": [2]}]
    assert stored[2] == {"d": "r", "b": "dGV4dA==", "i": "own-id", "t": "text/plain; charset=utf-8",
                         "p": {"a": 1}}
    assert decode_pending({"o0": stored}, key=KEY) == sent
    assert decode_pending(encode_pending(sent, key=KEY), key=KEY) == sent  # as text, too
    # without the key nothing is derived: every id and header is stored
    assert all("i" in value for value in encode_pending(sent, chunk_chars=None)["o0"])


def test_a_message_without_the_derived_header_reads_back_without_it():
    bare = OutgoingMessage(destination="q", body=b"{}", message_id=outgoing_message_id(KEY, "q", 0))
    assert decode_pending(encode_pending([bare], key=KEY), key=KEY) == [bare]


def test_a_body_that_is_not_compact_json_is_kept_as_bytes():
    for body in (b'{"a": 1}', b'{"a":1.50}', rb'["\u00e9"]', b"\xff", rb'"\ud800"', b"[1]\n"):
        message = outgoing(KEY, "q", body, ordinal=0)
        (value,) = encode_pending([message], key=KEY, chunk_chars=None)["o0"]
        assert "j" not in value and decode_pending({"o0": [value]}, key=KEY) == [message], body


def test_an_event_position_round_trips_as_text_and_as_a_list():
    for position in (EventPosition("hub", "0", 7), EventPosition("hub", "3", 2**40, "2026-01-01T00:00:00Z")):
        assert EventPosition.decode(position.encode()) == position
        assert EventPosition.decode(position.to_list()) == position
    assert EventPosition.decode("") is None and EventPosition.decode(None) is None


property_values = st.one_of(st.text(max_size=20), st.integers(-2**53, 2**53), st.booleans())
json_bodies = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8).map(lambda value: json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                                               allow_nan=False).encode("utf-8", "surrogatepass"))
messages = st.builds(
    OutgoingMessage,
    destination=st.text(min_size=1, max_size=40),
    body=st.binary(max_size=3000) | json_bodies,
    message_id=st.text(min_size=1, max_size=128),
    content_type=st.none() | st.text(max_size=30),
    correlation_id=st.none() | st.text(max_size=30),
    properties=st.dictionaries(st.text(max_size=15), property_values, max_size=5),
    session_id=st.none() | st.text(max_size=20),
    partition_key=st.none() | st.text(max_size=20),
    scheduled_enqueue_time=st.none() | st.datetimes(timezones=st.just(datetime.UTC)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, max_size=12), st.sampled_from([None, KEY]))
def test_the_stored_form_round_trips_and_fits_table_string_properties(batch, key):
    fields = encode_pending(batch, key=key)
    assert decode_pending(fields, key=key) == batch
    assert all(len(v) <= 32_768 for v in fields.values() if isinstance(v, str))
    assert all(v.isascii() for v in fields.values() if isinstance(v, str))


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, max_size=12), st.sampled_from([None, KEY]))
def test_the_stored_form_round_trips_as_one_json_value(batch, key):
    fields = encode_pending(batch, key=key, chunk_chars=None)
    assert list(fields) == (["o0"] if batch else [])
    assert decode_pending(json.loads(json.dumps(fields)), key=key) == batch  # as a store returns it
