"""The stored form of pending messages survives both real stores at the size limit."""

from __future__ import annotations

import pytest

from shared._core.keys import DedupKey
from shared._core.outbox import MAX_PENDING_BYTES, outgoing
from shared._core.records import IdempotencyRecord, RecordState

KEY = DedupKey("orders", "ORD-big")


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_a_keys_largest_pending_messages_are_written_and_read_back_whole(make_store, backend):
    store = make_store(backend)
    size = MAX_PENDING_BYTES // 2 - 2_000  # two messages just under the per-key limit
    messages = [outgoing(KEY, "notifications", bytes(range(256)) * (size // 256), ordinal=n,
                         correlation_id="c", properties={"type": "OrderAccepted", "n": n})
                for n in range(2)]
    marker = IdempotencyRecord(KEY, RecordState.COMPLETED, "h", created_at=1.0, updated_at=1.0,
                               partition="p1", record_id="marker-1", outbox=tuple(messages))
    store.commit(marker, [])
    stored = store.get_record("p1", "marker-1")
    assert stored is not None
    assert list(stored.outbox) == messages
