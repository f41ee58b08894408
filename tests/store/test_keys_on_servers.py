"""Key encoding: any unicode, forbidden characters and very long keys are accepted
by the real servers, and distinct inputs never share a record."""

from __future__ import annotations

import itertools
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import DedupKey, Idempotency, OutcomeStatus, request_hash
from shared._core.keys import MAX_ENCODED_LENGTH

FORBIDDEN = "/\\#?\x00\x01\x1f\x7f\x80\x9f'\"%&+ |!~"
keys = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(alphabet=FORBIDDEN + "ab", min_size=1, max_size=20),
    st.text(alphabet=string.printable, min_size=300, max_size=2000),
    st.text(min_size=200, max_size=400),
)
_examples = itertools.count()


@pytest.mark.parametrize("backend", ["table", "cosmos"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(keys, min_size=2, max_size=4, unique=True))
def test_arbitrary_keys_round_trip_and_never_collide(make_store, backend, values, request):
    store = request.node.__dict__.setdefault("_store", make_store(backend))
    idem = Idempotency(store)
    consumer = f"keys-{next(_examples)}"  # one namespace per example
    for value in values:
        dedup_key = DedupKey(consumer, value)
        assert len(dedup_key.encoded) <= MAX_ENCODED_LENGTH
        outcome = idem.run(dedup_key, request_hash(value), lambda v=value: v)
        # A fresh key must be new to the store, else two inputs shared a record.
        assert outcome.status is OutcomeStatus.PROCESSED, value
        again = idem.run(dedup_key, request_hash(value), lambda: "again")
        assert again.status is OutcomeStatus.DUPLICATE
        assert again.result == value
        assert store.get_record(outcome.record.partition_key, outcome.record.id).key.key == value
