"""Every branch of the dedup flow on the in-memory store, in milliseconds.

`test_conformance.py` proves the stores (memory, Azurite, Cosmos server) keep
the contract; this file walks `Idempotency.run` / `run_atomic` / `claim` /
`complete` / `release` branch by branch: which outcome each state of the
record yields, what the handler did, what the caller may do next
(`should_ack`, whether the effect ran now), what is left in the store, and how
many store requests the branch costs (the in-memory store counts them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import pytest

from shared import DedupKey, Idempotency, IdempotencyConfig, OutcomeStatus, request_hash
from shared._core.exceptions import (
    ConcurrencyRetriesExhaustedError,
    EffectUncertainError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
    ResultTooLargeError,
    StoreUnavailableError,
)
from shared._core.records import IdempotencyRecord, KeyReusedError, Outcome, RecordState
from shared._core.store import RecordStore
from shared._core.telemetry import Telemetry
from shared._flows.cache import CompletedKeyCache
from shared._flows.drivers import SyncStore
from tests.conftest import FakeClock
from tests.support.doubles import CountingMemoryStore, applied_now

LEASE = timedelta(seconds=54)
TTL = timedelta(hours=1)
KEY = DedupKey.from_message_id("orders", "o-1")
SAME = request_hash({"orderId": "o-1", "amount": 10})
OTHER = request_hash({"orderId": "o-1", "amount": 99})  # same key, different content
PARTITION = "acct-1"
ACKED = {OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER, OutcomeStatus.DUPLICATE,
         OutcomeStatus.LEASE_LOST}
APPLIED = {OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER, OutcomeStatus.LEASE_LOST}


class RecordedTelemetry(Telemetry):
    """Telemetry that also keeps (status, source) of every outcome it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[OutcomeStatus, str]] = []

    def outcome(self, outcome: Outcome, **fields: Any) -> None:
        self.seen.append((outcome.status, fields.get("source", "store")))
        super().outcome(outcome, **fields)


class Calls:
    """A handler (or atomic build) that counts its calls; the atomic one writes an effect."""

    def __init__(self, result: Any = "new") -> None:
        self.count = 0
        self.result = result

    def __call__(self) -> Any:
        self.count += 1
        return self.result

    def build(self, tx: Any) -> Any:
        self.count += 1
        tx.create(f"effect-{self.result}", {"v": 1})
        return self.result


@dataclass
class Bench:
    store: CountingMemoryStore
    clock: FakeClock
    cache: CompletedKeyCache | None = None
    telemetry: RecordedTelemetry = field(default_factory=RecordedTelemetry)

    def __post_init__(self) -> None:
        self.idem = self.flow()

    def flow(self, *, cache: CompletedKeyCache | None = None) -> Idempotency:
        """Another consumer instance on the same store and clock."""
        return Idempotency(self.store, config=self.config(), telemetry=self.telemetry,
                           cache=cache or self.cache)

    def config(self, **changes: Any) -> IdempotencyConfig:
        return IdempotencyConfig(**{"ttl": TTL, "lease": LEASE, "clock": self.clock, **changes})

    def record(self) -> IdempotencyRecord | None:
        return self.store.get_record(KEY.encoded, KEY.encoded)

    def marker(self) -> IdempotencyRecord | None:
        return self.store.get_record(PARTITION, KEY.encoded)

    def counted(self, action: Callable[[], Any]) -> tuple[Any, int]:
        """(what `action` returned, the store requests it made)."""
        before = self.store.requests
        returned = action()
        return returned, self.store.requests - before


@pytest.fixture
def bench(clock: FakeClock) -> Bench:
    return Bench(CountingMemoryStore(), clock)


# -- the record states `run` meets -----------------------------------------------------
def no_record(bench: Bench) -> None:
    pass


def completed(bench: Bench) -> None:
    bench.idem.run(KEY, SAME, lambda: "first")


def held(bench: Bench) -> None:
    bench.idem.claim(KEY, SAME)  # the holder is still working (or died)


def held_one_second_before_its_lease_ends(bench: Bench) -> None:
    held(bench)
    bench.clock.advance(LEASE.total_seconds() - 1)


def held_until_its_lease_ended(bench: Bench) -> None:
    held(bench)
    bench.clock.advance(LEASE.total_seconds())  # exactly at the end: the lease is over


def completed_until_it_expired(bench: Bench) -> None:
    completed(bench)
    bench.clock.advance(TTL.total_seconds())


def held_until_it_expired(bench: Bench) -> None:
    held(bench)
    bench.clock.advance(TTL.total_seconds())


@dataclass(frozen=True)
class Branch:
    state: Callable[[Bench], None]
    digest: str
    status: OutcomeStatus
    result: Any
    requests: int  # store requests of the delivery, completion included
    attempts: int | None = None  # of the record the handler's run left
    takeover_stale: bool = True


RUN_BRANCHES = {
    "first copy": Branch(no_record, SAME, OutcomeStatus.PROCESSED, "new", 2, attempts=1),
    "duplicate": Branch(completed, SAME, OutcomeStatus.DUPLICATE, "first", 2),
    "conflict with a completed record": Branch(completed, OTHER, OutcomeStatus.CONFLICT, "first", 2),
    "conflict with a live claim": Branch(held, OTHER, OutcomeStatus.CONFLICT, None, 2),
    "conflict with a stale claim, not a takeover": Branch(
        held_until_its_lease_ended, OTHER, OutcomeStatus.CONFLICT, None, 2),
    "live claim, a second before its lease ends": Branch(
        held_one_second_before_its_lease_ends, SAME, OutcomeStatus.IN_PROGRESS, None, 2),
    "stale claim taken over at the end of its lease": Branch(
        held_until_its_lease_ended, SAME, OutcomeStatus.TAKEN_OVER, "new", 4, attempts=2),
    "stale claim left to the caller": Branch(
        held_until_its_lease_ended, SAME, OutcomeStatus.STALE, None, 2, takeover_stale=False),
    "expired record, same content: processed again": Branch(
        completed_until_it_expired, SAME, OutcomeStatus.PROCESSED, "new", 4, attempts=1),
    "expired record, other content: a new message": Branch(
        completed_until_it_expired, OTHER, OutcomeStatus.PROCESSED, "new", 4, attempts=1),
    "expired claim: processed even when stale claims are left to the caller": Branch(
        held_until_it_expired, SAME, OutcomeStatus.PROCESSED, "new", 4, attempts=1,
        takeover_stale=False),
}


@pytest.mark.parametrize("branch", RUN_BRANCHES.values(), ids=RUN_BRANCHES.keys())
def test_run_outcome_for_each_record_state(bench: Bench, branch: Branch) -> None:
    branch.state(bench)
    before = bench.record()
    handler = Calls()
    outcome, requests = bench.counted(lambda: bench.idem.run(
        KEY, branch.digest, handler, takeover_stale=branch.takeover_stale))

    assert (outcome.status, outcome.result) == (branch.status, branch.result)
    assert requests == branch.requests
    assert handler.count == (1 if branch.status in APPLIED else 0)
    assert outcome.should_ack == (branch.status in ACKED)
    assert applied_now(outcome) == (branch.status in APPLIED)
    assert bench.telemetry.seen[-1] == (branch.status, "store")
    after = bench.record()
    if branch.status in APPLIED:
        assert after is not None and after.state is RecordState.COMPLETED
        assert (after.result, after.request_hash, after.attempts) == ("new", branch.digest,
                                                                      branch.attempts)
        assert after.lease_expires_at is None
    else:  # judged only: the record is exactly as it was
        assert after == before and after is not None and after.etag == before.etag


def test_a_takeover_keeps_the_first_claims_age_and_an_expired_record_starts_over(bench: Bench) -> None:
    held(bench)
    first = bench.record()
    bench.clock.advance(LEASE.total_seconds())
    _, taken = bench.idem.claim(KEY, SAME)
    assert taken is not None and taken.created_at == first.created_at
    assert taken.lease_expires_at == bench.clock() + LEASE.total_seconds()
    assert taken.expires_at == bench.clock() + TTL.total_seconds()  # the TTL starts again
    bench.clock.advance(TTL.total_seconds())
    _, fresh = bench.idem.claim(KEY, SAME)
    assert fresh is not None and fresh.created_at == bench.clock() and fresh.attempts == 1


# -- run_atomic ---------------------------------------------------------------------------
def committed(bench: Bench) -> None:
    bench.idem.run_atomic(KEY, SAME, Calls("first").build, partition=PARTITION)


def committed_until_it_expired(bench: Bench) -> None:
    committed(bench)
    bench.clock.advance(TTL.total_seconds())


@dataclass(frozen=True)
class AtomicBranch:
    state: Callable[[Bench], None]
    digest: str
    status: OutcomeStatus
    result: Any
    builds: int  # the build runs before every commit attempt
    requests: int
    attempts: int | None = None


ATOMIC_BRANCHES = {
    "first copy": AtomicBranch(no_record, SAME, OutcomeStatus.PROCESSED, "new", 1, 1, attempts=1),
    "duplicate": AtomicBranch(committed, SAME, OutcomeStatus.DUPLICATE, "first", 1, 2),
    "conflict": AtomicBranch(committed, OTHER, OutcomeStatus.CONFLICT, "first", 1, 2),
    "expired marker taken over": AtomicBranch(
        committed_until_it_expired, SAME, OutcomeStatus.PROCESSED, "new", 2, 3, attempts=2),
    "expired marker, other content: a new message": AtomicBranch(
        committed_until_it_expired, OTHER, OutcomeStatus.PROCESSED, "new", 2, 3, attempts=2),
}


@pytest.mark.parametrize("branch", ATOMIC_BRANCHES.values(), ids=ATOMIC_BRANCHES.keys())
def test_run_atomic_outcome_for_each_marker_state(bench: Bench, branch: AtomicBranch) -> None:
    branch.state(bench)
    before = bench.marker()
    build = Calls()
    outcome, requests = bench.counted(lambda: bench.idem.run_atomic(
        KEY, branch.digest, build.build, partition=PARTITION))

    assert (outcome.status, outcome.result) == (branch.status, branch.result)
    assert (build.count, requests) == (branch.builds, branch.requests)
    assert outcome.should_ack == (branch.status in ACKED)
    assert applied_now(outcome) == (branch.status in APPLIED)
    effect = bench.store.read_document(PARTITION, "effect-new")
    after = bench.marker()
    if branch.status is OutcomeStatus.PROCESSED:
        assert effect is not None and after is not None
        assert (after.result, after.request_hash, after.attempts) == ("new", branch.digest,
                                                                      branch.attempts)
    else:  # the build ran, but its writes were never committed
        assert effect is None
        assert after == before and after is not None and after.etag == before.etag


def test_run_atomic_needs_a_document_store(clock: FakeClock) -> None:
    class RecordsOnly(RecordStore):
        """A record store without business documents (delegates to memory)."""

        def __init__(self) -> None:
            self.inner = CountingMemoryStore()

        def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
            return self.inner.get_record(partition, record_id)

        def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
            return self.inner.put_record_if_absent(record)

        def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
            return self.inner.replace_record_if_unchanged(record)

        def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
            self.inner.delete_record_if_unchanged(record)

        def iter_records(self, **_: Any) -> Any:
            return self.inner.iter_records()

    store = RecordsOnly()
    idem = Idempotency(cast(SyncStore, store), config=IdempotencyConfig(clock=clock))
    build = Calls()
    with pytest.raises(TypeError, match="DocumentStore"):
        idem.run_atomic(KEY, SAME, build.build)
    assert build.count == 0 and store.inner.requests == 0
    assert idem.run(KEY, SAME, Calls()).status is OutcomeStatus.PROCESSED  # two-phase works


# -- handler failures ---------------------------------------------------------------------
class DownstreamError(Exception):
    pass


class Cancelled(BaseException):
    """Like asyncio.CancelledError or a host shutdown: not an Exception."""


@pytest.mark.parametrize("error", [DownstreamError("503 from the API"), Cancelled()],
                         ids=["exception", "base exception"])
def test_a_failed_handler_releases_the_claim_and_its_own_error_propagates(bench: Bench,
                                                                          error: BaseException) -> None:
    def fail() -> None:
        raise error

    with pytest.raises(type(error)) as raised:
        bench.idem.run(KEY, SAME, fail)
    assert raised.value is error
    assert bench.record() is None  # released: the redelivery is a first copy
    assert bench.idem.run(KEY, SAME, Calls()).status is OutcomeStatus.PROCESSED


def test_a_release_the_store_refuses_leaves_the_claim_to_run_out(clock: FakeClock,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    class DeletesFail(CountingMemoryStore):
        def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
            raise StoreUnavailableError("503", status_code=503)

    bench = Bench(DeletesFail(), clock)

    def fail() -> None:
        raise DownstreamError("503 from the API")

    with pytest.raises(DownstreamError):  # the handler's error, not the store's
        bench.idem.run(KEY, SAME, fail)
    assert "could not release claim" in caplog.text
    assert bench.record().state is RecordState.IN_PROGRESS
    handler = Calls()
    assert bench.idem.run(KEY, SAME, handler).status is OutcomeStatus.IN_PROGRESS
    clock.advance(LEASE.total_seconds())
    assert bench.idem.run(KEY, SAME, handler).status is OutcomeStatus.TAKEN_OVER
    assert handler.count == 1


def test_a_holder_that_lost_its_lease_releases_nothing(bench: Bench,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    _, stale = bench.idem.claim(KEY, SAME)
    assert stale is not None
    bench.clock.advance(LEASE.total_seconds())
    _, taker = bench.flow().claim(KEY, SAME)
    bench.idem.release(stale)  # its handler failed after the takeover: no error
    assert "could not release claim" in caplog.text
    assert bench.record() == taker and bench.record().etag == taker.etag


def test_effect_uncertain_keeps_the_claim_for_reconciliation(bench: Bench) -> None:
    def timed_out() -> None:
        raise EffectUncertainError("timed out after sending")

    with pytest.raises(EffectUncertainError) as raised:
        bench.idem.run(KEY, SAME, timed_out)
    kept = raised.value.record
    assert isinstance(kept, IdempotencyRecord) and kept.state is RecordState.IN_PROGRESS
    assert bench.record() == kept and bench.record().etag == kept.etag  # neither released nor done
    handler = Calls()
    assert bench.idem.run(KEY, SAME, handler).status is OutcomeStatus.IN_PROGRESS
    bench.clock.advance(LEASE.total_seconds())
    stale = bench.idem.run(KEY, SAME, handler, takeover_stale=False)
    assert stale.status is OutcomeStatus.STALE and stale.record == kept  # the reconciler's view
    assert handler.count == 0


# -- lost races ---------------------------------------------------------------------------
class ReleasedBetweenCreateAndRead(CountingMemoryStore):
    """Every create finds a record and every read finds none: the holder keeps releasing."""

    def __init__(self, races: int) -> None:
        super().__init__()
        self.races, self.puts = races, 0

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        self.puts += 1
        if self.puts <= self.races:
            raise RecordExistsError(record.id)
        return super().put_record_if_absent(record)

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return None if self.puts <= self.races else super().get_record(partition, record_id)


def test_a_claim_retries_after_a_lost_race_and_wins(clock: FakeClock) -> None:
    store = ReleasedBetweenCreateAndRead(races=2)
    handler = Calls()
    outcome = Bench(store, clock).idem.run(KEY, SAME, handler)
    assert (outcome.status, store.puts, handler.count) == (OutcomeStatus.PROCESSED, 3, 1)


def test_a_claim_that_keeps_losing_gives_up_without_running_the_handler(clock: FakeClock) -> None:
    store = ReleasedBetweenCreateAndRead(races=1_000)
    bench = Bench(store, clock)
    handler = Calls()
    with pytest.raises(ConcurrencyRetriesExhaustedError, match="lost 5 races"):
        bench.idem.run(KEY, SAME, handler)
    assert (store.puts, handler.count) == (bench.idem.config.max_commit_attempts, 0)


def test_a_takeover_that_keeps_losing_gives_up_without_running_the_handler(clock: FakeClock) -> None:
    class EveryTakeoverLoses(CountingMemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.takeovers = 0

        def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
            if record.state is RecordState.IN_PROGRESS:
                self.takeovers += 1
                raise RecordChangedError(record.id)
            return super().replace_record_if_unchanged(record)

    store = EveryTakeoverLoses()
    bench = Bench(store, clock)
    held_until_its_lease_ended(bench)
    impatient = Idempotency(store, config=bench.config(max_commit_attempts=3))
    handler = Calls()
    with pytest.raises(ConcurrencyRetriesExhaustedError, match="lost 3 races"):
        impatient.run(KEY, SAME, handler)
    assert (store.takeovers, handler.count) == (3, 0)
    assert bench.record().attempts == 1  # the stale claim, untouched


class MarkerVanishes(CountingMemoryStore):
    """Every commit finds a marker there, and every read finds none."""

    def commit(self, marker: IdempotencyRecord, operations: Any, **kwargs: Any) -> IdempotencyRecord:
        raise RecordExistsError(marker.id)

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return None


class BusinessWriteFails(CountingMemoryStore):
    """Every commit fails on its business write with `status`."""

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status

    def commit(self, marker: IdempotencyRecord, operations: Any, **kwargs: Any) -> IdempotencyRecord:
        raise OperationFailedError(0, self.status)


@pytest.mark.parametrize("store", [MarkerVanishes(), BusinessWriteFails(412)],
                         ids=["marker deleted meanwhile", "business document changed meanwhile"])
def test_an_atomic_commit_that_keeps_losing_gives_up(clock: FakeClock,
                                                     store: CountingMemoryStore) -> None:
    build = Calls()
    with pytest.raises(ConcurrencyRetriesExhaustedError, match="lost 5 races"):
        Bench(store, clock).idem.run_atomic(KEY, SAME, build.build, partition=PARTITION)
    assert build.count == 5  # rebuilt from fresh reads before every attempt


def test_an_atomic_business_write_that_fails_for_good_is_not_retried(clock: FakeClock) -> None:
    build = Calls()
    with pytest.raises(OperationFailedError) as raised:
        Bench(BusinessWriteFails(400), clock).idem.run_atomic(KEY, SAME, build.build,
                                                              partition=PARTITION)
    assert (raised.value.status_code, build.count) == (400, 1)


# -- results the record cannot keep ------------------------------------------------------
def test_a_result_that_is_not_json_is_refused_but_the_effect_stays_recorded(bench: Bench) -> None:
    handler = Calls({"sent", "twice?"})  # a set: not JSON
    with pytest.raises(ResultTooLargeError, match="not JSON-serializable"):
        bench.idem.run(KEY, SAME, handler)
    record = bench.record()
    assert (record.state, record.result) == (RecordState.COMPLETED, None)
    again = bench.idem.run(KEY, SAME, handler)
    assert (again.status, again.result, handler.count) == (OutcomeStatus.DUPLICATE, None, 1)


def test_an_oversized_result_after_a_lost_lease_reports_the_lost_lease(clock: FakeClock) -> None:
    bench = Bench(CountingMemoryStore(), clock)
    bench.idem = Idempotency(bench.store, config=bench.config(max_result_bytes=100))

    def slow_and_large() -> str:
        clock.advance(LEASE.total_seconds())
        bench.flow().run(KEY, SAME, lambda: "theirs")  # took the key over and completed
        return "y" * 500

    outcome = bench.idem.run(KEY, SAME, slow_and_large)
    assert (outcome.status, outcome.result) == (OutcomeStatus.LEASE_LOST, "theirs")
    assert bench.record().result == "theirs"


def test_an_atomic_result_that_is_not_json_is_refused_before_the_commit(bench: Bench) -> None:
    def build(tx: Any) -> Any:
        tx.create("effect", {"v": 1})
        return object()

    with pytest.raises(ResultTooLargeError, match="not JSON-serializable"):
        bench.idem.run_atomic(KEY, SAME, build, partition=PARTITION)
    assert bench.marker() is None and bench.store.read_document(PARTITION, "effect") is None


# -- the completed-key cache --------------------------------------------------------------
@pytest.fixture
def cached(clock: FakeClock) -> Bench:
    return Bench(CountingMemoryStore(), clock, cache=CompletedKeyCache(100, clock=clock))


def test_cache_hits_answer_duplicates_and_conflicts_without_the_store(cached: Bench) -> None:
    cached.idem.run(KEY, SAME, lambda: "first")
    other = DedupKey.from_message_id("orders", "o-2")
    cached.idem.run_atomic(other, SAME, Calls("credit").build, partition=PARTITION)
    handler = Calls()

    for digest, status, result in ((SAME, OutcomeStatus.DUPLICATE, "first"),
                                   (OTHER, OutcomeStatus.CONFLICT, "first")):
        outcome, requests = cached.counted(lambda d=digest: cached.idem.run(KEY, d, handler))
        assert (outcome.status, outcome.result, requests) == (status, result, 0)
        assert cached.telemetry.seen[-1] == (status, "cache")
        outcome, requests = cached.counted(lambda d=digest: cached.idem.run_atomic(
            other, d, handler.build, partition=PARTITION))
        assert (outcome.status, outcome.result, requests) == (status, "credit", 0)
    assert handler.count == 0


def test_a_cached_record_that_expired_goes_back_to_the_store(cached: Bench) -> None:
    cached.idem.run(KEY, SAME, lambda: "first")
    cached.clock.advance(TTL.total_seconds())
    handler = Calls()
    outcome, requests = cached.counted(lambda: cached.idem.run(KEY, SAME, handler))
    assert (outcome.status, handler.count, requests) == (OutcomeStatus.PROCESSED, 1, 4)


def test_a_holder_that_lost_its_lease_caches_the_takers_result_not_its_own(cached: Bench) -> None:
    def slow() -> str:
        cached.clock.advance(LEASE.total_seconds())
        cached.flow(cache=CompletedKeyCache(100)).run(KEY, SAME, lambda: "theirs")
        return "ours"

    assert cached.idem.run(KEY, SAME, slow).status is OutcomeStatus.LEASE_LOST
    outcome, requests = cached.counted(lambda: cached.idem.run(KEY, SAME, Calls()))
    assert (outcome.status, outcome.result, requests) == (OutcomeStatus.DUPLICATE, "theirs", 0)


def test_in_progress_outcomes_are_never_answered_from_the_cache(cached: Bench) -> None:
    held(cached)
    handler = Calls()
    for _ in range(2):
        outcome, requests = cached.counted(lambda: cached.idem.run(KEY, SAME, handler))
        assert (outcome.status, requests) == (OutcomeStatus.IN_PROGRESS, 2)


# -- the decorator --------------------------------------------------------------------------
def test_the_decorator_hashes_the_first_argument_or_the_keywords_or_selected_fields(bench: Bench) -> None:
    sent: list[dict] = []

    def key_of(body: dict | None = None, **kwargs: Any) -> DedupKey:
        return DedupKey.from_business_key("mail", (body or kwargs)["ref"], field="ref")

    @bench.idem.idempotent(key=key_of)
    def whole(body: dict | None = None, **kwargs: Any) -> str:
        sent.append(body or kwargs)
        return "sent"

    assert whole({"ref": "r1", "to": "a"}) == "sent"
    with pytest.raises(KeyReusedError):  # the whole body is hashed
        whole({"ref": "r1", "to": "b"})
    assert whole(ref="r2", to="a") == "sent"  # keywords are the payload
    assert whole(ref="r2", to="a") == "sent"
    assert len(sent) == 2

    @bench.idem.idempotent(key=lambda body: DedupKey.from_business_key("sms", body["ref"],
                                                                        field="ref"),
                           fields=("ref", "to"))
    def selected(body: dict) -> str:
        sent.append(body)
        return "sent"

    assert selected({"ref": "r1", "to": "a", "sentAt": 1}) == "sent"
    assert selected({"ref": "r1", "to": "a", "sentAt": 2}) == "sent"  # sentAt is not hashed
    with pytest.raises(KeyReusedError):
        selected({"ref": "r1", "to": "b", "sentAt": 3})
    assert len(sent) == 3
