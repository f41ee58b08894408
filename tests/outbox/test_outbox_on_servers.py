"""The outbox on Azurite and the Cosmos server, sync and async.

The pending messages are written on the marker by the commit, read back by a duplicate's
marker read, cleared by `record_dispatched` under the marker's etag without touching the
business body of a marker that is a document, and found by `iter_pending` until then.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared._core.exceptions import DispatchUnavailableError, RecordChangedError
from shared._core.keys import DedupKey
from shared._core.outbox import outgoing_message_id
from shared._core.records import OutcomeStatus
from shared._flows.idempotency import AsyncIdempotency, GroupMessage, Idempotency
from shared.testing import InMemoryDispatcher
from tests.store.test_async_flow import async_backend, open_store  # noqa: F401 - fixtures
from tests.support.doubles import AsyncFailingDispatcher, FailingDispatcher

KEY = DedupKey("orders", "ORD-7")
ALWAYS = 4e9  # epoch seconds far ahead (a Table filter takes no infinity)


def build(tx: Any) -> dict[str, Any]:
    tx.create("ORD-7:line:001", {"sku": "A", "kind": "line"})
    tx.send("notifications", {"type": "OrderAccepted", "orderId": "ORD-7"},
            properties={"type": "OrderAccepted"})
    tx.send("notifications", "second", session_id="s-1")
    return {"orderId": "ORD-7"}


def run(idempotency: Idempotency, **options: Any) -> Any:
    return idempotency.run_atomic(KEY, "h", build, partition="ORD-7", marker_id="ORD-7",
                                  marker_body={"status": "accepted", "total": 12.5},
                                  expires=False, context={"correlation_id": "c-7"}, **options)


def test_pending_messages_ride_on_the_marker_until_dispatched_on_each_server(store):
    dispatcher = FailingDispatcher()
    idempotency = Idempotency(store, dispatcher=dispatcher)
    dispatcher.fail_next()
    with pytest.raises(DispatchUnavailableError):
        run(idempotency)
    marker = store.get_record("ORD-7", "ORD-7")
    assert marker is not None and len(marker.outbox) == 2  # the marker read says it all
    assert marker.outbox[1].session_id == "s-1" and marker.outbox[1].body == b"second"
    assert [r.id for r in store.iter_pending(since_before=ALWAYS)] == ["ORD-7"]
    assert list(store.iter_pending(since_before=marker.updated_at)) == []  # not old enough

    outcome = run(idempotency, read_first=True)
    assert outcome.status is OutcomeStatus.DUPLICATE
    assert dispatcher.ids() == [outgoing_message_id(KEY, "notifications", n) for n in range(2)]
    assert list(store.iter_pending(since_before=ALWAYS)) == []
    cleared = store.get_record("ORD-7", "ORD-7")
    assert cleared is not None and cleared.outbox == () and cleared.result == {"orderId": "ORD-7"}
    order = store.read_document("ORD-7", "ORD-7")
    assert order is not None and order.body["status"] == "accepted" and order.body["total"] == 12.5

    assert run(idempotency, read_first=True).status is OutcomeStatus.DUPLICATE
    assert len(dispatcher.sent) == 2  # nothing pending: nothing sent again


def test_record_dispatched_is_conditional_on_the_markers_etag(store):
    dispatcher = FailingDispatcher()
    dispatcher.fail_next()
    with pytest.raises(DispatchUnavailableError):
        run(Idempotency(store, dispatcher=dispatcher))
    marker = store.get_record("ORD-7", "ORD-7")
    assert marker is not None
    current = store.record_dispatched(marker)
    assert current.etag != marker.etag and current.outbox == ()
    with pytest.raises(RecordChangedError):
        store.record_dispatched(marker)  # the old etag


def test_a_group_commits_messages_are_dispatched_and_recorded_on_each_server(store):
    dispatcher = InMemoryDispatcher()
    idempotency = Idempotency(store, dispatcher=dispatcher)
    keys = [DedupKey("payments", f"ev-{n}") for n in range(3)]

    def group_build(tx: Any, indexes: list[int]) -> list[None]:
        tx.create("balance", {"cents": 100 * len(indexes)})
        tx.send("balances", {"account": "A", "cents": 100 * len(indexes)}, partition_key="A")
        return [None] * len(indexes)

    outcomes = idempotency.run_atomic_group([GroupMessage(k, "h") for k in keys], group_build,
                                            partition="A")
    assert [o.status for o in outcomes] == [OutcomeStatus.PROCESSED] * 3
    assert dispatcher.ids() == [outgoing_message_id(keys[0], "balances", 0)]
    assert list(store.iter_pending(since_before=ALWAYS)) == []


def test_async_stores_commit_dispatch_and_record(open_store):  # noqa: F811 - the fixture
    dispatcher = AsyncFailingDispatcher()

    async def main() -> tuple[Any, Any, Any]:
        async with open_store() as store:
            idempotency = AsyncIdempotency(store, dispatcher=dispatcher)
            dispatcher.fail_next()
            with pytest.raises(DispatchUnavailableError):
                await idempotency.run_atomic(KEY, "h", build, partition="ORD-7")
            pending = await store.get_record("ORD-7", KEY.encoded)
            again = await idempotency.run_atomic(KEY, "h", build, partition="ORD-7",
                                                 read_first=True)
            after = await store.get_record("ORD-7", KEY.encoded)
            return pending, again, after

    pending, again, after = asyncio.run(main())
    assert len(pending.outbox) == 2
    assert again.status is OutcomeStatus.DUPLICATE
    assert after.outbox == ()
    assert len(dispatcher.sent) == 2


def test_a_batch_marker_keeps_its_events_position_instead_of_a_pending_time(store):
    """On an Event Hubs batch's marker the messages ride with the event's position and no
    `oT` (pending since): the sweeper's query never finds it (the partition mark records the
    dispatch). Recording it dispatched anyway (the replay tool's single-event path) clears
    both on each server."""
    from shared._core.outbox import EventPosition

    dispatcher = InMemoryDispatcher()
    idempotency = Idempotency(store, dispatcher=dispatcher)
    keys = [DedupKey("payments", f"ev-{n}") for n in range(2)]
    position = EventPosition("payments", "3", 41, "2026-03-01T12:00:00+00:00")

    def group_build(tx: Any, indexes: list[int]) -> list[None]:
        tx.create("balance", {"cents": 100})
        tx.send("balance-changes", {"account": "A", "cents": 100})
        return [None] * len(indexes)

    outcomes = idempotency.run_atomic_group(
        [GroupMessage(keys[0], "h", position=position), GroupMessage(keys[1], "h")], group_build,
        partition="A")
    assert [o.status for o in outcomes] == [OutcomeStatus.PROCESSED] * 2
    assert dispatcher.sent == []  # the caller's to dispatch
    marker = store.get_record("A", keys[0].encoded)
    assert marker is not None and marker.outbox_position == position
    assert [m.message_id for m in marker.outbox] == [outgoing_message_id(keys[0], "balance-changes", 0)]
    assert list(store.iter_pending(since_before=ALWAYS)) == []

    again = idempotency.run_atomic_group([GroupMessage(keys[0], "h", position=position)],
                                         group_build, partition="A")
    assert again[0].status is OutcomeStatus.DUPLICATE and dispatcher.sent == []
    assert again[0].record is not None and again[0].record.outbox_position == position

    cleared = store.record_dispatched(marker)
    assert cleared.outbox == ()
    stored = store.get_record("A", keys[0].encoded)
    assert stored is not None and stored.outbox == () and stored.outbox_position is None
