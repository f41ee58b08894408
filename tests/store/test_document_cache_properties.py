"""Property: with each instance remembering the documents it wrote (DocumentCache), any
interleaving of group commits by two instances, writes by someone else, commits whose answer
is lost, and cache evictions applies every message once and keeps the counter exact.

On the in-memory store (fast, exact); the same mechanism runs on Azurite and the Cosmos
server in test_document_cache.py. A store that ignores the etag condition fails it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from shared import DedupKey, Idempotency
from shared import request_hash as digest_of
from shared._core.exceptions import StoreUnavailableError
from shared._core.records import IdempotencyRecord, OutcomeStatus
from shared._core.store import Document, WriteOp
from shared._flows.cache import DocumentCache
from shared._flows.idempotency import GroupMessage
from shared.testing import InMemoryIdempotencyStore
from tests.store.test_document_cache import add

ACCOUNTS = ("a", "b")
NAMES = tuple(f"m{n}" for n in range(12))
EXTERNAL = 1000  # what someone else adds to a counter


class LossyStore(InMemoryIdempotencyStore):
    """Commits land; when `lose_next` is set, the answer of the next one is lost (a timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next = False

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        committed = super().commit(marker, operations, marker_body=marker_body, written=written)
        if self.lose_next:
            self.lose_next = False
            raise StoreUnavailableError("timed out after the commit was applied")
        return committed


class EtagBlindStore(LossyStore):
    """A seeded bug: business replaces ignore their etag (a last-writer-wins store)."""

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        blind = [WriteOp(op.kind, op.id, op.body, None, op.patch, op.record)
                 if op.record is None and op.kind == "replace" else op for op in operations]
        return super().commit(marker, blind, marker_body=marker_body, written=written)


operation = st.one_of(
    st.tuples(st.just("group"), st.integers(0, 1), st.sampled_from(ACCOUNTS),
              st.lists(st.sampled_from(NAMES), min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("external"), st.sampled_from(ACCOUNTS)),
)


def run_operations(store: LossyStore, cache_sizes: tuple[int, int],
                   operations: list[tuple[Any, ...]]) -> None:
    instances = [Idempotency(store, documents=DocumentCache(max_entries=size))
                 for size in cache_sizes]
    applied: dict[str, set[str]] = {account: set() for account in ACCOUNTS}
    counter: dict[str, int] = dict.fromkeys(ACCOUNTS, 0)
    results: dict[tuple[str, str], int] = {}  # (account, message) -> its count
    for op in operations:
        if op[0] == "external":  # someone else bumps the counter, under the etag it read
            account = op[1]
            found = store.read_document(account, "counter")
            body = {"count": (int(found.body["count"]) if found else 0) + EXTERNAL}
            store.write_documents(account, [
                WriteOp("replace", "counter", body, etag=found.etag) if found
                else WriteOp("create", "counter", body)])
            counter[account] += EXTERNAL
            continue
        _, who, account, names, lose = op
        messages = [GroupMessage(DedupKey("ledger", n), digest_of(n)) for n in names]
        store.lose_next = lose
        try:
            outcomes = instances[who].run_atomic_group(messages, add, partition=account)
        except StoreUnavailableError:  # the commit landed (or not), the answer was lost
            store.lose_next = False
            landed = store.get_record(account, messages[0].key.encoded) is not None
            if landed:  # every new message of the first transaction was applied
                for name in dict.fromkeys(names):
                    if name not in applied[account]:
                        applied[account].add(name)
                        counter[account] += 1
            continue
        first_seen: set[str] = set()
        for name, outcome in zip(names, outcomes, strict=True):
            if name in applied[account] or name in first_seen:
                assert outcome.status is OutcomeStatus.DUPLICATE, (name, outcome.status)
                if (account, name) in results:
                    assert outcome.result == results[(account, name)]
                continue
            assert outcome.status is OutcomeStatus.PROCESSED, (name, outcome.status)
            first_seen.add(name)
            counter[account] += 1
            results[(account, name)] = outcome.result
        applied[account] |= first_seen
    for account in ACCOUNTS:
        found = store.read_document(account, "counter")
        assert (int(found.body["count"]) if found else 0) == counter[account], account
    for (account, _), result in results.items():
        assert 1 <= result <= counter[account]
    per_account = [[r for (a, _), r in results.items() if a == account] for account in ACCOUNTS]
    assert all(len(set(values)) == len(values) for values in per_account)  # no count twice


def check_every_message_applied_once(make_store: Callable[[], LossyStore]) -> Any:
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(cache_sizes=st.tuples(st.sampled_from([1, 2, 100]), st.sampled_from([1, 2, 100])),
           operations=st.lists(operation, min_size=1, max_size=30))
    def check(cache_sizes: tuple[int, int], operations: list[tuple[Any, ...]]) -> None:
        run_operations(make_store(), cache_sizes, operations)

    return check


def test_interleaved_instances_with_caches_apply_every_message_once():
    check_every_message_applied_once(LossyStore)()


def test_a_store_that_ignores_etags_is_caught():
    """The counter-proof: the same property over a last-writer-wins store fails (a remembered
    balance overwrites what the other instance or someone else wrote)."""
    check = seed(20240)(check_every_message_applied_once(EtagBlindStore))
    with pytest.raises(AssertionError):
        check()
