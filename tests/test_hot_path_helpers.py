"""Per-message helpers made cheaper keep their exact results (key escaping, record copies)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.keys import DedupKey, encode_component
from shared.records import IdempotencyRecord, RecordState


def reference_encoding(value: str) -> str:
    """The escaping rule written out: every byte of each unsafe character as !XX."""
    safe = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:@")
    return "".join(ch if ch in safe else "".join(f"!{b:02X}" for b in ch.encode("utf-8"))
                   for ch in value)


@given(st.text(max_size=60))
def test_encoding_matches_the_rule_for_any_text(value):
    assert encode_component(value) == reference_encoding(value)
    assert encode_component(value) == reference_encoding(value)  # again, from the run cache


def test_a_cloudevent_key_encodes_as_before():
    key = DedupKey.from_cloudevent("payments", "/bench/1/payments", "pay-0000001")
    assert key.encoded == "payments|!5B!22!2Fbench!2F1!2Fpayments!22!2C!22pay-0000001!22!5D"


RECORD = IdempotencyRecord(DedupKey("c", "k"), RecordState.IN_PROGRESS, "h", 1.0, 2.0,
                           expires_at=9.0, lease_expires_at=3.0, partition="p", etag="e1")


@pytest.mark.parametrize("changes", [
    {}, {"state": RecordState.COMPLETED, "result": {"a": 1}, "lease_expires_at": None},
    {"etag": "e2"}, {"attempts": 4, "updated_at": 5.0}])
def test_evolve_equals_dataclasses_replace(changes):
    evolved = RECORD.evolve(**changes)
    expected = dataclasses.replace(RECORD, **changes)
    assert evolved == expected and evolved.etag == expected.etag
    assert type(evolved) is IdempotencyRecord and evolved is not RECORD
    assert RECORD.state is RecordState.IN_PROGRESS  # the original is untouched


def test_evolve_refuses_an_unknown_field():
    with pytest.raises(TypeError):
        RECORD.evolve(colour="red")
