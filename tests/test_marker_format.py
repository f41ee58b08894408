"""The marker format (shared/_core/codec.py, version 1): what a marker holds, that every
record reads back as it was written, and that a marker this library cannot read is refused."""

from __future__ import annotations

import datetime
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared._core.codec import (
    ATTEMPTS,
    CREATED,
    EXPIRES,
    FORMAT_VERSION,
    HASH,
    KEY,
    LEASE,
    RESULT,
    RESULT_VALUE,
    STATE,
    VERSION,
    WRITTEN,
    MarkerFormatError,
    check_flat,
    is_record,
    record_fields,
    record_from_fields,
)
from shared._core.keys import REQUEST_HASH_LENGTH, DedupKey, request_hash
from shared._core.outbox import EventPosition, outgoing
from shared._core.records import IdempotencyRecord, RecordState

NOW = 1_800_000_000.123
KEY_ = DedupKey.from_cloudevent("payments", "/src", "pay-1")


def read(fields: dict, record: IdempotencyRecord) -> IdempotencyRecord:
    stored = json.loads(json.dumps(fields))  # as a store returns it: plain JSON values
    return record_from_fields(stored, record_id=record.id, partition=record.partition_key,
                              etag=None)


def completed(**changes) -> IdempotencyRecord:
    base = IdempotencyRecord(KEY_, RecordState.COMPLETED, request_hash({"amount": 5}), NOW, NOW,
                             expires_at=NOW + 604_800, partition="acct-1")
    return base.evolve(**changes)


def test_a_completed_marker_holds_its_version_hash_time_and_expiry_only():
    fields = record_fields(completed())
    assert fields == {VERSION: FORMAT_VERSION, HASH: request_hash({"amount": 5}),
                      WRITTEN: 1_800_000_000_123, EXPIRES: 1_800_604_800_123}
    assert is_record(fields) and not is_record({"balanceCents": 5})


def test_what_is_not_the_default_is_written_and_read_back():
    record = completed(state=RecordState.IN_PROGRESS, lease_expires_at=NOW + 60, attempts=3,
                       created_at=NOW - 5, result={"balanceCents": 10})
    fields = record_fields(record)
    assert fields[STATE] == "in_progress" and fields[LEASE] == 1_800_000_060_123
    assert fields[ATTEMPTS] == 3 and fields[CREATED] == 1_799_999_995_123
    assert fields[RESULT] == '{"balanceCents":10}' and RESULT_VALUE not in fields
    assert read(fields, record) == record
    native = record_fields(record, native_json=True)
    assert native[RESULT_VALUE] == {"balanceCents": 10} and RESULT not in native
    assert read(native, record) == record


def test_the_request_hash_is_stored_as_request_hash_gives_it_and_reads_back():
    digest = request_hash({"type": "payment.credit", "amountCents": 1200})
    fields = record_fields(completed(request_hash=digest))
    assert fields[HASH] == digest and len(digest) == REQUEST_HASH_LENGTH
    assert read(fields, completed()).request_hash == digest


def test_the_key_is_read_back_from_the_id_and_stored_only_where_the_id_cannot_give_it():
    assert KEY not in record_fields(completed())  # the id is the key's encoding
    assert read(record_fields(completed()), completed()).key == KEY_
    own_id = completed(record_id="ORD-1", partition="ORD-1")  # a document that is its marker
    assert record_fields(own_id)[KEY] == f"payments|{KEY_.key}"
    assert read(record_fields(own_id), own_id) == own_id
    long_key = DedupKey("c", "x" * 300)  # its encoding is its SHA-256
    hashed = completed(key=long_key)
    assert long_key.hashed and record_fields(hashed)[KEY] == f"c|{'x' * 300}"
    assert read(record_fields(hashed), hashed) == hashed


def test_a_marker_written_under_another_id_carries_its_key():
    """A further marker of a group commit travels as a write of its own, under that write's id."""
    fields = record_fields(completed(), written_id="elsewhere")
    assert fields[KEY] == f"payments|{KEY_.key}"
    back = record_from_fields(fields, record_id="elsewhere", partition="acct-1", etag=None)
    assert back == completed(record_id="elsewhere")


@pytest.mark.parametrize("version", [2, 0, "1", None, True])
def test_a_marker_of_a_version_this_library_does_not_know_is_refused(version):
    fields = {**record_fields(completed()), VERSION: version}
    with pytest.raises(MarkerFormatError, match=f"format version {version!r}.*upgrade"):
        read(fields, completed())


def test_a_marker_without_its_hash_time_or_key_is_refused():
    for missing in (HASH, WRITTEN):
        fields = {k: v for k, v in record_fields(completed()).items() if k != missing}
        with pytest.raises(MarkerFormatError, match="lacks"):
            read(fields, completed())
    with pytest.raises(MarkerFormatError, match="its key"):  # an id that is no key's encoding
        record_from_fields(record_fields(completed()), record_id="not-a-key", partition="p",
                           etag=None)


def test_a_missing_written_time_is_the_expiry_less_the_items_ttl():
    """A Cosmos DB item carries its ttl: the store leaves iT out where the two give it."""
    fields = record_fields(completed(), native_json=True)
    del fields[WRITTEN]
    fields["ttl"] = 604_800
    assert read(fields, completed()) == completed()


def test_the_fields_of_a_marker_are_reserved_on_a_business_document():
    for name in (VERSION, HASH, RESULT_VALUE, "o0", "o12", "oT", "oP"):
        with pytest.raises(ValueError, match="reserved"):
            check_flat({name: 1})
    check_flat({"orderId": "o-1", "o": 1, "oX": 2, "version": 3})


times = st.integers(1_500_000_000_000, 2_500_000_000_000).map(lambda ms: ms / 1000)
keys = st.builds(DedupKey, st.sampled_from(["payments", "orders", "c.1:x"]),
                 st.text(min_size=1, max_size=400))
results = st.none() | st.recursive(
    st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)
bodies = st.one_of(st.binary(max_size=40), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


@st.composite
def records(draw: st.DrawFn) -> IdempotencyRecord:
    key = draw(keys)
    state = draw(st.sampled_from(RecordState))
    created, updated = draw(times), draw(times)
    destinations = draw(st.lists(st.sampled_from(["q", "r"]), max_size=3))
    messages = tuple(outgoing(key, destination, draw(bodies), ordinal=n)
                     for n, destination in enumerate(destinations))
    position = draw(st.none() | st.builds(
        EventPosition, st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=3),
        st.integers(0, 2**62), st.none() | st.datetimes().map(datetime.datetime.isoformat)))
    own_id = draw(st.booleans())
    return IdempotencyRecord(
        key=key, state=state, request_hash=request_hash(draw(st.binary(max_size=8))),
        created_at=created, updated_at=updated, expires_at=draw(st.none() | times),
        lease_expires_at=draw(times) if state is RecordState.IN_PROGRESS else None,
        attempts=draw(st.integers(1, 50)), result=draw(results),
        partition=draw(st.none() | st.text(min_size=1, max_size=20)),
        record_id=f"doc-{key.key[:20]}" if own_id else None,
        outbox=messages, outbox_position=position if messages else None)


@settings(max_examples=300, deadline=None)
@given(records(), st.booleans())
def test_every_record_reads_back_as_it_was_written(record, native_json):
    fields = record_fields(record, native_json=native_json)
    assert read(fields, record) == record
