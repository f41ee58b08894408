"""The flows stepped by hand: each step's answer (or error) fed in, no store at all.

The flows are sans-I/O (`shared._flows.steps`): a flow yields a step and receives its
answer, so a test can play the store and the user's code, step by step, and
assert exactly what the flow asks for next, the way h11's tests feed its
connection events. The stores are proven elsewhere (tests/store/).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import pytest

from shared import DedupKey, IdempotencyConfig, OutcomeStatus
from shared._backends.memory import InMemoryIdempotencyStore
from shared._core.exceptions import (
    ConcurrencyRetriesExhaustedError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
)
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import (
    CommitGroup,
    Committed,
    Document,
    GetRecord,
    PutRecordIfAbsent,
    ReadDocument,
    ReplaceRecordIfUnchanged,
    WriteDocuments,
)
from shared._flows.drivers import SyncStore, run_async, run_sync
from shared._flows.idempotency import GroupMessage, Idempotency
from shared._flows.steps import BuildResult, Flow, Gather, RunBuild, Sleep, Step, Writes
from shared._flows.watermark import Mark, PartitionWatermark

NOW = 1_000_000.0
KEY = DedupKey("orders", "o-1")
HASH = "sha256:same"


class Stepper[T]:
    """Drives a flow by hand: `send` an answer or `throw` an error, get the next step."""

    def __init__(self, flow: Flow[T]) -> None:
        self.flow = flow
        self.done = False
        self._value: list[T] = []

    @property
    def value(self) -> T:
        """What the flow returned (it must have finished)."""
        assert self.done
        return self._value[0]

    def start(self) -> Step:
        return next(self.flow)

    def send(self, answer: Any) -> Step | None:
        return self._next(lambda: self.flow.send(answer))

    def throw(self, error: BaseException) -> Step | None:
        return self._next(lambda: self.flow.throw(error))

    def _next(self, advance: Any) -> Step | None:
        try:
            return advance()
        except StopIteration as stop:
            self._value, self.done = [stop.value], True
            return None


class NoStore:
    """Stands where a store would: the flows read its name for telemetry, nothing else."""

    name = "hand"


def ledger(**config: Any) -> Idempotency:
    """A flow owner whose store is never reached: every step is answered by the test."""
    return Idempotency(cast(SyncStore, NoStore()),
                       config=IdempotencyConfig(clock=lambda: NOW, **config))


def record(key: DedupKey = KEY, *, state: RecordState = RecordState.COMPLETED,
           request_hash: str = HASH, etag: str = 'W/"9"', expires_at: float = NOW + 3600,
           lease_expires_at: float | None = None, partition: str | None = None,
           result: Any = None) -> IdempotencyRecord:
    return IdempotencyRecord(key=key, state=state, request_hash=request_hash, created_at=NOW - 60,
                             updated_at=NOW - 60, expires_at=expires_at,
                             lease_expires_at=lease_expires_at, etag=etag, partition=partition,
                             result=result)


# -- a claim that loses a race twice ----------------------------------------------------------
def test_a_claim_that_loses_the_takeover_race_twice_reads_again_and_wins_the_third() -> None:
    abandoned = record(state=RecordState.IN_PROGRESS, lease_expires_at=NOW - 1)  # lease ran out
    flow = Stepper(ledger().claim.flow(KEY, HASH))
    taken = abandoned
    for attempt in range(1, 4):
        step = flow.start() if attempt == 1 else flow.throw(RecordChangedError(abandoned.id))
        assert isinstance(step, PutRecordIfAbsent) and step.record.etag is None
        step = flow.throw(RecordExistsError(step.record.id))  # someone holds the key
        assert step == GetRecord(KEY.encoded, KEY.encoded)
        step = flow.send(abandoned)
        assert isinstance(step, ReplaceRecordIfUnchanged)  # take it over under its etag
        assert step.record.etag == abandoned.etag and step.record.attempts == abandoned.attempts + 1
        taken = step.record
    # the third takeover lands
    assert flow.send(taken.evolve(etag='W/"10"')) is None
    outcome, held = flow.value
    assert outcome.status is OutcomeStatus.TAKEN_OVER and held.etag == 'W/"10"'


def test_a_claim_that_loses_every_race_gives_up_after_its_attempts() -> None:
    flow = Stepper(ledger(max_commit_attempts=2).claim.flow(KEY, HASH))
    assert isinstance(flow.start(), PutRecordIfAbsent)
    assert isinstance(flow.throw(RecordExistsError(KEY.encoded)), GetRecord)
    step = flow.send(None)  # released between the create and the read: a lost race
    assert isinstance(step, PutRecordIfAbsent)
    assert isinstance(flow.throw(RecordExistsError(KEY.encoded)), GetRecord)
    with pytest.raises(ConcurrencyRetriesExhaustedError, match="lost 2 races"):
        flow.send(None)  # lost again: no third attempt


# -- a group commit whose marker at index 3 conflicts -------------------------------------------
def group_of(count: int) -> list[GroupMessage]:
    return [GroupMessage(DedupKey("ledger", f"e{i}"), f"sha256:{i}") for i in range(count)]


def built(indexes: Sequence[int]) -> BuildResult:
    writes = Writes("acct")
    writes.replace("balance", {"n": len(indexes)}, etag='W/"1"')
    return BuildResult([{"after": i} for i in indexes], writes)


def test_a_group_commit_whose_fourth_marker_exists_judges_it_and_commits_the_others() -> None:
    messages = group_of(5)
    flow = Stepper(ledger().run_atomic_group.flow(messages, lambda tx, indexes: [],
                                                  partition="acct"))
    step = flow.start()
    assert isinstance(step, RunBuild) and step.args == ([0, 1, 2, 3, 4],)
    step = flow.send(built([0, 1, 2, 3, 4]))
    assert isinstance(step, CommitGroup)
    assert [m.key for m in step.markers] == [m.key for m in messages]
    existing = record(messages[3].key, request_hash=messages[3].request_hash, partition="acct",
                      result={"after": "before"})
    step = flow.throw(RecordExistsError(existing.id, index=3))
    assert step == GetRecord("acct", existing.id)  # the failed marker is read, nothing else
    step = flow.send(existing)
    assert isinstance(step, RunBuild) and step.args == ([0, 1, 2, 4],)  # built again without it
    step = flow.send(built([0, 1, 2, 4]))
    assert isinstance(step, CommitGroup) and len(step.markers) == 4
    assert flow.send(Committed(step.markers)) is None
    outcomes = flow.value
    assert [o.status for o in outcomes] == [OutcomeStatus.PROCESSED] * 3 + [
        OutcomeStatus.DUPLICATE, OutcomeStatus.PROCESSED]
    assert outcomes[3].result == {"after": "before"}  # the first commit's result, not a new one
    assert [o.result for o in outcomes if o.status is OutcomeStatus.PROCESSED] == [
        {"after": 0}, {"after": 1}, {"after": 2}, {"after": 4}]


def test_a_group_commit_whose_business_write_lost_a_race_builds_on_a_fresh_read() -> None:
    flow = Stepper(ledger().run_atomic_group.flow(group_of(2), lambda tx, indexes: [],
                                                  partition="acct"))
    flow.start()
    assert isinstance(flow.send(built([0, 1])), CommitGroup)
    step = flow.throw(OperationFailedError(0, 412))  # the balance changed since it was read
    assert isinstance(step, RunBuild) and step.args == ([0, 1],)
    assert step.reads is not None and step.reads.documents == {}  # nothing remembered
    assert isinstance(flow.send(built([0, 1])), CommitGroup)


# -- a watermark advance that meets a higher mark ------------------------------------------------
def mark_document(sequence_number: int, etag: str) -> Document:
    return Document("0", "hwm", {"sequenceNumber": sequence_number, "partitionId": "0"}, etag)


def test_a_mark_advance_that_meets_a_higher_mark_rereads_and_leaves_it() -> None:
    watermark = PartitionWatermark(None, consumer="payments", event_hub="hub", consumer_group="cg")
    known = Mark(5, mark_document(5, 'W/"5"'))
    flow = Stepper(watermark.advance.flow("0", 9, known=known))
    step = flow.start()  # no read: the caller's mark is the first guess
    assert isinstance(step, WriteDocuments)
    [op] = step.operations
    assert (op.kind, op.etag, op.body["sequenceNumber"]) == ("replace", 'W/"5"', 9)
    step = flow.throw(OperationFailedError(0, 412))  # someone moved the mark meanwhile
    assert isinstance(step, ReadDocument)
    assert flow.send(mark_document(20, 'W/"20"')) is None  # 20 >= 9: nothing to write
    assert flow.value == 20


def test_a_first_mark_is_created_and_a_second_writer_s_create_makes_it_read_again() -> None:
    watermark = PartitionWatermark(None, consumer="payments", event_hub="hub", consumer_group="cg")
    flow = Stepper(watermark.advance.flow("0", 3, known=None))
    step = flow.start()
    assert isinstance(step, WriteDocuments) and step.operations[0].kind == "create"
    step = flow.throw(OperationFailedError(0, 409))  # created by another instance first
    assert isinstance(step, ReadDocument)
    step = flow.send(mark_document(2, 'W/"2"'))
    assert isinstance(step, WriteDocuments) and step.operations[0].etag == 'W/"2"'
    flow.send([mark_document(3, 'W/"3"')])
    assert flow.value == 3


# -- the drivers -----------------------------------------------------------------------------
def sleeps_then(seconds: float, value: Any) -> Flow[Any]:
    yield Sleep(seconds)
    return value


def fails() -> Flow[Any]:
    yield Sleep(0)
    raise KeyError("boom")


def test_both_drivers_answer_a_gather_in_order_and_raise_its_first_error_after_all_finished() -> None:
    slept: list[float] = []

    def gathered() -> Flow[list[Any]]:
        return (yield Gather((sleeps_then(2, "a"), fails(), sleeps_then(1, "c")), limit=2))

    with pytest.raises(KeyError):
        run_sync(gathered(), None, sleep=slept.append)
    assert sorted(slept) == [0, 1, 2]  # the flow after the failing one still ran
    slept.clear()
    with pytest.raises(KeyError):
        asyncio.run(run_async(gathered(), None, sleep=slept.append))
    assert sorted(slept) == [0, 1, 2]

    def fine() -> Flow[list[Any]]:
        return (yield Gather((sleeps_then(2, "a"), sleeps_then(1, "b")), limit=1))

    assert run_sync(fine(), None, sleep=slept.append) == ["a", "b"]
    assert asyncio.run(run_async(fine(), None, sleep=slept.append)) == ["a", "b"]


def test_the_sync_driver_refuses_an_async_build() -> None:
    async def build(tx: Any) -> int:
        return 1

    with pytest.raises(TypeError, match="async variant"):
        run_sync(ledger().run_atomic.flow(KEY, HASH, build), InMemoryIdempotencyStore())


# -- one flow, two variants ------------------------------------------------------------------------
def test_the_async_parking_lot_parks_and_resolves_through_the_awaited_store() -> None:
    """The async variant runs every method of the flow awaited; none falls through to a sync call
    of the async store (which would hand back an unawaited coroutine)."""
    from shared import aio
    from shared.testing import AsyncInMemoryIdempotencyStore

    async def scenario() -> tuple[bool, str | None]:
        lot = aio.ParkingLot(AsyncInMemoryIdempotencyStore(), clock=lambda: NOW)
        await lot.park(consumer="c", entry_id="e", reason="Bad", payload=b"{}", alert=False)
        marked = await lot.mark("c", "e", action="discarded", by="op", outcome="gone",
                                resolved=True)
        entry = await lot.entry("c", "e")
        assert entry is not None
        return marked.resolved, entry.resolution

    assert asyncio.run(scenario()) == (True, "discarded")


def test_update_document_creates_replaces_under_the_etag_and_leaves_what_change_declines():
    """The front door's version-guarded upsert, sync and async, on the in-memory store."""
    import shared
    from shared.testing import AsyncInMemoryIdempotencyStore

    def newer(version: int):
        def change(current: Document | None) -> dict[str, Any] | None:
            return {"version": version} if current is None or current.body["version"] < version else None
        return change

    store = InMemoryIdempotencyStore()
    written, seen = shared.update_document(store, "p", "doc", newer(2))
    assert written is not None and written.body == {"version": 2} and seen is None
    written, seen = shared.update_document(store, "p", "doc", newer(1))  # older: declined
    assert written is None and seen is not None and seen.body == {"version": 2}
    written, seen = shared.update_document(store, "p", "doc", newer(3))
    assert written is not None and seen is not None and written.etag != seen.etag
    assert store.read_document("p", "doc") == written

    async def on_async_store() -> tuple[Document | None, Document | None]:
        async_store = AsyncInMemoryIdempotencyStore()
        await shared.aio.update_document(async_store, "p", "doc", newer(1))
        return await shared.aio.update_document(async_store, "p", "doc", newer(5))

    written, seen = asyncio.run(on_async_store())
    assert written is not None and written.body == {"version": 5}
    assert seen is not None and seen.body == {"version": 1}
