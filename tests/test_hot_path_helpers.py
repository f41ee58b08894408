"""Per-message helpers made cheaper keep their exact results (key escaping, record copies,
JSON text from encoders built once)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared._core import jsontext
from shared._core.codec import ATTEMPTS, record_fields, record_from_fields
from shared._core.jsontext import compact_encoder
from shared._core.keys import DedupKey, encode_component
from shared._core.records import IdempotencyRecord, RecordState


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


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def python_encoder(*, sort_keys: bool) -> Callable[[Any], str]:
    """`compact_encoder` where the C accelerator is missing."""
    built, jsontext._C_MAKE_ENCODER = jsontext._C_MAKE_ENCODER, None
    try:
        return compact_encoder(sort_keys=sort_keys)
    finally:
        jsontext._C_MAKE_ENCODER = built


ENCODERS = {(c, sort): compact_encoder(sort_keys=sort) if c else python_encoder(sort_keys=sort)
            for c in (True, False) for sort in (False, True)}


@pytest.mark.parametrize("c_encoder", [True, False], ids=["c-encoder", "python-encoder"])
@pytest.mark.parametrize("sort_keys", [False, True])
@settings(deadline=None)  # the first examples build Hypothesis' own caches; slow on a busy machine
@given(value=JSON_VALUES)
def test_compact_encoder_writes_what_json_dumps_writes(c_encoder, sort_keys, value):
    assert ENCODERS[c_encoder, sort_keys](value) == json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys, allow_nan=False)


def test_compact_encoder_refuses_what_json_dumps_refuses():
    with pytest.raises(ValueError):
        compact_encoder()(math.nan)
    assert compact_encoder(allow_nan=True)([math.nan, math.inf]) == "[NaN,Infinity]"
    with pytest.raises(TypeError):
        compact_encoder()({"a": object()})
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(RecursionError):
        compact_encoder()(cyclic)


@pytest.mark.parametrize("attempts", [1, 2, 7])
def test_a_first_attempt_is_not_written_and_reads_back_as_one(attempts):
    record = RECORD.evolve(attempts=attempts, etag=None)
    fields = record_fields(record)
    assert (ATTEMPTS in fields) is (attempts != 1)
    assert record_from_fields(fields, record_id=record.id, partition=record.partition_key,
                              etag=None) == record
