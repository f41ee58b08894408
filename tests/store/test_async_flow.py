"""AsyncIdempotency drives the same flows as Idempotency: its main branches, on async stores."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.cosmos import PartitionKey
from azure.cosmos.aio import CosmosClient

from shared import DedupKey, IdempotencyConfig, request_hash
from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._backends.table_aio import AsyncTableIdempotencyStore
from shared._core.records import KeyReusedError, OutcomeStatus, RecordState
from shared._flows.drivers import AsyncTransaction
from shared._flows.idempotency import AsyncIdempotency
from shared.testing import AsyncInMemoryIdempotencyStore

KEY, DIGEST = DedupKey("notify", "m-1"), request_hash({"text": "hi"})


OpenStore = Callable[[], contextlib.AbstractAsyncContextManager[Any]]


@pytest.fixture(params=["memory", "table", "cosmos"])
def async_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def open_store(request: pytest.FixtureRequest, async_backend: str) -> Iterator[OpenStore]:
    """Opens an async store on a fresh table / container, inside the test's event loop
    (an async client belongs to the loop that made it)."""
    if async_backend == "memory":
        memory = AsyncInMemoryIdempotencyStore()

        @contextlib.asynccontextmanager
        async def opened_memory() -> AsyncIterator[Any]:
            yield memory
        yield opened_memory
        return
    stack = request.getfixturevalue("stack")
    name = f"t{uuid.uuid4().hex[:16]}"
    if async_backend == "table":
        service = request.getfixturevalue("table_service")
        service.create_table(name)

        @contextlib.asynccontextmanager
        async def opened_table() -> AsyncIterator[Any]:
            store = AsyncTableIdempotencyStore.from_connection_string(
                stack.table_connection_string, table_name=name)
            try:
                yield store
            finally:
                await store.close()
        yield opened_table
        service.delete_table(name)
        return
    database = request.getfixturevalue("cosmos_database")
    database.create_container(name, PartitionKey("/pk"), default_ttl=-1,
                              indexing_policy=record_indexing_policy("/pk"))

    @contextlib.asynccontextmanager
    async def opened_cosmos() -> AsyncIterator[Any]:
        async with CosmosClient(stack.cosmos_endpoint, stack.cosmos_key,
                                connection_verify=stack.cosmos_verify) as client:
            container = client.get_database_client(database.id).get_container_client(name)
            yield AsyncCosmosIdempotencyStore.from_container(container)
    yield opened_cosmos
    database.delete_container(name)


def run(open_store: OpenStore, clock: Any,
        scenario: Callable[[Any, AsyncIdempotency, AsyncIdempotency], Any]) -> None:
    """Two consumers on one async store, in one event loop."""
    config = IdempotencyConfig(lease=timedelta(seconds=54), ttl=timedelta(hours=1), clock=clock)

    async def main() -> None:
        async with open_store() as store:
            await scenario(store, AsyncIdempotency(store, config=config),
                           AsyncIdempotency(store, config=config))

    asyncio.run(main())


def test_run_processes_once_then_answers_duplicate_and_conflict(open_store, clock):
    calls: list[str] = []

    async def send() -> str:
        calls.append("sent")
        await asyncio.sleep(0)
        return "sent"

    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        assert (await first.run(KEY, DIGEST, send)).status is OutcomeStatus.PROCESSED
        again = await second.run(KEY, DIGEST, send)
        assert again.status is OutcomeStatus.DUPLICATE and again.result == "sent"
        other = await second.run(KEY, request_hash({"text": "other"}), send)
        assert other.status is OutcomeStatus.CONFLICT

    run(open_store, clock, scenario)
    assert calls == ["sent"]


def test_in_progress_then_takeover_after_the_lease(open_store, clock):
    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        outcome, held = await first.claim(KEY, DIGEST)  # the first consumer dies here
        assert outcome.status is OutcomeStatus.PROCESSED and held is not None
        busy = await second.run(KEY, DIGEST, lambda: "again")  # a sync handler works too
        assert busy.status is OutcomeStatus.IN_PROGRESS
        clock.advance(55)
        taken = await second.run(KEY, DIGEST, lambda: "again")
        assert taken.status is OutcomeStatus.TAKEN_OVER and taken.result == "again"

    run(open_store, clock, scenario)


def test_a_failed_handler_releases_the_key(open_store, clock):
    async def boom() -> str:
        raise RuntimeError("downstream down")

    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        with pytest.raises(RuntimeError):
            await first.run(KEY, DIGEST, boom)
        retried = await second.run(KEY, DIGEST, lambda: "sent")
        assert retried.status is OutcomeStatus.PROCESSED  # released, not stuck in progress

    run(open_store, clock, scenario)


def test_a_holder_that_lost_its_lease_gets_lease_lost(open_store, clock):
    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        taken = []

        async def slow_effect() -> str:  # another consumer takes over while this one is stuck
            clock.advance(55)
            taken.append(await second.run(KEY, DIGEST, lambda: "theirs"))
            return "ours"

        outcome = await first.run(KEY, DIGEST, slow_effect)
        assert taken[0].status is OutcomeStatus.TAKEN_OVER
        assert outcome.status is OutcomeStatus.LEASE_LOST and outcome.result == "theirs"
        stored = await store.get_record(KEY.encoded, KEY.encoded)
        assert stored.state is RecordState.COMPLETED and stored.result == "theirs"

    run(open_store, clock, scenario)


async def credit(tx: AsyncTransaction) -> int:
    """An async build: reads the balance through the transaction, adds 5."""
    balance = await tx.read("balance")
    amount = (balance.body["amount"] if balance else 0) + 5
    if balance is None:
        tx.create("balance", {"amount": amount})
    else:
        tx.replace("balance", {"amount": amount}, etag=balance.etag)
    return amount


def test_run_atomic_commits_marker_and_writes_once(open_store, clock):
    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        done = await first.run_atomic(KEY, DIGEST, credit, partition="acct-1")
        assert done.status is OutcomeStatus.PROCESSED and done.result == 5
        again = await second.run_atomic(KEY, DIGEST, credit, partition="acct-1")
        assert again.status is OutcomeStatus.DUPLICATE and again.result == 5
        other = await second.run_atomic(KEY, request_hash("other"), credit, partition="acct-1")
        assert other.status is OutcomeStatus.CONFLICT
        balance = await store.read_document("acct-1", "balance")
        assert balance is not None and balance.body["amount"] == 5

    run(open_store, clock, scenario)


def test_run_atomic_takes_an_expired_marker_over(open_store, clock):
    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        await first.run_atomic(KEY, DIGEST, lambda tx: "one", partition="acct-1")
        clock.advance(timedelta(hours=2).total_seconds())
        redone = await second.run_atomic(KEY, DIGEST, credit, partition="acct-1")
        assert redone.status is OutcomeStatus.PROCESSED and redone.result == 5

    run(open_store, clock, scenario)


def test_a_live_async_handler_keeps_its_lease_past_the_lease_length(open_store):
    """Real time, a 0.6 s lease and a 2 s handler: the renewal task keeps the key held, so a
    second consumer is told it is in progress instead of taking it over mid-call."""
    config = IdempotencyConfig(lease=timedelta(seconds=0.6), ttl=timedelta(hours=1))

    async def main() -> None:
        async with open_store() as store:
            first, second = (AsyncIdempotency(store, config=config) for _ in range(2))

            async def slow() -> str:
                await asyncio.sleep(2.0)
                return "sent"

            running = asyncio.create_task(first.run(KEY, DIGEST, slow))
            await asyncio.sleep(1.2)  # two lease lengths later
            busy = await second.run(KEY, DIGEST, lambda: "again")
            assert busy.status is OutcomeStatus.IN_PROGRESS
            done = await running
            assert done.status is OutcomeStatus.PROCESSED and done.result == "sent"

    asyncio.run(main())


def test_the_async_decorator_makes_a_coroutine_function_that_runs_once_per_key(open_store,
                                                                               clock):
    sent: list[dict] = []

    async def scenario(store: Any, first: AsyncIdempotency, second: AsyncIdempotency) -> None:
        @first.idempotent(key=lambda body: DedupKey.from_business_key("mail", body["ref"],
                                                                       field="ref"))
        async def send(body: dict) -> str:
            sent.append(body)
            await asyncio.sleep(0)
            return "sent"

        assert inspect.iscoroutinefunction(send)  # the worker awaits it, as it should
        assert await send({"ref": "r1", "to": "a"}) == "sent"
        assert await send({"ref": "r1", "to": "a"}) == "sent"  # the stored result: a duplicate
        with pytest.raises(KeyReusedError) as reused:
            await send({"ref": "r1", "to": "b"})
        assert reused.value.outcome.status is OutcomeStatus.CONFLICT

    run(open_store, clock, scenario)
    assert sent == [{"ref": "r1", "to": "a"}]
