"""The stored form of pending messages survives both real stores at the size limit."""

from __future__ import annotations

import pytest

from shared.keys import DedupKey
from shared.outbox import MAX_PENDING_BYTES, decode_pending, encode_pending, outgoing
from shared.stores.base import WriteOp

KEY = DedupKey("orders", "ORD-big")


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_a_keys_largest_pending_messages_are_written_and_read_back_whole(make_store, backend):
    store = make_store(backend)
    size = MAX_PENDING_BYTES // 2 - 2_000  # two messages just under the per-key limit
    messages = [outgoing(KEY, "notifications", bytes(range(256)) * (size // 256), ordinal=n,
                         correlation_id="c", properties={"type": "OrderAccepted", "n": n})
                for n in range(2)]
    fields = encode_pending(messages)
    store.write_documents("p1", [WriteOp("create", "marker-1", {"state": "completed", **fields})])
    document = store.read_document("p1", "marker-1")
    assert document is not None
    assert decode_pending(document.body) == messages
