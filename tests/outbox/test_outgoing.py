"""Outgoing messages: derived ids, propagated identity, size rules and the stored form."""

from __future__ import annotations

import datetime
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.exceptions import OutgoingMessageTooLargeError
from shared.keys import DedupKey
from shared.outbox import (
    MAX_BODY_BYTES,
    MAX_PENDING_BYTES,
    PENDING_COUNT,
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


def test_nothing_pending_is_one_field():
    assert encode_pending([]) == {PENDING_COUNT: 0}
    assert decode_pending({}) == [] and not has_pending({})


def test_cleared_pending_drops_every_chunk_and_keeps_the_other_fields():
    messages = [outgoing(KEY, "q", b"y" * 100_000, ordinal=n) for n in range(2)]
    fields = {"idemState": "completed", **encode_pending(messages)}
    assert has_pending(fields) and fields[PENDING_COUNT] > 1
    cleared = cleared_pending(fields)
    assert cleared == {"idemState": "completed", PENDING_COUNT: 0}
    assert not has_pending(cleared)


property_values = st.one_of(st.text(max_size=20), st.integers(-2**53, 2**53), st.booleans())
messages = st.builds(
    OutgoingMessage,
    destination=st.text(min_size=1, max_size=40),
    body=st.binary(max_size=3000),
    message_id=st.text(min_size=1, max_size=128),
    content_type=st.none() | st.text(max_size=30),
    correlation_id=st.none() | st.text(max_size=30),
    properties=st.dictionaries(st.text(max_size=15), property_values, max_size=5),
    session_id=st.none() | st.text(max_size=20),
    partition_key=st.none() | st.text(max_size=20),
    scheduled_enqueue_time=st.none() | st.datetimes(timezones=st.just(datetime.UTC)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(messages, max_size=12))
def test_the_stored_form_round_trips_and_fits_table_string_properties(batch):
    fields = encode_pending(batch)
    assert decode_pending(fields) == batch
    assert all(len(v) <= 32_768 for v in fields.values() if isinstance(v, str))
    assert all(v.isascii() for v in fields.values() if isinstance(v, str))
