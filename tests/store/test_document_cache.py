"""Group commits take documents this process wrote last from a DocumentCache instead of
reading them, and the commit's etag condition catches a stale one: on memory, Azurite and the
Cosmos server."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from shared import DedupKey, Idempotency
from shared import request_hash as digest_of
from shared._core.exceptions import ConcurrencyRetriesExhaustedError, OperationFailedError
from shared._core.records import OutcomeStatus
from shared._core.store import Document, ReadDocument, WriteOp
from shared._flows.cache import DocumentCache
from shared._flows.idempotency import AsyncIdempotency, GroupMessage
from shared.testing import AsyncInMemoryIdempotencyStore
from tests.support.doubles import CountingMemoryStore

PARTITION = "acct-1"


def messages(*names: str) -> list[GroupMessage]:
    return [GroupMessage(DedupKey("ledger", name), digest_of(name)) for name in names]


def add(tx: Any, indexes: Any) -> list[int]:
    """Read-modify-write of one counter: +1 per message, written back under the etag read."""
    return count_up(tx, tx.read("counter"), indexes)


def count_up(tx: Any, found: Any, indexes: Any) -> list[int]:
    """`add` after its read (the sync and async builds share it)."""
    count = int(found.body["count"]) if found else 0
    results = [count := count + 1 for _ in indexes]
    if found is None:
        tx.create("counter", {"count": count})
    else:
        tx.replace("counter", {"count": count}, etag=found.etag)
    return results


class ReadCounter:
    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[str] = []
        real = store.perform

        def perform(step: Any) -> Any:  # every request of a flow is one step the store performs
            if isinstance(step, ReadDocument):
                self.reads.append(step.document_id)
            return real(step)

        monkeypatch.setattr(store, "perform", perform)


def counter_of(store: Any) -> int:
    return int(store.read_document(PARTITION, "counter").body["count"])


def test_a_commit_reports_what_it_wrote_with_etags_the_store_accepts(store, clock):
    idem = Idempotency(store)
    marker = idem._marker(DedupKey("ledger", "m"), "h", partition=PARTITION)
    written: list[Document] = []
    store.commit(marker, [WriteOp("create", "counter", {"count": 1}),
                          WriteOp("create", "note", {"text": "x"})], written=written)
    assert [(d.id, d.body) for d in written] == [("counter", {"count": 1}), ("note", {"text": "x"})]
    # The etag is the stored one: a conditional replace under it succeeds, a second one fails.
    store.write_documents(PARTITION, [WriteOp("replace", "counter", {"count": 2},
                                              etag=written[0].etag)])
    with pytest.raises(OperationFailedError):
        store.write_documents(PARTITION, [WriteOp("replace", "counter", {"count": 3},
                                                  etag=written[0].etag)])


def test_the_next_group_takes_the_document_from_the_cache_without_a_read(store, monkeypatch):
    idem = Idempotency(store, documents=DocumentCache())
    counted = ReadCounter(store, monkeypatch)
    first = idem.run_atomic_group(messages("a", "b"), add, partition=PARTITION)
    second = idem.run_atomic_group(messages("c", "d", "e"), add, partition=PARTITION)
    assert [o.result for o in first + second] == [1, 2, 3, 4, 5]
    assert counted.reads == ["counter"]  # the first group's read only
    assert counter_of(store) == 5


def test_without_a_cache_every_group_reads(store, monkeypatch):
    idem = Idempotency(store)
    counted = ReadCounter(store, monkeypatch)
    idem.run_atomic_group(messages("a"), add, partition=PARTITION)
    idem.run_atomic_group(messages("b"), add, partition=PARTITION)
    assert counted.reads == ["counter", "counter"]


def test_a_document_someone_else_changed_fails_the_commit_and_is_read_again(store, monkeypatch):
    idem = Idempotency(store, documents=DocumentCache())
    idem.run_atomic_group(messages("a", "b"), add, partition=PARTITION)
    current = store.read_document(PARTITION, "counter")
    store.write_documents(PARTITION, [WriteOp("replace", "counter", {"count": 100},
                                              etag=current.etag)])  # another instance
    counted = ReadCounter(store, monkeypatch)
    outcomes = idem.run_atomic_group(messages("c"), add, partition=PARTITION)
    assert outcomes[0].status is OutcomeStatus.PROCESSED and outcomes[0].result == 101
    assert counted.reads == ["counter"]  # the stale copy failed the commit, then one read
    assert counter_of(store) == 101


def test_a_cached_document_the_build_does_not_write_back_is_read_from_the_store(store,
                                                                               monkeypatch):
    idem = Idempotency(store, documents=DocumentCache())
    idem.run_atomic_group(messages("a"), add, partition=PARTITION)
    current = store.read_document(PARTITION, "counter")
    store.write_documents(PARTITION, [WriteOp("replace", "counter", {"count": 7},
                                              etag=current.etag)])
    counted = ReadCounter(store, monkeypatch)

    def copy_elsewhere(tx: Any, indexes: Any) -> list[int]:  # reads the counter, writes another
        count = int(tx.read("counter").body["count"])
        tx.upsert("copy", {"count": count})
        return [count for _ in indexes]

    outcomes = idem.run_atomic_group(messages("b"), copy_elsewhere, partition=PARTITION)
    assert outcomes[0].result == 7  # not the cached 1: nothing would have checked it
    assert counted.reads == ["counter"]


def test_the_async_flow_uses_the_cache_the_same_way():
    store = AsyncInMemoryIdempotencyStore(CountingMemoryStore())
    idem = AsyncIdempotency(store, documents=DocumentCache())

    async def add_async(tx: Any, indexes: Any) -> list[int]:
        return count_up(tx, await tx.read("counter"), indexes)

    async def main() -> list[Any]:
        first = await idem.run_atomic_group(messages("a"), add_async, partition=PARTITION)
        before = store.sync.requests
        second = await idem.run_atomic_group(messages("b"), add_async, partition=PARTITION)
        return [first[0].result, second[0].result, store.sync.requests - before]

    assert asyncio.run(main()) == [1, 2, 1]  # one request: the commit


def test_the_cache_is_bounded_and_keeps_only_documents_with_an_etag():
    cache = DocumentCache(max_entries=2)
    for name in ("a", "b", "c"):
        cache.put(Document(name, "p", {}, etag=f"e-{name}"))
    cache.put(Document("d", "p", {}, etag=None))
    assert cache.get("p", "a") is None and cache.get("p", "c").etag == "e-c"
    assert cache.get("p", "d") is None and len(cache) == 2


def test_two_instances_with_caches_of_their_own_never_lose_an_update(store):
    """Two consumers of one account, each remembering what it wrote, committing groups at the
    same time: each stale copy fails its commit and is read again, so every message counts
    once (the results are exactly 1..60) and the counter ends at 60. (A partition has one
    owner at a time; this is the worst case, around a rebalance.)"""
    instances = [Idempotency(store, documents=DocumentCache()) for _ in range(2)]
    results: list[int] = []
    lock = threading.Lock()

    def consume(index: int) -> None:
        for group in range(10):
            names = [f"i{index}-g{group}-m{n}" for n in range(3)]
            while True:  # as a consumer does: lost too many races, so try the group again
                try:
                    outcomes = instances[index].run_atomic_group(messages(*names), add,
                                                                 partition=PARTITION)
                    break
                except ConcurrencyRetriesExhaustedError:
                    continue
            assert all(o.status is OutcomeStatus.PROCESSED for o in outcomes)
            with lock:
                results.extend(o.result for o in outcomes)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == list(range(1, 61))
    assert counter_of(store) == 60
