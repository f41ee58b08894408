"""A Cosmos account with more than one write region is refused when a store is built (the async
store: on its first request), unless the caller accepts it by name; and the check costs no
request of its own.

The accounts are recorded answers of the account read (`GET /`, the shape the service returns,
for a fictional account in two regions: one with a single write region, one with writes in
both). A transport sends every request to the local Cosmos server, whichever regional host the
SDK picked from the account, and answers the account read with the recording: the SDK parses it
as it would Azure's, and everything else (containers, items) is the real local server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from azure.core.pipeline.transport import AioHttpTransport, RequestsTransport
from azure.cosmos import PartitionKey

from functions.services import RealAsyncStores, real_stores
from shared import DedupKey, Idempotency, IdempotencyError, request_hash
from shared._backends import CosmosIdempotencyStore
from shared._backends.cosmos import EVENT_MULTI_REGION_WRITES
from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._core.exceptions import ConfigurationError, MultiRegionWritesError
from tests.functions.conftest import settings_for

ACCOUNTS = Path(__file__).parent / "accounts"
SINGLE_WRITE = (ACCOUNTS / "single_write_region.json").read_bytes()
MULTI_WRITE = (ACCOUNTS / "multi_write_regions.json").read_bytes()
# The account's global endpoint, as a user would configure it; the transport sends it home.
GLOBAL_ENDPOINT = "https://idemsample.documents.azure.com:443/"


class Route:
    """Which requests go to the local Cosmos server (the account's hosts, and the local
    server's own address), and which of them is the account read."""

    def __init__(self, local_endpoint: str) -> None:
        self.netloc = urlsplit(local_endpoint).netloc

    def __call__(self, request: Any) -> bool:
        """Send a Cosmos request to the local server; True when it reads the account. Other
        requests (Table Storage, in the app's test) pass unchanged."""
        parts = urlsplit(request.url)
        if parts.netloc != self.netloc and not (parts.hostname or "").endswith(".documents.azure.com"):
            return False
        request.url = urlunsplit(("https", self.netloc, parts.path, parts.query, ""))
        return request.method == "GET" and parts.path in ("", "/")


class RecordedAccount(RequestsTransport):
    """The local Cosmos server, answering the account read with a recorded account."""

    def __init__(self, local_endpoint: str, account: bytes, **kwargs: Any) -> None:
        super().__init__(connection_verify=False, **kwargs)
        self.route = Route(local_endpoint)
        self.account = account
        self.account_reads = 0

    def send(self, request: Any, **kwargs: Any) -> Any:
        account_read = self.route(request)
        response = super().send(request, **kwargs)
        if account_read:
            self.account_reads += 1
            response.internal_response._content = self.account  # requests' body cache
        return response


class AsyncRecordedAccount(AioHttpTransport):
    """`RecordedAccount` for the async SDK."""

    def __init__(self, local_endpoint: str, account: bytes, **kwargs: Any) -> None:
        super().__init__(connection_verify=False, **kwargs)
        self.route = Route(local_endpoint)
        self.account = account
        self.account_reads = 0

    async def send(self, request: Any, **kwargs: Any) -> Any:
        account_read = self.route(request)
        response = await super().send(request, **kwargs)
        if account_read:
            self.account_reads += 1
            response._content = self.account  # the body azure-core loaded (not streamed)
        return response


@pytest.fixture
def container_name(cosmos_database) -> str:
    name = f"t{uuid.uuid4().hex[:16]}"
    cosmos_database.create_container(name, PartitionKey("/pk"), default_ttl=-1,
                                     indexing_policy=record_indexing_policy("/pk"))
    return name


def _store(stack, cosmos_database, container: str, account: bytes, **options: Any
           ) -> tuple[CosmosIdempotencyStore, RecordedAccount]:
    transport = RecordedAccount(stack.cosmos_endpoint, account)
    store = CosmosIdempotencyStore(
        GLOBAL_ENDPOINT, stack.cosmos_key, database=cosmos_database.id, container=container,
        connection_verify=stack.cosmos_verify, transport=transport, retry_total=0, **options)
    return store, transport


def _processes_one_message(store: Any) -> None:
    outcome = Idempotency(store).run(DedupKey("c", uuid.uuid4().hex), request_hash({"n": 1}),
                                     lambda: "done")
    assert outcome.result == "done"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith(EVENT_MULTI_REGION_WRITES)]


def test_the_recorded_multi_write_account_is_refused_with_the_setting_and_the_fix(
        stack, cosmos_database, container_name):
    with pytest.raises(MultiRegionWritesError) as raised:
        _store(stack, cosmos_database, container_name, MULTI_WRITE)
    error = raised.value
    assert isinstance(error, IdempotencyError)
    assert error.regions == ("West Europe", "North Europe")
    message = str(error)
    assert "2 region(s): West Europe, North Europe" in message
    assert "enableMultipleWriteLocations=true" in message  # the setting
    assert "--enable-multiple-write-locations false" in message  # the fix
    assert "accept_duplicates_across_write_regions=True" in message  # the opt-in, by name
    assert "last-writer-wins" in message  # why


def test_the_recorded_single_write_account_with_read_regions_is_accepted_silently(
        stack, cosmos_database, container_name, caplog):
    caplog.set_level(logging.WARNING)
    store, transport = _store(stack, cosmos_database, container_name, SINGLE_WRITE)
    try:
        _processes_one_message(store)  # on the local server, through the account's regional host
    finally:
        store.close()
    assert transport.account_reads >= 1
    assert _warnings(caplog) == []


def test_the_multi_write_account_runs_when_accepted_by_name_with_a_warning(
        stack, cosmos_database, container_name, caplog):
    caplog.set_level(logging.WARNING)
    store, _ = _store(stack, cosmos_database, container_name, MULTI_WRITE,
                      accept_duplicates_across_write_regions=True)
    try:
        _processes_one_message(store)
    finally:
        store.close()
    [warning] = _warnings(caplog)
    assert "West Europe,North Europe" in warning.getMessage()
    assert "accept_duplicates_across_write_regions=True" in warning.getMessage()
    assert warning.write_regions == "West Europe,North Europe"  # type: ignore[attr-defined]


def test_the_check_reads_what_the_client_read_and_makes_no_request(stack, cosmos_database,
                                                                    container_name, monkeypatch):
    """The sync client reads the account in its constructor; the store reads what it kept: a
    store around a caller's container reads the account no more, and a store that builds its
    client reads it once, in the client's constructor. (Counted at the SDK's account read:
    its background health checks also GET the root, at times of their own.)"""
    from azure.cosmos import CosmosClient
    from azure.cosmos._cosmos_client_connection import CosmosClientConnection

    reads: list[str] = []
    account_read = CosmosClientConnection.GetDatabaseAccount

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append("read")
        return account_read(self, *args, **kwargs)

    monkeypatch.setattr(CosmosClientConnection, "GetDatabaseAccount", counted)
    client = CosmosClient(GLOBAL_ENDPOINT, stack.cosmos_key, connection_verify=stack.cosmos_verify,
                          transport=RecordedAccount(stack.cosmos_endpoint, MULTI_WRITE))
    try:
        assert len(reads) == 1
        container = client.get_database_client(cosmos_database.id).get_container_client(
            container_name)
        with pytest.raises(MultiRegionWritesError):
            CosmosIdempotencyStore.from_container(container)
        CosmosIdempotencyStore.from_container(container, accept_duplicates_across_write_regions=True)
        assert len(reads) == 1
    finally:
        client.close()
    reads.clear()
    store = CosmosIdempotencyStore(GLOBAL_ENDPOINT, stack.cosmos_key, database=cosmos_database.id,
                                   container=container_name, connection_verify=stack.cosmos_verify,
                                   transport=RecordedAccount(stack.cosmos_endpoint, SINGLE_WRITE))
    store.close()
    assert len(reads) == 1  # the client's own, in its constructor


def test_the_local_server_is_a_single_write_account(stack, cosmos_database, container_name,
                                                    caplog):
    caplog.set_level(logging.WARNING)
    store = CosmosIdempotencyStore(stack.cosmos_endpoint, stack.cosmos_key,
                                   database=cosmos_database.id, container=container_name,
                                   connection_verify=stack.cosmos_verify)
    try:
        _processes_one_message(store)
    finally:
        store.close()

    async def main() -> None:
        async with AsyncCosmosIdempotencyStore(
                stack.cosmos_endpoint, stack.cosmos_key, database=cosmos_database.id,
                container=container_name, connection_verify=stack.cosmos_verify) as store:
            assert await store.get_record("p", "absent") is None

    asyncio.run(main())
    assert _warnings(caplog) == []


def test_the_async_store_refuses_the_multi_write_account_on_its_first_request(
        stack, cosmos_database, container_name, caplog):
    caplog.set_level(logging.WARNING)

    async def build(account: bytes, **options: Any
                    ) -> tuple[AsyncCosmosIdempotencyStore, AsyncRecordedAccount]:
        transport = AsyncRecordedAccount(stack.cosmos_endpoint, account)
        store = AsyncCosmosIdempotencyStore(
            GLOBAL_ENDPOINT, stack.cosmos_key, database=cosmos_database.id,
            container=container_name, connection_verify=stack.cosmos_verify, transport=transport,
            retry_total=0, **options)
        return store, transport

    async def main() -> None:
        refused, transport = await build(MULTI_WRITE)
        assert transport.account_reads == 0  # __init__ makes no request
        try:
            for _ in range(2):  # refused on every request, not only the first
                with pytest.raises(MultiRegionWritesError, match="enableMultipleWriteLocations"):
                    await refused.get_record("p", "r")
            assert transport.account_reads == 1  # the client's own read, once
        finally:
            await refused.close()
        for account, options in ((SINGLE_WRITE, {}),
                                 (MULTI_WRITE, {"accept_duplicates_across_write_regions": True})):
            store, _ = await build(account, **options)
            try:
                assert await store.get_record("p", "r") is None
            finally:
                await store.close()

    asyncio.run(main())
    assert len(_warnings(caplog)) == 1  # the accepted multi-write account only


def test_the_app_setting_names_the_risk_and_reaches_every_cosmos_store(stack, caplog):
    """COSMOS_ACCEPT_DUPLICATES_ACROSS_WRITE_REGIONS: off by default (the app refuses the
    account when it builds its stores), on: the stores run with the warning."""
    caplog.set_level(logging.WARNING)
    refused = settings_for(stack, "cosmos")
    assert refused.cosmos_accept_duplicates_across_write_regions is False
    factory = real_stores(refused, transport=RecordedAccount(stack.cosmos_endpoint, MULTI_WRITE))
    with pytest.raises(MultiRegionWritesError):
        factory("orders")
    accepted = settings_for(stack, "cosmos", COSMOS_ACCEPT_DUPLICATES_ACROSS_WRITE_REGIONS="true")
    assert accepted.cosmos_accept_duplicates_across_write_regions is True
    factory = real_stores(accepted, transport=RecordedAccount(stack.cosmos_endpoint, MULTI_WRITE))
    factory("orders")
    factory("ledger")
    assert len(_warnings(caplog)) == 2

    async def main() -> None:
        stores = RealAsyncStores(refused, transport=AsyncRecordedAccount(
            stack.cosmos_endpoint, MULTI_WRITE))
        try:
            with pytest.raises(MultiRegionWritesError):
                await stores("orders").get_record("p", "r")
        finally:
            await stores.aclose()

    asyncio.run(main())


def test_the_recordings_are_what_the_sdk_parses_as_one_and_two_write_regions():
    """The recordings hold what the check reads (the guard against a recording that proves
    nothing): the flag and the writable locations, in the service's field names."""
    single, multi = json.loads(SINGLE_WRITE), json.loads(MULTI_WRITE)
    assert (single["enableMultipleWriteLocations"], len(single["writableLocations"]),
            len(single["readableLocations"])) == (False, 1, 2)
    assert (multi["enableMultipleWriteLocations"], len(multi["writableLocations"])) == (True, 2)


class NotAContainer:
    """A container lookalike without the SDK's client connection."""

    id = "lookalike"


def test_a_container_the_account_check_cannot_read_is_refused_naming_the_fix():
    """No silent skip of the write-region check: a container without the SDK's connection is
    refused when the store is built (the async store: on its first request)."""
    with pytest.raises(ConfigurationError, match="not an azure-cosmos ContainerProxy"):
        CosmosIdempotencyStore.from_container(NotAContainer())
    store = AsyncCosmosIdempotencyStore.from_container(NotAContainer())
    with pytest.raises(ConfigurationError, match="InMemoryIdempotencyStore"):
        asyncio.run(store.get_record("p", "r"))
