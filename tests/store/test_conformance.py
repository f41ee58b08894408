"""One conformance suite for every backend: the in-memory store, and the real local servers.

The in-memory store passing the same suite is what makes it a faithful test
double; Azurite and the Cosmos server are the evidence for the real backends.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared import DedupKey, Idempotency, IdempotencyConfig, OutcomeStatus, request_hash
from shared._backends import CosmosIdempotencyStore
from shared._core.exceptions import ConcurrencyRetriesExhaustedError, ResultTooLargeError
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import WriteOp

LEASE = timedelta(minutes=5)
TTL = timedelta(days=7)


@pytest.fixture(params=("memory", "table", "cosmos"))
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def idem(store, clock) -> Idempotency:
    return Idempotency(store, config=IdempotencyConfig(ttl=TTL, lease=LEASE, clock=clock))


def key(value: str = "order-1", consumer: str = "orders") -> DedupKey:
    return DedupKey.from_message_id(consumer, value)


class Calls:
    """A handler that counts its calls and returns a result."""

    def __init__(self, result: object = "ok") -> None:
        self.count = 0
        self.result = result

    def __call__(self) -> object:
        self.count += 1
        return self.result


def stored(store, dedup_key: DedupKey) -> IdempotencyRecord | None:
    return store.get_record(dedup_key.encoded, dedup_key.encoded)


# -- two-phase -----------------------------------------------------------------------
def test_first_claim_processes_and_records_the_result(idem, store):
    handler = Calls({"charged": 42})
    outcome = idem.run(key(), request_hash({"a": 1}), handler)
    assert outcome.status is OutcomeStatus.PROCESSED
    assert handler.count == 1
    record = stored(store, key())
    assert record is not None
    assert record.state is RecordState.COMPLETED
    assert record.result == {"charged": 42}
    assert record.request_hash == request_hash({"a": 1})
    assert record.key.key == "order-1"  # raw key kept for operators
    assert record.lease_expires_at is None
    assert record.expires_at == pytest.approx(record.created_at + TTL.total_seconds())


def test_duplicate_returns_the_first_result_without_running_again(idem):
    first, second = Calls({"n": 1}), Calls({"n": 2})
    idem.run(key(), request_hash({"a": 1}), first)
    outcome = idem.run(key(), request_hash({"a": 1}), second)
    assert outcome.status is OutcomeStatus.DUPLICATE
    assert outcome.result == {"n": 1}
    assert second.count == 0


def test_same_key_with_different_content_is_a_conflict(idem):
    idem.run(key(), request_hash({"amount": 10}), Calls())
    handler = Calls()
    outcome = idem.run(key(), request_hash({"amount": 99}), handler)
    assert outcome.status is OutcomeStatus.CONFLICT
    assert outcome.stored_hash == request_hash({"amount": 10})
    assert outcome.request_hash == request_hash({"amount": 99})
    assert handler.count == 0


def test_each_consumer_tracks_the_same_message_on_its_own(idem, store):
    notify, audit = Calls(), Calls()
    a = idem.run(key("m-1", "notify"), request_hash("x"), notify)
    b = idem.run(key("m-1", "audit"), request_hash("x"), audit)
    assert (a.status, b.status) == (OutcomeStatus.PROCESSED, OutcomeStatus.PROCESSED)
    assert (notify.count, audit.count) == (1, 1)
    assert stored(store, key("m-1", "notify")) is not None
    assert stored(store, key("m-1", "audit")) is not None


def test_live_in_progress_record_reports_in_progress(idem):
    outcome, held = idem.claim(key(), request_hash("x"))
    assert held is not None and outcome.status is OutcomeStatus.PROCESSED
    handler = Calls()
    again = idem.run(key(), request_hash("x"), handler)
    assert again.status is OutcomeStatus.IN_PROGRESS
    assert handler.count == 0


def test_in_progress_record_whose_lease_ran_out_is_taken_over(idem, store, clock):
    idem.claim(key(), request_hash("x"))  # the first consumer dies here
    clock.advance(LEASE.total_seconds() + 1)
    handler = Calls("second")
    outcome = idem.run(key(), request_hash("x"), handler)
    assert outcome.status is OutcomeStatus.TAKEN_OVER
    assert handler.count == 1
    record = stored(store, key())
    assert record.state is RecordState.COMPLETED
    assert record.attempts == 2
    assert record.result == "second"


def test_stale_record_can_be_left_to_the_caller_to_reconcile(idem):
    idem.claim(key(), request_hash("x"))
    idem.config.clock.advance(LEASE.total_seconds() + 1)
    handler = Calls()
    outcome = idem.run(key(), request_hash("x"), handler, takeover_stale=False)
    assert outcome.status is OutcomeStatus.STALE
    assert outcome.record.state is RecordState.IN_PROGRESS
    assert handler.count == 0


def test_takeover_loses_cleanly_when_the_old_owner_completes_first(idem, store, clock):
    _, held = idem.claim(key(), request_hash("x"))
    clock.advance(LEASE.total_seconds() + 1)
    stale_view = store.get_record(held.partition_key, held.id)
    idem.complete(held, "first")  # the slow owner finishes after all
    taken = stale_view.evolve(attempts=2, updated_at=clock())
    from shared._core.exceptions import RecordChangedError

    with pytest.raises(RecordChangedError):
        store.replace_record_if_unchanged(taken)  # etag condition: the takeover must not win
    assert stored(store, key()).result == "first"


def test_expired_record_is_taken_over_by_replace_not_delete(idem, store, clock):
    idem.run(key(), request_hash("x"), Calls("old"))
    before = stored(store, key())
    clock.advance(TTL.total_seconds() + 1)
    handler = Calls("new")
    outcome = idem.run(key(), request_hash("x"), handler)
    assert outcome.status is OutcomeStatus.PROCESSED
    assert handler.count == 1
    after = stored(store, key())
    assert after.result == "new"
    assert after.etag != before.etag
    assert after.created_at > before.created_at


def test_failed_handler_releases_the_claim_so_a_redelivery_retries(idem, store):
    def boom() -> None:
        raise RuntimeError("downstream failed")

    with pytest.raises(RuntimeError):
        idem.run(key(), request_hash("x"), boom)
    assert stored(store, key()) is None
    handler = Calls()
    assert idem.run(key(), request_hash("x"), handler).status is OutcomeStatus.PROCESSED
    assert handler.count == 1


def test_oversized_result_is_a_clear_error_but_the_effect_stays_recorded(store, clock):
    idem = Idempotency(store, config=IdempotencyConfig(max_result_bytes=100, clock=clock))
    with pytest.raises(ResultTooLargeError, match="at most 100"):
        idem.run(key(), request_hash("x"), Calls("y" * 500))
    handler = Calls()
    again = idem.run(key(), request_hash("x"), handler)
    assert again.status is OutcomeStatus.DUPLICATE  # never executed twice
    assert handler.count == 0


def test_decorator_runs_a_function_once_per_key(idem: Idempotency):
    calls: list[dict] = []

    @idem.idempotent(key=lambda body: DedupKey.from_business_key("jobs", body["ref"], field="ref"))
    def handle(body: dict) -> str:
        calls.append(body)
        return f"done {body['ref']}"

    first = handle({"ref": "r1", "n": 1})
    second = handle({"ref": "r1", "n": 1})
    assert first == "done r1"
    assert second == "done r1"  # the stored result: the handler did not run again
    assert len(calls) == 1


# -- atomic ------------------------------------------------------------------------------
def test_atomic_path_commits_marker_and_business_writes_together(idem, store):
    def build(tx):
        tx.create("order-1", {"total": 10.5, "kind": "order"})
        tx.create("order-1:line:1", {"sku": "A", "qty": 2, "kind": "line"})
        return {"order": "order-1"}

    outcome = idem.run_atomic(key(), request_hash("x"), build, partition="p1")
    assert outcome.status is OutcomeStatus.PROCESSED
    assert store.read_document("p1", "order-1").body["total"] == 10.5
    assert store.read_document("p1", "order-1:line:1").body["qty"] == 2
    marker = store.get_record(outcome.record.partition_key, outcome.record.id)
    assert marker.state is RecordState.COMPLETED and marker.result == {"order": "order-1"}


def test_atomic_duplicate_is_identified_by_the_marker_conflict(idem, store):
    def build(tx):
        tx.create("doc", {"v": 1})
        return "first"

    idem.run_atomic(key(), request_hash("x"), build, partition="p1")
    outcome = idem.run_atomic(key(), request_hash("x"), build, partition="p1")
    assert outcome.status is OutcomeStatus.DUPLICATE
    assert outcome.result == "first"
    assert store.read_document("p1", "doc").body["v"] == 1


def test_atomic_conflict_on_different_content(idem):
    idem.run_atomic(key(), request_hash("x"), lambda tx: tx.create("d", {"v": 1}), partition="p")
    outcome = idem.run_atomic(key(), request_hash("y"), lambda tx: tx.create("d2", {"v": 2}),
                              partition="p")
    assert outcome.status is OutcomeStatus.CONFLICT


def test_failed_business_write_leaves_no_marker(idem, store, stack, backend):
    """Real Cosmos rolls a failed batch back; the test server needs the launcher's fix
    (gap 1 in LOCAL-STACK.md: no rollback of operations before the failing one)."""
    stale = store.write_documents("p", [WriteOp("create", "acct", {"balance": 0})])[0].etag
    current = store.read_document("p", "acct")
    store.write_documents("p", [WriteOp("replace", "acct", {"balance": 0}, current.etag)])

    def build(tx):
        tx.replace("acct", {"balance": 5}, etag=stale)
        return None

    with pytest.raises(ConcurrencyRetriesExhaustedError):
        idem.run_atomic(key(), request_hash("x"), build, partition="p")
    assert store.get_record("p", key().encoded) is None
    assert store.read_document("p", "acct").body["balance"] == 0


def test_atomic_rebuilds_after_a_concurrent_update(idem, store):
    store.write_documents("p", [WriteOp("create", "acct", {"balance": 0})])
    builds = 0

    def build(tx):
        nonlocal builds
        builds += 1
        account = tx.read("acct")
        if builds == 1:  # someone else credits the account between our read and commit
            current = tx.read("acct")
            store.write_documents("p", [WriteOp(
                "replace", "acct", {"balance": current.body["balance"] + 100}, current.etag)])
        tx.replace("acct", {"balance": account.body["balance"] + 5}, etag=account.etag)
        return account.body["balance"] + 5

    outcome = idem.run_atomic(key(), request_hash("x"), build, partition="p")
    assert outcome.status is OutcomeStatus.PROCESSED
    assert builds == 2
    assert store.read_document("p", "acct").body["balance"] == 105


def test_business_document_can_be_its_own_marker(make_store, backend, clock):
    store = make_store(backend, partition_key_path="/orderId")
    idem = Idempotency(store, config=IdempotencyConfig(clock=clock))
    order = {"orderId": "ORD-7", "total": 30.0}

    def build(tx):
        tx.create("ORD-7:line:1", {"orderId": "ORD-7", "sku": "A"})
        return {"orderId": "ORD-7"}

    first = idem.run_atomic(key("ORD-7"), request_hash(order), build, partition="ORD-7",
                            marker_id="ORD-7", marker_body=order, expires=False)
    again = idem.run_atomic(key("ORD-7"), request_hash(order), build, partition="ORD-7",
                            marker_id="ORD-7", marker_body=order, expires=False)
    assert (first.status, again.status) == (OutcomeStatus.PROCESSED, OutcomeStatus.DUPLICATE)
    document = store.read_document("ORD-7", "ORD-7")
    assert document.body["total"] == 30.0
    assert store.get_record("ORD-7", "ORD-7").request_hash == request_hash(order)
    assert first.record.expires_at is None


def test_expired_atomic_marker_is_taken_over_in_the_same_transaction(idem, store, clock):
    idem.run_atomic(key(), request_hash("x"), lambda tx: tx.create("a", {"v": 1}), partition="p")
    clock.advance(TTL.total_seconds() + 1)
    outcome = idem.run_atomic(key(), request_hash("x"), lambda tx: tx.create("b", {"v": 2}),
                              partition="p")
    assert outcome.status is OutcomeStatus.PROCESSED
    assert outcome.record.attempts == 2
    assert store.read_document("p", "b") is not None


def test_atomic_result_too_large_is_refused_before_anything_is_written(store, clock):
    idem = Idempotency(store, config=IdempotencyConfig(max_result_bytes=50, clock=clock))
    with pytest.raises(ResultTooLargeError):
        idem.run_atomic(key(), request_hash("x"),
                        lambda tx: (tx.create("a", {"v": 1}), "z" * 200)[1], partition="p")
    assert store.read_document("p", "a") is None


# -- maintenance -------------------------------------------------------------------------
def querying(store):
    """The store with its purge query on: a Cosmos container with a default TTL expires
    markers itself and skips the query (next test), but the local server ignores `ttl`,
    and a container without a default TTL needs the query."""
    if isinstance(store, CosmosIdempotencyStore):
        return CosmosIdempotencyStore.from_container(store.container, native_ttl=False)
    return store


def test_purge_deletes_expired_records_and_keeps_live_ones(idem, store, clock):
    for n in range(5):
        idem.run(key(f"old-{n}"), request_hash("x"), Calls())
    clock.advance(TTL.total_seconds() + 1)
    idem.run(key("fresh"), request_hash("x"), Calls())
    assert querying(store).purge_expired(clock()) == 5
    assert stored(store, key("old-0")) is None
    assert stored(store, key("fresh")) is not None


def test_purge_deletes_expired_markers_sharing_a_partition_in_batches(idem, store, clock):
    for n in range(7):
        idem.run_atomic(key(f"e-{n}"), request_hash("x"), lambda tx: None, partition="acct-1")
    clock.advance(TTL.total_seconds() + 1)
    assert querying(store).purge_expired(clock()) == 7


@pytest.mark.parametrize("backend", ["cosmos"])
def test_cosmos_leaves_expiry_to_native_ttl_and_runs_no_purge_query(idem, store, clock,
                                                                    monkeypatch):
    idem.run(key("old"), request_hash("x"), Calls())
    record = stored(store, key("old"))
    item = store.container.read_item(record.id, record.partition_key)
    assert item["ttl"] == TTL.total_seconds()  # the service deletes it when that runs out
    clock.advance(TTL.total_seconds() + 1)
    queries = []
    monkeypatch.setattr(store.container, "query_items",
                        lambda *a, **k: queries.append(a) or iter(()))
    assert store.purge_expired(clock()) == 0
    assert queries == []


def test_stale_in_progress_records_can_be_listed(idem, store, clock):
    idem.claim(key("stuck"), request_hash("x"))
    idem.run(key("done"), request_hash("x"), Calls())
    clock.advance(LEASE.total_seconds() + 1)
    stale = list(store.iter_records(in_progress_before=clock()))
    assert [r.key.key for r in stale] == ["stuck"]


def test_documents_round_trip_scalar_types_including_int64(store):
    body = {"big": 2**40, "negative": -(2**35), "small": 7, "price": 9.75, "flag": True,
            "text": "é/#?"}
    store.write_documents("p", [WriteOp("create", "doc", body)])
    assert {k: v for k, v in store.read_document("p", "doc").body.items() if k in body} == body


def test_nested_business_bodies_are_refused_with_a_clear_error(idem):
    with pytest.raises(ValueError, match="nested"):
        idem.run_atomic(key(), request_hash("x"), lambda tx: tx.create("d", {"lines": [1]}),
                        partition="p")


# -- group commits -----------------------------------------------------------------------
def group_marker(idem: Idempotency, name: str, partition: str = "acct", result: object = None
                 ) -> IdempotencyRecord:
    return idem._marker(key(name, "ledger"), request_hash(name), partition=partition
                        ).evolve(result=result)


def test_group_commit_writes_every_marker_and_the_business_write_at_once(idem, store):
    markers = [group_marker(idem, f"e{n}", result={"balance": n}) for n in range(3)]
    committed = store.commit_group(markers, [WriteOp("create", "balance", {"balance": 2})])
    assert [m.id for m in committed] == [m.id for m in markers]
    assert committed[0].etag is not None
    for marker in markers:
        stored_marker = store.get_record("acct", marker.id)
        assert stored_marker.result == marker.result and stored_marker.state is RecordState.COMPLETED
    assert store.read_document("acct", "balance").body["balance"] == 2


@pytest.mark.parametrize("position", [0, 1, 2])
def test_group_commit_names_the_marker_that_exists_and_writes_nothing(idem, store, position):
    markers = [group_marker(idem, f"e{n}") for n in range(3)]
    store.commit(markers[position], [])  # committed before, e.g. by an earlier batch
    from shared._core.exceptions import RecordExistsError

    with pytest.raises(RecordExistsError) as raised:
        store.commit_group(markers, [WriteOp("create", "balance", {"balance": 1})])
    assert raised.value.index == position
    assert store.read_document("acct", "balance") is None
    others = [m for n, m in enumerate(markers) if n != position]
    assert all(store.get_record("acct", m.id) is None for m in others)


def test_group_commit_replaces_an_expired_marker_under_its_etag_and_names_a_stale_one(
        idem, store, clock):
    old = store.commit(group_marker(idem, "e1", result="old"), [])
    clock.advance(TTL.total_seconds() + 1)
    takeover = idem._marker(key("e1", "ledger"), request_hash("e1"), partition="acct", over=old)
    store.commit_group([group_marker(idem, "e0"), takeover.evolve(result="new")], [])
    assert store.get_record("acct", takeover.id).result == "new"
    from shared._core.exceptions import RecordChangedError

    with pytest.raises(RecordChangedError) as raised:  # the same etag again: changed since
        store.commit_group([group_marker(idem, "e2"), takeover.evolve(result="late")], [])
    assert raised.value.index == 1
    assert store.get_record("acct", group_marker(idem, "e2").id) is None


def test_group_commit_reports_a_failed_business_write_by_its_own_index(idem, store):
    from shared._core.exceptions import OperationFailedError

    markers = [group_marker(idem, f"e{n}") for n in range(3)]
    with pytest.raises(OperationFailedError) as raised:
        store.commit_group(markers, [WriteOp("create", "a", {"v": 1}),
                                     WriteOp("replace", "missing", {"v": 1}, etag='W/"1"')])
    assert raised.value.index == 1 and raised.value.status_code in (404, 412)
    assert all(store.get_record("acct", m.id) is None for m in markers)


def test_group_commit_holds_at_most_a_transaction(idem, store):
    markers = [group_marker(idem, f"e{n}") for n in range(100)]
    with pytest.raises(ValueError, match="at most 100"):
        store.commit_group(markers, [WriteOp("create", "balance", {"balance": 1})])
    store.commit_group(markers[:99], [WriteOp("create", "balance", {"balance": 1})])
    assert store.get_record("acct", markers[98].id) is not None


def group_messages(names: list[str], contents: list[str] | None = None) -> list:
    from shared._flows.idempotency import GroupMessage

    return [GroupMessage(key(name, "ledger"), request_hash(content))
            for name, content in zip(names, contents or names, strict=True)]


def counter_build(tx, indexes):
    """One counter document: +1 per message; the result is the count after each one."""
    document = tx.read("counter")
    count = int(document.body["count"]) if document else 0
    results = []
    for _ in indexes:
        count += 1
        results.append({"count": count})
    if document is None:
        tx.create("counter", {"count": count})
    else:
        tx.replace("counter", {"count": count}, etag=document.etag)
    return results


def test_run_atomic_group_commits_markers_with_per_message_results(idem, store):
    outcomes = idem.run_atomic_group(group_messages(["a", "b", "c"]), counter_build,
                                     partition="acct")
    assert [o.status for o in outcomes] == [OutcomeStatus.PROCESSED] * 3
    assert [o.result for o in outcomes] == [{"count": 1}, {"count": 2}, {"count": 3}]
    assert store.get_record("acct", key("b", "ledger").encoded).result == {"count": 2}
    assert store.read_document("acct", "counter").body["count"] == 3


def test_run_atomic_group_resolves_duplicates_and_conflicts_and_commits_the_rest(idem, store):
    idem.run_atomic_group(group_messages(["a", "c"]), counter_build, partition="acct")
    messages = group_messages(["a", "b", "c", "d", "b"], ["a", "b", "other", "d", "b2"])
    outcomes = idem.run_atomic_group(messages, counter_build, partition="acct")
    assert [o.status for o in outcomes] == [
        OutcomeStatus.DUPLICATE, OutcomeStatus.PROCESSED, OutcomeStatus.CONFLICT,
        OutcomeStatus.PROCESSED, OutcomeStatus.CONFLICT]  # the last: "b" again, other content
    assert outcomes[0].result == {"count": 1}  # the first result, as recorded then
    assert [outcomes[1].result, outcomes[3].result] == [{"count": 3}, {"count": 4}]
    assert store.read_document("acct", "counter").body["count"] == 4


def test_run_atomic_group_splits_a_group_larger_than_a_transaction(idem, store):
    names = [f"m{n}" for n in range(150)]
    outcomes = idem.run_atomic_group(group_messages(names), counter_build, partition="acct")
    assert all(o.status is OutcomeStatus.PROCESSED for o in outcomes)
    assert [o.result["count"] for o in outcomes] == list(range(1, 151))
    assert store.read_document("acct", "counter").body["count"] == 150
    again = idem.run_atomic_group(group_messages(names), counter_build, partition="acct")
    assert all(o.status is OutcomeStatus.DUPLICATE for o in again)
    assert store.read_document("acct", "counter").body["count"] == 150


def test_run_atomic_group_takes_expired_markers_over(idem, store, clock):
    idem.run_atomic_group(group_messages(["a"]), counter_build, partition="acct")
    clock.advance(TTL.total_seconds() + 1)
    outcomes = idem.run_atomic_group(group_messages(["b", "a"]), counter_build, partition="acct")
    assert [o.status for o in outcomes] == [OutcomeStatus.PROCESSED, OutcomeStatus.PROCESSED]
    assert outcomes[1].record.attempts == 2
    assert store.read_document("acct", "counter").body["count"] == 3


def test_run_atomic_group_rereads_after_a_concurrent_business_write(idem, store):
    builds = []

    def build(tx, indexes):
        results = counter_build(tx, indexes)
        if not builds:  # someone else writes the counter between our read and commit
            store.write_documents("acct", [WriteOp("create", "counter", {"count": 10})])
        builds.append(len(indexes))
        return results

    outcomes = idem.run_atomic_group(group_messages(["a", "b"]), build, partition="acct")
    assert [o.result for o in outcomes] == [{"count": 11}, {"count": 12}]
    assert builds == [2, 2]
    assert store.read_document("acct", "counter").body["count"] == 12
