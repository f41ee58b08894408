"""The outbox in the dedup flow, stepped by hand (no store) and on the in-memory store.

A build's `tx.send` joins the commit on the marker; after the commit the flow yields
Dispatch then RecordDispatched, and only then returns (the caller acknowledges after it);
a dispatch failure leaves the messages pending and raises; a duplicate whose marker still
carries messages dispatches them, and one whose marker carries none costs one read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared._backends.memory import InMemoryIdempotencyStore
from shared._core.exceptions import (
    ConfigurationError,
    DispatchUnavailableError,
    OutgoingMessageTooLargeError,
    RecordChangedError,
    RecordExistsError,
)
from shared._core.keys import DedupKey
from shared._core.outbox import MAX_BODY_BYTES, outgoing_message_id
from shared._core.records import IdempotencyRecord, OutcomeStatus
from shared._core.store import Commit, CommitGroup, Committed, GetRecord, RecordDispatched
from shared._flows.drivers import Transaction
from shared._flows.idempotency import AsyncIdempotency, GroupMessage, Idempotency
from shared._flows.steps import BuildResult, Dispatch, Flow, RunBuild, Writes
from shared.testing import AsyncInMemoryIdempotencyStore, InMemoryDispatcher
from tests.support.doubles import CountingMemoryStore, FailingDispatcher

KEY = DedupKey("orders", "ORD-1")
CONTEXT = {"correlation_id": "corr-1", "message_id": "ORD-1"}
UNUSED = InMemoryIdempotencyStore()  # named for telemetry; a flow stepped by hand never calls it


def build(tx: Any) -> dict[str, Any]:
    tx.create("ORD-1:line:001", {"sku": "A", "kind": "line"})
    tx.send("notifications", {"type": "OrderAccepted", "orderId": "ORD-1"},
            properties={"type": "OrderAccepted"})
    return {"orderId": "ORD-1"}


def built_by(step: object) -> BuildResult:
    """What the driver answers a RunBuild step with: the user's build on a transaction."""
    assert isinstance(step, RunBuild)
    tx = Transaction(None, step.partition, step.reads, key=step.key,
                     correlation_id=step.correlation_id)
    return BuildResult(step.build(tx, *step.args), tx)


def flow_of(idempotency: Idempotency, **options: Any) -> Flow[Any]:
    return idempotency.run_atomic.flow(KEY, "h", build, partition="ORD-1", marker_id="ORD-1",
                                       marker_body={"status": "accepted"}, expires=False,
                                       context=CONTEXT, **options)


def with_etag(record: IdempotencyRecord, etag: str) -> IdempotencyRecord:
    return record.evolve(etag=etag)


# -- stepped by hand ---------------------------------------------------------------------
def test_a_new_message_commits_its_message_on_the_marker_then_dispatches_then_records():
    dispatcher = InMemoryDispatcher()
    flow = flow_of(Idempotency(UNUSED, dispatcher=dispatcher))
    step = next(flow)
    assert isinstance(step, RunBuild) and step.key == KEY and step.correlation_id == "corr-1"
    step = flow.send(built_by(step))
    assert isinstance(step, Commit)
    (message,) = step.marker.outbox  # on the marker, in the same transaction: zero extra writes
    assert message.message_id == outgoing_message_id(KEY, "notifications", 0)
    assert message.properties["X-Correlation-Id"] == "corr-1"
    assert str(message.properties["Idempotency-Key"]).startswith(KEY.encoded)
    assert [op.id for op in step.operations] == ["ORD-1:line:001"]
    step = flow.send(Committed((with_etag(step.marker, "e1"),)))
    assert isinstance(step, Dispatch) and step.dispatcher is dispatcher
    assert step.messages == (message,)
    step = flow.send(None)
    assert isinstance(step, RecordDispatched) and step.marker.etag == "e1"
    with pytest.raises(StopIteration) as stop:
        flow.send(step.marker.evolve(etag="e2", outbox=()))
    outcome = stop.value.value
    assert outcome.status is OutcomeStatus.PROCESSED
    assert outcome.record.outbox == () and outcome.record.etag == "e2"


def test_a_dispatch_failure_raises_and_never_records_the_messages_as_dispatched():
    flow = flow_of(Idempotency(UNUSED, dispatcher=InMemoryDispatcher()))
    step = flow.send(built_by(next(flow)))
    assert isinstance(step, Commit)
    step = flow.send(Committed((with_etag(step.marker, "e1"),)))
    assert isinstance(step, Dispatch)
    with pytest.raises(DispatchUnavailableError):
        flow.throw(DispatchUnavailableError("broker down"))


def test_a_duplicate_read_first_with_nothing_pending_makes_one_request_and_sends_nothing():
    flow = flow_of(Idempotency(UNUSED, dispatcher=InMemoryDispatcher()), read_first=True)
    step = next(flow)
    assert isinstance(step, GetRecord) and (step.partition, step.record_id) == ("ORD-1", "ORD-1")
    stored = Idempotency(UNUSED)._marker(KEY, "h", partition="ORD-1", record_id="ORD-1",
                                       expires=False).evolve(etag="e9")
    with pytest.raises(StopIteration) as stop:
        flow.send(stored)
    assert stop.value.value.status is OutcomeStatus.DUPLICATE


def test_a_duplicate_whose_marker_still_carries_messages_dispatches_them_before_it_returns():
    dispatcher = InMemoryDispatcher()
    flow = flow_of(Idempotency(UNUSED, dispatcher=dispatcher))
    step = flow.send(built_by(next(flow)))
    assert isinstance(step, Commit)
    pending = with_etag(step.marker, "e1")  # committed by an instance that died before dispatch
    step = flow.throw(RecordExistsError("ORD-1"))
    assert isinstance(step, GetRecord)
    step = flow.send(pending)
    assert isinstance(step, Dispatch) and step.messages == pending.outbox
    step = flow.send(None)
    assert isinstance(step, RecordDispatched) and step.marker is pending
    with pytest.raises(StopIteration) as stop:
        flow.send(pending.evolve(etag="e2", outbox=()))
    assert stop.value.value.status is OutcomeStatus.DUPLICATE


def test_recording_meets_a_changed_marker_reads_it_again_and_stops_when_someone_else_recorded():
    flow = flow_of(Idempotency(UNUSED, dispatcher=InMemoryDispatcher()))
    step = flow.send(built_by(next(flow)))
    assert isinstance(step, Commit)
    committed = with_etag(step.marker, "e1")
    flow.send(Committed((committed,)))
    step = flow.send(None)
    assert isinstance(step, RecordDispatched)
    step = flow.throw(RecordChangedError("ORD-1"))
    assert isinstance(step, GetRecord)
    step = flow.send(committed.evolve(etag="e3"))  # a business write changed it: still pending
    assert isinstance(step, RecordDispatched) and step.marker.etag == "e3"
    step = flow.throw(RecordChangedError("ORD-1"))
    assert isinstance(step, GetRecord)
    with pytest.raises(StopIteration) as stop:
        flow.send(committed.evolve(etag="e4", outbox=()))  # another copy recorded it
    assert stop.value.value.record.outbox == ()


def test_a_group_commit_puts_the_groups_messages_on_its_first_marker_and_dispatches_after():
    dispatcher = InMemoryDispatcher()
    keys = [DedupKey("payments", f"e{n}") for n in range(3)]
    messages = [GroupMessage(key, "h", {"correlation_id": f"c{n}"}) for n, key in enumerate(keys)]

    def group_build(tx: Any, indexes: list[int]) -> list[int]:
        tx.send("balances", {"account": "A", "events": len(indexes)}, partition_key="A")
        return list(indexes)

    flow = Idempotency(UNUSED, dispatcher=dispatcher).run_atomic_group.flow(
        messages, group_build, partition="A")
    step = next(flow)
    assert isinstance(step, RunBuild) and step.key == keys[0] and step.correlation_id == "c0"
    step = flow.send(built_by(step))
    assert isinstance(step, CommitGroup)
    first, *others = step.markers
    assert len(first.outbox) == 1 and all(not m.outbox for m in others)
    assert first.outbox[0].message_id == outgoing_message_id(keys[0], "balances", 0)
    step = flow.send(Committed((with_etag(first, "e1"), *others)))
    assert isinstance(step, Dispatch)
    step = flow.send(None)
    assert isinstance(step, RecordDispatched) and step.marker.etag == "e1"
    with pytest.raises(StopIteration) as stop:
        flow.send(first.evolve(etag="e2", outbox=()))
    assert [o.status for o in stop.value.value] == [OutcomeStatus.PROCESSED] * 3


def test_a_body_over_the_limit_is_refused_in_the_build_before_anything_commits():
    store = CountingMemoryStore()
    idempotency = Idempotency(store, dispatcher=InMemoryDispatcher())

    def too_large(tx: Any) -> None:
        tx.send("notifications", b"x" * (MAX_BODY_BYTES + 1))

    with pytest.raises(OutgoingMessageTooLargeError):
        idempotency.run_atomic(KEY, "h", too_large, partition="ORD-1")
    assert store.requests == 0


def test_a_build_that_sends_without_a_dispatcher_fails_before_committing():
    store = CountingMemoryStore()
    with pytest.raises(ConfigurationError, match="no dispatcher"):
        Idempotency(store).run_atomic(KEY, "h", build, partition="ORD-1")
    assert store.requests == 0


def test_a_rebuilt_transaction_yields_the_same_ids():
    first, second = Writes("p", key=KEY), Writes("p", key=KEY)
    for writes in (first, second):
        writes.send("notifications", {"n": 1})
        writes.send("notifications", {"n": 2})
        writes.send("audit", {"n": 1})
    assert [m.message_id for m in first.outgoing] == [m.message_id for m in second.outgoing]
    assert len({m.message_id for m in first.outgoing}) == 3


# -- on the in-memory store ----------------------------------------------------------------
def run(idempotency: Idempotency, **options: Any) -> Any:
    return idempotency.run_atomic(KEY, "h", build, partition="ORD-1", marker_id="ORD-1",
                                  marker_body={"status": "accepted"}, expires=False,
                                  context=CONTEXT, **options)


def test_memory_new_message_is_two_requests_and_a_duplicate_read_first_is_one():
    store, dispatcher = CountingMemoryStore(), FailingDispatcher()
    idempotency = Idempotency(store, dispatcher=dispatcher)
    assert run(idempotency).status is OutcomeStatus.PROCESSED
    assert store.requests == 2  # the commit, the record of the dispatch
    assert len(dispatcher.sent) == 1
    before = store.requests
    assert run(idempotency, read_first=True).status is OutcomeStatus.DUPLICATE
    assert store.requests - before == 1
    assert len(dispatcher.sent) == 1
    order = store.read_document("ORD-1", "ORD-1")
    assert order is not None and order.body["status"] == "accepted"  # the body survives the clear


def test_memory_a_crash_before_dispatch_is_repaired_by_the_redelivery():
    store, dispatcher = CountingMemoryStore(), FailingDispatcher()
    idempotency = Idempotency(store, dispatcher=dispatcher)
    dispatcher.fail_next()
    with pytest.raises(DispatchUnavailableError):
        run(idempotency)
    assert dispatcher.sent == []
    assert [r.id for r in store.iter_pending(since_before=float("inf"))] == ["ORD-1"]
    assert run(idempotency, read_first=True).status is OutcomeStatus.DUPLICATE
    assert dispatcher.ids() == [outgoing_message_id(KEY, "notifications", 0)]
    assert list(store.iter_pending(since_before=float("inf"))) == []


def test_memory_a_send_whose_answer_was_lost_is_sent_again_with_the_same_id():
    store, dispatcher = CountingMemoryStore(), FailingDispatcher()
    idempotency = Idempotency(store, dispatcher=dispatcher)
    dispatcher.accept_then_fail_next()
    with pytest.raises(DispatchUnavailableError):
        run(idempotency)
    run(idempotency)  # not read first: the failed commit finds the pending marker
    assert dispatcher.ids() == [outgoing_message_id(KEY, "notifications", 0)] * 2
    assert list(store.iter_pending(since_before=float("inf"))) == []


def test_the_async_variant_dispatches_with_an_async_dispatcher_and_records():
    sent: list[str] = []

    class AsyncDispatcher:
        async def dispatch(self, messages: Any) -> None:
            await asyncio.sleep(0)
            sent.extend(m.message_id for m in messages)

        async def close(self) -> None:
            pass

    store = AsyncInMemoryIdempotencyStore(CountingMemoryStore())
    idempotency = AsyncIdempotency(store, dispatcher=AsyncDispatcher())

    async def main() -> tuple[Any, Any]:
        async def async_build(tx: Any) -> dict[str, Any]:
            return build(tx)
        first = await idempotency.run_atomic(KEY, "h", async_build, partition="ORD-1",
                                             context=CONTEXT)
        again = await idempotency.run_atomic(KEY, "h", async_build, partition="ORD-1",
                                             read_first=True)
        return first, again

    first, again = asyncio.run(main())
    assert (first.status, again.status) == (OutcomeStatus.PROCESSED, OutcomeStatus.DUPLICATE)
    assert sent == [outgoing_message_id(KEY, "notifications", 0)]
    assert store.sync.requests == 3
    assert list(store.sync.iter_pending(since_before=float("inf"))) == []
