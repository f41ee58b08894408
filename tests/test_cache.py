"""The local LRU of completed keys: unit behaviour, and correctness on the real servers.

Store requests are counted exactly (benchmarks.counting), so "a warm duplicate
costs no store request" is a measured fact, not an assumption.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from azure.cosmos import PartitionKey

from benchmarks.counting import (
    RequestCounter,
    counted_cosmos_client,
    counted_table_store,
)
from shared import Idempotency, IdempotencyConfig, OutcomeStatus
from shared._backends import CosmosIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._core.keys import DedupKey, request_hash
from shared._core.records import IdempotencyRecord, RecordState
from shared._flows.cache import CompletedKeyCache
from tests.conftest import FakeClock


# -- unit ---------------------------------------------------------------------------
def _record(key: str, state: RecordState = RecordState.COMPLETED, *, expires_at: float | None = None,
            digest: str = "sha256:x") -> IdempotencyRecord:
    return IdempotencyRecord(DedupKey("c", key), state, digest, 1.0, 1.0, expires_at=expires_at,
                             result={"k": key})


def test_lru_evicts_least_recently_used():
    cache = CompletedKeyCache(2)
    cache.put(_record("a"))
    cache.put(_record("b"))
    assert cache.get(DedupKey("c", "a")) is not None  # a is now the most recent
    cache.put(_record("c"))
    assert cache.get(DedupKey("c", "b")) is None
    assert cache.get(DedupKey("c", "a")) is not None
    assert cache.get(DedupKey("c", "c")) is not None
    assert len(cache) == 2
    assert cache.stats.evictions == 1


def test_in_progress_records_are_refused():
    cache = CompletedKeyCache(10)
    assert cache.put(_record("a", RecordState.IN_PROGRESS)) is False
    assert cache.get(DedupKey("c", "a")) is None
    assert len(cache) == 0


def test_entries_age_out_and_expired_records_are_dropped():
    clock = FakeClock(0.0)
    cache = CompletedKeyCache(10, max_age=timedelta(seconds=30), clock=clock)
    cache.put(_record("a"))
    cache.put(_record("b", expires_at=100.0))
    clock.advance(29)
    assert cache.get(DedupKey("c", "a")) is not None
    assert cache.get(DedupKey("c", "b"), now=100.0) is None  # the record itself expired
    clock.advance(1)
    assert cache.get(DedupKey("c", "a")) is None  # older than max_age
    assert cache.stats.expirations == 2


def test_scoped_per_consumer_and_invalidate():
    cache = CompletedKeyCache(10)
    cache.put(_record("a"))
    assert cache.get(DedupKey("other", "a")) is None
    cache.invalidate(DedupKey("c", "a"))
    assert cache.get(DedupKey("c", "a")) is None


def test_disabled_and_invalid_settings():
    cache = CompletedKeyCache(0)
    assert not cache.enabled
    assert cache.put(_record("a")) is False
    assert cache.get(DedupKey("c", "a")) is None
    with pytest.raises(ValueError):
        CompletedKeyCache(-1)
    with pytest.raises(ValueError):
        CompletedKeyCache(10, max_age=0)


# -- on the real servers ------------------------------------------------------------------
@pytest.fixture
def counted(stack, backend, cosmos_database, table_service):
    """(store, counter): a fresh store whose data-plane requests are counted exactly."""
    counter = RequestCounter(backend)
    name = f"t{uuid.uuid4().hex[:16]}"
    if backend == "table":
        store = counted_table_store(stack.table_connection_string, name, counter)
        yield store, counter
        store.close()
        table_service.delete_table(name)
    else:
        cosmos_database.create_container(name, PartitionKey("/pk"), default_ttl=-1,
                                         indexing_policy=record_indexing_policy("/pk"))
        client = counted_cosmos_client(stack.cosmos_endpoint, stack.cosmos_key, counter,
                                       verify=stack.cosmos_verify)
        container = client.get_database_client(cosmos_database.id).get_container_client(name)
        yield CosmosIdempotencyStore.from_container(container), counter
        client.close()
        cosmos_database.delete_container(name)


def _order(n: int) -> tuple[DedupKey, dict, str]:
    body = {"orderId": f"o-{n}", "amount": 10 + n}
    return DedupKey.from_message_id("orders", f"o-{n}"), body, request_hash(body)


def _build(body: dict):
    def build(tx):
        tx.create(f"line-{uuid.uuid4().hex[:8]}", {"amount": body["amount"]})
        return {"order": body["orderId"]}
    return build


def test_warm_duplicate_costs_no_store_request(counted):
    store, counter = counted
    cache = CompletedKeyCache(100)
    idem = Idempotency(store, cache=cache)
    key, body, digest = _order(1)

    before = counter.data()
    first = idem.run_atomic(key, digest, _build(body))
    assert first.status is OutcomeStatus.PROCESSED
    assert counter.data() - before == 1  # marker + effect, one transaction

    before = counter.data()
    again = idem.run_atomic(key, digest, _build(body))
    assert again.status is OutcomeStatus.DUPLICATE
    assert again.result == {"order": "o-1"}
    assert counter.data() - before == 0

    # the two-phase flow uses the same cache
    key2, _, digest2 = _order(2)
    assert idem.run(key2, digest2, lambda: "sent").status is OutcomeStatus.PROCESSED
    before = counter.data()
    dup = idem.run(key2, digest2, lambda: pytest.fail("handler ran for a duplicate"))
    assert dup.status is OutcomeStatus.DUPLICATE and dup.result == "sent"
    assert counter.data() - before == 0
    assert cache.stats.hits == 2


def test_conflict_is_detected_from_the_cache_entry(counted):
    store, counter = counted
    idem = Idempotency(store, cache=CompletedKeyCache(100))
    key, body, digest = _order(3)
    idem.run_atomic(key, digest, _build(body))
    changed = {**body, "amount": 999}

    before = counter.data()
    outcome = idem.run_atomic(key, request_hash(changed), _build(changed))
    assert outcome.status is OutcomeStatus.CONFLICT
    assert outcome.stored_hash == digest != outcome.request_hash
    assert counter.data() - before == 0


def test_cold_cache_falls_through_to_the_store_then_warms(counted):
    store, counter = counted
    key, body, digest = _order(4)
    Idempotency(store).run_atomic(key, digest, _build(body))  # another instance processed it
    cold = Idempotency(store, cache=CompletedKeyCache(100))

    before = counter.data()
    outcome = cold.run_atomic(key, digest, _build(body))
    assert outcome.status is OutcomeStatus.DUPLICATE
    assert outcome.result == {"order": "o-4"}
    assert counter.data() - before == 2  # failed commit (409) + read of the marker

    before = counter.data()
    assert cold.run_atomic(key, digest, _build(body)).status is OutcomeStatus.DUPLICATE
    assert counter.data() - before == 0


@pytest.mark.parametrize("cache", [None, CompletedKeyCache(0)], ids=["no-cache", "size-0"])
def test_disabled_cache_keeps_the_store_flow(counted, cache):
    store, counter = counted
    idem = Idempotency(store, cache=cache)
    key, body, digest = _order(5)
    assert idem.run_atomic(key, digest, _build(body)).status is OutcomeStatus.PROCESSED
    for _ in range(2):
        before = counter.data()
        assert idem.run_atomic(key, digest, _build(body)).status is OutcomeStatus.DUPLICATE
        assert counter.data() - before == 2


def test_in_progress_is_never_cached(counted):
    store, counter = counted
    key, _, digest = _order(6)
    owner = Idempotency(store)
    _, held = owner.claim(key, digest)
    assert held is not None
    cache = CompletedKeyCache(100)
    other = Idempotency(store, cache=cache)

    busy = other.run(key, digest, lambda: pytest.fail("ran while another consumer holds the key"))
    assert busy.status is OutcomeStatus.IN_PROGRESS
    assert len(cache) == 0

    owner.complete(held, {"sent": True})
    before = counter.data()
    done = other.run(key, digest, lambda: pytest.fail("ran after completion"))
    assert done.status is OutcomeStatus.DUPLICATE and done.result == {"sent": True}
    assert counter.data() - before == 2  # came from the store, not from a cached in-progress
    assert len(cache) == 1


def test_cached_entry_never_outlives_the_record(counted):
    store, _ = counted
    clock = FakeClock()
    config = IdempotencyConfig(ttl=timedelta(hours=1), lease=timedelta(minutes=1), clock=clock)
    idem = Idempotency(store, config=config, cache=CompletedKeyCache(100, max_age=timedelta(days=1)))
    key, body, digest = _order(7)
    assert idem.run_atomic(key, digest, _build(body)).status is OutcomeStatus.PROCESSED
    clock.advance(3601)  # the record expired; the cache entry is still young
    assert idem.run_atomic(key, digest, _build(body)).status is OutcomeStatus.PROCESSED


def test_max_age_sends_the_next_duplicate_to_the_store(counted):
    store, counter = counted
    cache_clock = FakeClock(0.0)
    idem = Idempotency(store, cache=CompletedKeyCache(100, max_age=timedelta(seconds=5),
                                                      clock=cache_clock))
    key, body, digest = _order(8)
    idem.run_atomic(key, digest, _build(body))
    cache_clock.advance(5)
    before = counter.data()
    assert idem.run_atomic(key, digest, _build(body)).status is OutcomeStatus.DUPLICATE
    assert counter.data() - before == 2


def test_concurrent_copies_on_two_cached_instances_apply_once(counted):
    store, _ = counted
    instances = [Idempotency(store, cache=CompletedKeyCache(100)) for _ in range(2)]
    key, body, digest = _order(9)
    barrier = threading.Barrier(2)
    outcomes = []

    def deliver(idem: Idempotency) -> None:
        barrier.wait(timeout=10)
        outcomes.append(idem.run_atomic(key, digest, _build(body)).status)

    threads = [threading.Thread(target=deliver, args=(i,)) for i in instances]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == sorted([OutcomeStatus.PROCESSED, OutcomeStatus.DUPLICATE])
