"""AsyncIdempotency.run_atomic_group runs the same group flow as the sync one, on async stores."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shared import DedupKey, request_hash
from shared._core.records import OutcomeStatus
from shared._core.store import WriteOp
from shared._flows.drivers import AsyncTransaction
from shared._flows.idempotency import AsyncIdempotency, GroupMessage
from tests.store import test_async_flow

# The async stores on memory, Azurite and the Cosmos server (fixtures), and the two-consumer runner.
async_backend, open_store, run = (test_async_flow.async_backend, test_async_flow.open_store,
                                  test_async_flow.run)

TTL = timedelta(hours=1)


def messages(names: list[str], contents: list[str] | None = None) -> list[GroupMessage]:
    return [GroupMessage(DedupKey("ledger", name), request_hash(content))
            for name, content in zip(names, contents or names, strict=True)]


async def counter(tx: AsyncTransaction, indexes: Any) -> list[dict[str, int]]:
    """An async build: one counter document, +1 per message; the count after each."""
    document = await tx.read("counter")
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


async def stored_count(store: Any) -> int:
    document = await store.read_document("acct", "counter")
    return int(document.body["count"])


def test_a_group_commits_every_marker_with_its_result_then_answers_duplicates(open_store, clock):
    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        done = await first.run_atomic_group(messages(["a", "b", "c"]), counter, partition="acct")
        assert [o.status for o in done] == [OutcomeStatus.PROCESSED] * 3
        assert [o.result for o in done] == [{"count": 1}, {"count": 2}, {"count": 3}]
        record = await store.get_record("acct", DedupKey("ledger", "b").encoded)
        assert record.result == {"count": 2}
        again = await second.run_atomic_group(messages(["a", "b", "c"]), counter,
                                              partition="acct")
        assert [o.status for o in again] == [OutcomeStatus.DUPLICATE] * 3
        assert await stored_count(store) == 3

    run(open_store, clock, scenario)


def test_a_duplicate_and_a_conflict_in_a_group_are_judged_and_the_rest_committed(open_store, clock):
    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        await first.run_atomic_group(messages(["a", "c"]), counter, partition="acct")
        outcomes = await second.run_atomic_group(
            messages(["a", "b", "c", "d", "b"], ["a", "b", "other", "d", "b2"]), counter,
            partition="acct")
        assert [o.status for o in outcomes] == [
            OutcomeStatus.DUPLICATE, OutcomeStatus.PROCESSED, OutcomeStatus.CONFLICT,
            OutcomeStatus.PROCESSED, OutcomeStatus.CONFLICT]
        assert outcomes[0].result == {"count": 1}
        assert [outcomes[1].result, outcomes[3].result] == [{"count": 3}, {"count": 4}]
        assert await stored_count(store) == 4

    run(open_store, clock, scenario)


def test_a_group_larger_than_a_transaction_is_split_in_order(open_store, clock):
    names = [f"m{n}" for n in range(130)]

    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        outcomes = await first.run_atomic_group(messages(names), counter, partition="acct")
        assert [o.result["count"] for o in outcomes] == list(range(1, 131))
        assert await stored_count(store) == 130

    run(open_store, clock, scenario)


def test_an_expired_marker_in_a_group_is_taken_over(open_store, clock):
    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        await first.run_atomic_group(messages(["a"]), counter, partition="acct")
        clock.advance(TTL.total_seconds() + 1)
        outcomes = await second.run_atomic_group(messages(["b", "a"]), counter, partition="acct")
        assert [o.status for o in outcomes] == [OutcomeStatus.PROCESSED] * 2
        assert outcomes[1].record.attempts == 2
        assert await stored_count(store) == 3

    run(open_store, clock, scenario)


def test_a_concurrent_business_write_makes_the_group_read_again(open_store, clock):
    builds: list[int] = []

    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        async def build(tx: AsyncTransaction, indexes: Any) -> list[dict[str, int]]:
            results = await counter(tx, indexes)
            if not builds:  # someone else writes the counter between our read and commit
                await store.write_documents("acct", [WriteOp("create", "counter", {"count": 10})])
            builds.append(len(indexes))
            return results

        outcomes = await first.run_atomic_group(messages(["a", "b"]), build, partition="acct")
        assert [o.result for o in outcomes] == [{"count": 11}, {"count": 12}]
        assert await stored_count(store) == 12

    run(open_store, clock, scenario)
    assert builds == [2, 2]
