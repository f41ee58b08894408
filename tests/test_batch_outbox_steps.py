"""The Event Hubs batch's outbox, stepped by hand: the partition mark records the dispatch.

The batch flow (`PartitionBatchProcessor.process_batch`) is driven step by step. Its
store work (the mark, the groups' commits) runs on in-memory stores, so what a batch
committed is there for the next one; every `Dispatch` is the test's to answer, and the
test asserts the order of the top-level steps: mark read, groups, dispatch, mark advance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from shared import DedupKey, IdempotencyConfig
from shared._backends.memory import InMemoryIdempotencyStore
from shared._core.exceptions import DispatchUnavailableError
from shared._core.outbox import (
    PENDING_SINCE,
    POSITION,
    Dispatcher,
    EventPosition,
    has_pending,
    outgoing_message_id,
)
from shared._core.records import OutcomeStatus
from shared._flows.batch import BatchReport, PartitionBatchProcessor
from shared._flows.drivers import run_sync
from shared._flows.idempotency import Idempotency
from shared._flows.parking import ParkingLot
from shared._flows.steps import Dispatch, Flow, Gather, OnStore, Step
from shared._flows.watermark import PartitionWatermark

NOW = 1_800_000_000.0
HUB = "payments"
QUEUE = "balance-changes"


@dataclass(frozen=True)
class Event:
    sequence_number: int
    body: bytes
    properties: dict[str, Any] = field(default_factory=dict[str, Any])
    offset: str | None = None
    enqueued_time: str | None = None


def event(sequence: int, event_id: str, account: str, cents: int = 100) -> Event:
    body = json.dumps({"id": event_id, "account": account, "cents": cents}).encode()
    return Event(sequence, body, enqueued_time=f"2026-03-01T12:00:{sequence:02d}+00:00")


@dataclass(frozen=True)
class Item:
    id: str
    account: str
    cents: int


def parse(event: Event, partition_id: str) -> Item:
    data = json.loads(event.body)
    return Item(data["id"], data["account"], data["cents"])


def identify(item: Item) -> tuple[DedupKey, str]:
    return DedupKey("payments", item.id), f"h:{item.account}:{item.cents}"


def build(tx: Any, items: list[Item]) -> list[dict[str, int]]:
    """One balance write and one message per account per transaction."""
    current = tx.read("balance")
    balance = int(current.body["cents"]) if current else 0
    results = []
    for item in items:
        balance += item.cents
        results.append({"cents": balance})
    body = {"cents": balance}
    if current is None:
        tx.create("balance", body)
    else:
        tx.replace("balance", body, etag=current.etag)
    tx.send(QUEUE, {"account": items[0].account, "cents": balance,
                    "events": [i.id for i in items]})
    return results


class Stores:
    """The ledger, the marks and the parking lot, each in memory (kept across batches)."""

    def __init__(self) -> None:
        self.ledger = InMemoryIdempotencyStore()
        self.marks = InMemoryIdempotencyStore()
        self.parked = InMemoryIdempotencyStore()

    def processor(self) -> PartitionBatchProcessor[Event, Item]:
        """A processor as a new instance builds it (nothing remembered)."""
        config = IdempotencyConfig(clock=lambda: NOW)
        ledger = Idempotency(self.ledger, config=config,
                             dispatcher=cast(Dispatcher, "dispatcher (the test's)"))
        marks = PartitionWatermark(self.marks, consumer="payments", event_hub=HUB,
                                   consumer_group="cg")
        return PartitionBatchProcessor(ledger, marks, ParkingLot(self.parked, clock=lambda: NOW),
                                       consumer="payments", event_hub=HUB, parse=parse,
                                       identify=identify, group=lambda item: item.account,
                                       build=build, sleep=lambda _: None)

    def mark(self, partition: str = "0") -> int | None:
        found = self.processor().watermark.read(partition)
        return None if found is None else found.sequence_number


class Batch:
    """One batch stepped by hand: `steps` names each top-level step as it comes."""

    def __init__(self, stores: Stores, events: list[Event], partition: str = "0") -> None:
        self.stores = stores
        self.processor = stores.processor()
        self.flow: Flow[BatchReport] = self.processor.process_batch.flow(events, partition)
        self.steps: list[str] = []
        self.report: BatchReport | None = None

    def _perform(self, step: Step) -> Any:
        """Store work on the in-memory stores; the test answers Dispatch."""
        match step:
            case OnStore(store, flow):
                self.steps.append("mark" if store is self.stores.marks else "ledger")
                return run_sync(flow, store)
            case Gather(flows):
                self.steps.append("groups")
                return [run_sync(flow, None) for flow in flows]
            case _:
                raise AssertionError(f"unexpected step {step!r}")

    def until_dispatch(self) -> Dispatch | None:
        """Run up to the batch's Dispatch (returned) or its end (None: nothing sent)."""
        return self._advance(lambda: next(self.flow))

    def answer(self, error: BaseException | None = None) -> Dispatch | None:
        """Answer the Dispatch (sent, or `error`); run on to the next Dispatch or the end."""
        self.steps.append("dispatch")
        return self._advance(lambda: self.flow.send(None) if error is None
                             else self.flow.throw(error))

    def _advance(self, first: Any) -> Dispatch | None:
        try:
            step = first()
            while not isinstance(step, Dispatch):
                try:
                    answer = self._perform(step)
                except Exception as error:  # handed to the flow, as a driver does
                    step = self.flow.throw(error)
                    continue
                step = self.flow.send(answer)
        except StopIteration as stop:
            self.report = stop.value
            return None
        return step


def ids(dispatch: Dispatch) -> list[str]:
    return [m.message_id for m in dispatch.messages]


def first_key(event_id: str) -> DedupKey:
    return DedupKey("payments", event_id)


# -- a dispatch that fails, and the batch's retry --------------------------------------------------
def test_a_batch_whose_dispatch_fails_raises_keeps_its_mark_and_its_retry_resends_then_advances():
    stores = Stores()
    events = [event(1, "e1", "A"), event(2, "e2", "B"), event(3, "e3", "A"), event(4, "e4", "B")]
    batch = Batch(stores, events)
    dispatch = batch.until_dispatch()
    assert dispatch is not None and batch.steps == ["mark", "groups"]  # every group committed first
    expected = [outgoing_message_id(first_key("e1"), QUEUE, 0),
                outgoing_message_id(first_key("e2"), QUEUE, 0)]
    assert ids(dispatch) == expected  # one message per account, in one dispatch
    with pytest.raises(DispatchUnavailableError):
        batch.answer(DispatchUnavailableError("broker unreachable"))
    assert stores.mark() is None  # the mark did not move
    marker = stores.ledger.get_record("A", first_key("e1").encoded)
    assert marker is not None and marker.outbox_position == EventPosition(
        HUB, "0", 1, "2026-03-01T12:00:01+00:00")

    retry = Batch(stores, events)  # the host's retry policy runs the same batch again
    dispatch = retry.until_dispatch()
    assert dispatch is not None and ids(dispatch) == expected  # the same ids: absorbed downstream
    assert retry.answer() is None
    assert retry.steps == ["mark", "groups", "dispatch", "mark"]  # dispatched, then advanced
    assert retry.report is not None
    assert (retry.report.duplicates, retry.report.applied, retry.report.dispatched) == (4, 0, 2)
    assert stores.mark() == 4


def test_a_batch_records_no_dispatch_per_marker_and_the_sweeper_never_sees_its_markers():
    stores = Stores()
    batch = Batch(stores, [event(1, "e1", "A"), event(2, "e2", "A")])
    assert batch.until_dispatch() is not None and batch.answer() is None
    assert batch.steps == ["mark", "groups", "dispatch", "mark"]  # no store request to record it
    rows = stores.ledger._rows  # the stored properties themselves
    (fields,) = [row[0] for row in rows.values() if has_pending(row[0])]
    assert POSITION in fields and PENDING_SINCE not in fields
    assert list(stores.ledger.iter_pending(since_before=NOW + 10**6)) == []


# -- copies of events the mark covers, and markers above it ---------------------------------------
def test_a_producer_duplicate_of_an_event_the_mark_covers_sends_nothing():
    stores = Stores()
    first = Batch(stores, [event(1, "e1", "A"), event(2, "e2", "B")])
    assert first.until_dispatch() is not None and first.answer() is None
    assert stores.mark() == 2
    copy = Batch(stores, [event(3, "e1", "A")])  # the producer sent e1 again: a new number
    assert copy.until_dispatch() is None  # its marker's messages are covered by the mark
    assert copy.steps == ["mark", "groups", "mark"]
    assert copy.report is not None and (copy.report.duplicates, copy.report.dispatched) == (1, 0)
    assert stores.mark() == 3


def test_a_marker_found_pending_above_the_mark_is_sent_again_with_the_new_events_messages():
    stores = Stores()
    crashed = Batch(stores, [event(1, "e1", "A"), event(2, "e2", "A")])
    assert crashed.until_dispatch() is not None  # committed; the instance dies before sending
    crashed.flow.close()
    assert stores.mark() is None
    # The replay from the checkpoint holds the same events and a new one of the same account.
    replay = Batch(stores, [event(1, "e1", "A"), event(2, "e2", "A"), event(3, "e3", "A")])
    dispatch = replay.until_dispatch()
    assert dispatch is not None
    assert ids(dispatch) == [outgoing_message_id(first_key("e1"), QUEUE, 0),  # found pending
                             outgoing_message_id(first_key("e3"), QUEUE, 0)]  # committed now
    assert replay.answer() is None and stores.mark() == 3
    assert replay.report is not None
    assert (replay.report.duplicates, replay.report.applied) == (2, 1)


def test_a_copy_on_another_partition_is_judged_by_the_mark_of_its_markers_partition():
    stores = Stores()
    first = Batch(stores, [event(7, "e1", "A")], partition="0")
    assert first.until_dispatch() is not None and first.answer() is None
    copy = Batch(stores, [event(40, "e1", "A")], partition="1")  # sent again, elsewhere
    assert copy.until_dispatch() is None  # partition 0's mark covers the marker's event
    assert copy.steps == ["mark", "groups", "mark", "mark"]  # its mark read, then 1's advance

    pending = Stores()
    crashed = Batch(pending, [event(7, "e1", "A")], partition="0")
    assert crashed.until_dispatch() is not None
    crashed.flow.close()
    copy = Batch(pending, [event(40, "e1", "A")], partition="1")
    dispatch = copy.until_dispatch()  # partition 0's mark does not cover it: sent again
    assert dispatch is not None and ids(dispatch) == [outgoing_message_id(first_key("e1"), QUEUE, 0)]


def test_the_single_event_entry_point_dispatches_and_records_on_its_own():
    """`apply` (an HTTP request, a replayed entry) has no mark: its commit is followed by the
    dispatch and the record of it, as for any Service Bus message."""
    stores = Stores()
    processor = stores.processor()
    sent: list[str] = []

    class Recording:
        def dispatch(self, messages: Any) -> None:
            sent.extend(m.message_id for m in messages)

        def close(self) -> None:
            pass

    processor.ledger.dispatcher = Recording()
    outcome = processor.apply(Item("h1", "A", 250))
    assert outcome.status is OutcomeStatus.PROCESSED
    assert sent == [outgoing_message_id(first_key("h1"), QUEUE, 0)]
    stored = stores.ledger.get_record("A", first_key("h1").encoded)
    assert stored is not None and stored.outbox == () and stored.outbox_position is None


# -- the group commit itself, step by step ----------------------------------------------------------
def test_a_group_commit_of_batch_events_commits_the_position_and_leaves_the_dispatch_to_the_caller():
    from shared._core.store import CommitGroup, Committed, RecordDispatched
    from shared._flows.idempotency import GroupMessage
    from shared._flows.steps import BuildResult, RunBuild, Writes
    from tests.test_flow_steps import Stepper

    ledger = Idempotency(InMemoryIdempotencyStore(), config=IdempotencyConfig(clock=lambda: NOW),
                         dispatcher=cast(Dispatcher, "the caller's"))
    keys = [first_key(f"s{n}") for n in range(2)]
    position = EventPosition(HUB, "0", 5, None)

    def built(key: DedupKey) -> BuildResult:
        writes = Writes("A", key=key)
        writes.send(QUEUE, {"cents": 1})
        return BuildResult([None, None], writes)

    flow = Stepper(ledger.run_atomic_group.flow(
        [GroupMessage(keys[0], "h", position=position), GroupMessage(keys[1], "h")],
        lambda tx, indexes: [None] * len(indexes), partition="A"))
    assert isinstance(flow.start(), RunBuild)
    step = flow.send(built(keys[0]))
    assert isinstance(step, CommitGroup)
    assert step.markers[0].outbox_position == position and len(step.markers[0].outbox) == 1
    assert flow.send(Committed(step.markers)) is None  # no Dispatch, no RecordDispatched
    assert flow.value[0].record is not None and flow.value[0].record.outbox_position == position

    # Without a position (one event on its own): commit, dispatch, record, as for any message.
    flow = Stepper(ledger.run_atomic_group.flow([GroupMessage(keys[0], "h"), GroupMessage(keys[1], "h")],
                                                lambda tx, indexes: [None] * len(indexes),
                                                partition="A"))
    flow.start()
    step = flow.send(built(keys[0]))
    assert isinstance(step, CommitGroup) and step.markers[0].outbox_position is None
    assert isinstance(flow.send(Committed(step.markers)), Dispatch)
    assert isinstance(flow.send(None), RecordDispatched)
