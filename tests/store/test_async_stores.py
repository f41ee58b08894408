"""The async stores built the way the sync ones are: endpoint + credential, keyword options.

Against Azurite and the Cosmos server: records round trip, `commit_group` (all or
nothing, failures named by index), and who closes which client.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.cosmos import PartitionKey
from azure.cosmos.aio import CosmosClient
from azure.data.tables.aio import TableClient

from shared import DedupKey, request_hash
from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._backends.table_aio import AsyncTableIdempotencyStore
from shared._core.exceptions import (
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
    StoreUnavailableError,
)
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import WriteOp

PARTITION = "acct"
CLOSED = "HTTP transport has already been closed"  # azure-core, on a request after close()


def table_account(connection_string: str) -> tuple[str, AzureNamedKeyCredential]:
    """The table endpoint and named key of a storage connection string (Azurite or Azure)."""
    parts = dict(part.split("=", 1) for part in connection_string.split(";") if part)
    endpoint = parts.get("TableEndpoint") or (
        f"{parts.get('DefaultEndpointsProtocol', 'https')}://{parts['AccountName']}.table."
        f"{parts.get('EndpointSuffix', 'core.windows.net')}")
    return endpoint, AzureNamedKeyCredential(parts["AccountName"], parts["AccountKey"])


@dataclass
class Target:
    """A fresh table / container, and how to reach it with async clients."""

    backend: str
    name: str
    database: str
    stack: Any

    def build(self, **client_options: Any) -> Any:
        """A store that creates (and owns) its client, from endpoint + credential."""
        if self.backend == "table":
            endpoint, credential = table_account(self.stack.table_connection_string)
            return AsyncTableIdempotencyStore(endpoint, credential, table_name=self.name,
                                              **client_options)
        return AsyncCosmosIdempotencyStore(
            self.stack.cosmos_endpoint, self.stack.cosmos_key, database=self.database,
            container=self.name, connection_verify=self.stack.cosmos_verify, **client_options)

    def caller_client(self) -> Any:
        """An async client the test owns (table client, or an un-entered Cosmos client)."""
        if self.backend == "table":
            endpoint, credential = table_account(self.stack.table_connection_string)
            return TableClient(endpoint, self.name, credential=credential)
        return CosmosClient(self.stack.cosmos_endpoint, self.stack.cosmos_key,
                            connection_verify=self.stack.cosmos_verify)

    def around(self, client: Any) -> Any:
        """A store around the caller's client (`from_table_client` / `from_container`)."""
        if self.backend == "table":
            return AsyncTableIdempotencyStore.from_table_client(client)
        container = client.get_database_client(self.database).get_container_client(self.name)
        return AsyncCosmosIdempotencyStore.from_container(container)


@pytest.fixture(params=["table", "cosmos"])
def target(request: pytest.FixtureRequest, stack: Any) -> Iterator[Target]:
    name = f"t{uuid.uuid4().hex[:16]}"
    if request.param == "table":  # the store creates it (ensure_table, in the test's loop)
        service = request.getfixturevalue("table_service")
        yield Target("table", name, "", stack)
        service.delete_table(name)
        return
    database = request.getfixturevalue("cosmos_database")
    database.create_container(name, PartitionKey("/pk"), default_ttl=-1,
                              indexing_policy=record_indexing_policy("/pk"))
    yield Target("cosmos", name, database.id, stack)
    database.delete_container(name)


def run_with(target: Target, scenario: Callable[[Any], Awaitable[None]],
             **client_options: Any) -> None:
    """Build an owned store from endpoint + credential in a fresh event loop, run, close."""
    async def main() -> None:
        store = target.build(**client_options)
        try:
            if target.backend == "table":
                await store.ensure_table()
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


def ms(seconds: float) -> float:
    """A time as a marker keeps it (whole milliseconds), so a record reads back equal."""
    return round(seconds * 1000) / 1000


def marker(name: str, result: Any = None) -> IdempotencyRecord:
    now = ms(time.time())
    return IdempotencyRecord(key=DedupKey("ledger", name), state=RecordState.COMPLETED,
                             request_hash=request_hash(name), created_at=now, updated_at=now,
                             expires_at=ms(now + 3600), result=result, partition=PARTITION)


def same_record(stored: IdempotencyRecord | None, written: IdempotencyRecord) -> bool:
    return stored is not None and stored == written  # etag is not compared


# -- records ---------------------------------------------------------------------------
def test_a_record_round_trips_put_get_replace_delete(target):
    async def scenario(store: Any) -> None:
        record = marker("r", result={"n": 1}).evolve(state=RecordState.IN_PROGRESS,
                                                     lease_expires_at=ms(time.time() + 60))
        put = await store.put_record_if_absent(record)
        assert put.etag
        got = await store.get_record(PARTITION, record.id)
        assert same_record(got, record) and got.etag == put.etag
        with pytest.raises(RecordExistsError):
            await store.put_record_if_absent(record)

        done = put.evolve(state=RecordState.COMPLETED, lease_expires_at=None, result={"n": 2})
        replaced = await store.replace_record_if_unchanged(done)
        assert replaced.etag and replaced.etag != put.etag
        got = await store.get_record(PARTITION, record.id)
        assert same_record(got, done) and got.result == {"n": 2} and got.etag == replaced.etag
        with pytest.raises(RecordChangedError):  # the etag it had before the replace
            await store.replace_record_if_unchanged(put)
        with pytest.raises(RecordChangedError):
            await store.delete_record_if_unchanged(put)

        await store.delete_record_if_unchanged(replaced)
        assert await store.get_record(PARTITION, record.id) is None

    run_with(target, scenario)


# -- group commits -----------------------------------------------------------------------
def test_commit_group_commits_three_markers_and_the_business_write(target):
    async def scenario(store: Any) -> None:
        markers = [marker(f"e{n}", result={"balance": n}) for n in range(3)]
        committed = await store.commit_group(markers, [WriteOp("create", "balance", {"balance": 2})])
        assert [m.id for m in committed] == [m.id for m in markers]
        for written in markers:
            assert same_record(await store.get_record(PARTITION, written.id), written)
        first = await store.get_record(PARTITION, markers[0].id)
        assert committed[0].etag == first.etag  # the first marker comes back with its etag
        assert (await store.read_document(PARTITION, "balance")).body["balance"] == 2

    run_with(target, scenario)


def test_commit_group_names_the_second_marker_that_exists_and_writes_nothing(target):
    async def scenario(store: Any) -> None:
        markers = [marker(f"e{n}") for n in range(3)]
        earlier = await store.put_record_if_absent(markers[1].evolve(result="earlier"))
        with pytest.raises(RecordExistsError) as raised:
            await store.commit_group(markers, [WriteOp("create", "balance", {"balance": 1})])
        assert raised.value.index == 1 and raised.value.record_id == markers[1].id
        assert await store.get_record(PARTITION, markers[0].id) is None
        assert await store.get_record(PARTITION, markers[2].id) is None
        assert await store.read_document(PARTITION, "balance") is None
        kept = await store.get_record(PARTITION, markers[1].id)
        assert kept.result == "earlier" and kept.etag == earlier.etag

    run_with(target, scenario)


def test_commit_group_names_the_failed_business_write_and_writes_nothing(target):
    async def scenario(store: Any) -> None:
        [old] = await store.write_documents(PARTITION, [WriteOp("create", "balance", {"v": 1})])
        [now] = await store.write_documents(
            PARTITION, [WriteOp("replace", "balance", {"v": 2}, etag=old.etag)])
        markers = [marker(f"e{n}") for n in range(3)]
        with pytest.raises(OperationFailedError) as raised:
            await store.commit_group(markers, [
                WriteOp("create", "audit", {"v": 3}),
                WriteOp("replace", "balance", {"v": 3}, etag=old.etag),  # stale: 412
            ])
        assert raised.value.index == 1 and raised.value.status_code == 412
        assert all([await store.get_record(PARTITION, m.id) is None for m in markers])
        assert await store.read_document(PARTITION, "audit") is None
        balance = await store.read_document(PARTITION, "balance")
        assert balance.body["v"] == 2 and balance.etag == now.etag

    run_with(target, scenario)


# -- building and closing ------------------------------------------------------------------
def test_close_closes_the_client_the_store_created(target):
    async def scenario(store: Any) -> None:
        assert (await store.write_documents(PARTITION, [WriteOp("create", "d", {"v": 1})]))[0].etag
        await store.close()
        with pytest.raises(ValueError, match=CLOSED):
            await store.read_document(PARTITION, "d")

    run_with(target, scenario)


def test_async_with_closes_the_store_s_own_client(target):
    async def main() -> None:
        async with target.build() as store:
            if target.backend == "table":
                await store.ensure_table()
            await store.write_documents(PARTITION, [WriteOp("create", "d", {"v": 1})])
        with pytest.raises(ValueError, match=CLOSED):
            await store.read_document(PARTITION, "d")

    asyncio.run(main())


def test_from_connection_string_builds_a_store_that_owns_its_client(target):
    stack = target.stack
    if target.backend == "table":
        store = AsyncTableIdempotencyStore.from_connection_string(
            stack.table_connection_string, table_name=target.name)
    else:
        store = AsyncCosmosIdempotencyStore.from_connection_string(
            f"AccountEndpoint={stack.cosmos_endpoint};AccountKey={stack.cosmos_key};",
            database=target.database, container=target.name,
            connection_verify=stack.cosmos_verify)

    async def main() -> None:
        if isinstance(store, AsyncTableIdempotencyStore):
            await store.ensure_table()
        put = await store.put_record_if_absent(marker("r"))
        assert (await store.get_record(PARTITION, put.id)).etag == put.etag
        await store.close()
        with pytest.raises(ValueError, match=CLOSED):
            await store.get_record(PARTITION, put.id)

    asyncio.run(main())


def test_close_leaves_the_callers_client_open(target):
    async def main() -> None:
        client = target.caller_client()
        try:
            store = target.around(client)
            if target.backend == "table":
                await store.ensure_table()
            await store.write_documents(PARTITION, [WriteOp("create", "d", {"v": 1})])
            await store.close()
            assert (await store.read_document(PARTITION, "d")).body["v"] == 1  # still open
            again = target.around(client)  # and the caller can build more stores on it
            assert (await again.read_document(PARTITION, "d")).body["v"] == 1
        finally:
            await client.close()
        with pytest.raises(ValueError, match=CLOSED):  # closing it is the caller's
            await store.read_document(PARTITION, "d")

    asyncio.run(main())


def test_a_store_is_built_without_an_event_loop_and_without_a_request(stack):
    # Nothing listens on port 9: __init__ must not call out; the first request fails,
    # translated. The client options reach the client (Table: no retries, so it is quick).
    table_endpoint, credential = table_account(stack.table_connection_string)
    unreachable_table = table_endpoint.replace(table_endpoint.split("/")[2], "127.0.0.1:9", 1)
    stores = [
        AsyncTableIdempotencyStore(unreachable_table, credential, table_name="nowhere",
                                   retry_total=0),
        AsyncCosmosIdempotencyStore("https://127.0.0.1:9/", stack.cosmos_key, database="d",
                                    container="c", connection_verify=False, retry_total=0),
    ]

    async def main() -> None:
        for store in stores:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await store.get_record(PARTITION, "r")
            assert time.monotonic() - started < 2
            await store.close()

    asyncio.run(main())


def test_an_owned_cosmos_client_is_initialized_before_its_first_request(stack, cosmos_database):
    """The async Cosmos client reads the account (default consistency, endpoints) only in
    `__aenter__`; a store that owns its client does that once, before the first request, so
    every item request carries the account's consistency level (Session here)."""
    name = f"t{uuid.uuid4().hex[:16]}"
    cosmos_database.create_container(name, PartitionKey("/pk"), default_ttl=-1,
                                     indexing_policy=record_indexing_policy("/pk"))
    sent: list[tuple[str, str | None]] = []

    def hook(request: Any) -> None:
        sent.append((request.http_request.url,
                     request.http_request.headers.get("x-ms-consistency-level")))

    async def main() -> None:
        store = AsyncCosmosIdempotencyStore(
            stack.cosmos_endpoint, stack.cosmos_key, database=cosmos_database.id, container=name,
            connection_verify=stack.cosmos_verify, raw_request_hook=hook)
        try:
            assert sent == []  # nothing before the first request
            await asyncio.gather(*(store.write_documents(PARTITION, [WriteOp("create", f"d{n}",
                                                                             {"v": n})])
                                   for n in range(3)))
            assert await store.get_record(PARTITION, "d0") is None  # a document, not a record
        finally:
            await store.close()

    try:
        asyncio.run(main())
    finally:
        cosmos_database.delete_container(name)
    item_requests = [level for url, level in sent if "/docs" in url]
    assert len(item_requests) == 4
    assert set(item_requests) == {"Session"}
    assert sum(1 for url, _ in sent if url.rstrip("/").count("/") == 2) <= 2  # account read once
