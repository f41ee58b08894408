"""Cosmos DB backend on `azure.cosmos.aio`: the async variant of `CosmosIdempotencyStore`.

The requests are the sync store's (`CosmosMapping`); only sending them differs.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from azure.cosmos.aio import ContainerProxy, CosmosClient

from shared._backends.cosmos import (
    BACKEND,
    CosmosMapping,
    cached_account,
    check_write_regions,
    sdk_connection,
)
from shared._backends.sdk_requests import async_store_call, send_request_async
from shared._core.store import AsyncIdempotencyStore, StoreStep


class AsyncCosmosIdempotencyStore(CosmosMapping, AsyncIdempotencyStore):
    """Dedup records and business documents in one Cosmos container, through the async SDK.

    Built like the sync store. `__init__` makes no request: a client the store creates is
    initialized (the SDK's `__aenter__`) on the first request or `async with store:`, and
    `close` closes it; a container passed to `from_container` stays its caller's, to enter
    and close. The account is checked then too: a multi-write one is refused
    (MultiRegionWritesError, on every request until the account changes) unless
    `accept_duplicates_across_write_regions`.
    """

    name = "cosmos"

    def __init__(self, endpoint: str, credential: Any = None, *, database: str, container: str,
                 partition_key_path: str = "/pk", container_client: ContainerProxy | None = None,
                 minimal_responses: bool = True,
                 accept_duplicates_across_write_regions: bool = False,
                 **client_options: Any) -> None:
        self._configure(partition_key_path, minimal_responses)
        self._cosmos: CosmosClient | None = None  # the client this store owns, if any
        self._accept_multi_region = accept_duplicates_across_write_regions
        self._entered = False  # an owned client initialized
        self._initialized = False  # and the account checked
        self._initializing = asyncio.Lock()  # binds to a loop on first contention only
        if container_client is None:
            self._cosmos = CosmosClient(endpoint, credential, **client_options)  # no I/O here
            container_client = (self._cosmos.get_database_client(database)
                                .get_container_client(container))
        self._container = container_client

    @classmethod
    def from_connection_string(cls, conn_str: str, *, database: str, container: str,
                               partition_key_path: str = "/pk",
                               accept_duplicates_across_write_regions: bool = False,
                               **client_options: Any) -> AsyncCosmosIdempotencyStore:
        client = CosmosClient.from_connection_string(conn_str, **client_options)
        store = cls.from_container(
            client.get_database_client(database).get_container_client(container),
            partition_key_path,
            accept_duplicates_across_write_regions=accept_duplicates_across_write_regions)
        store._cosmos = client  # initialized on first use and closed with the store
        return store

    async def _ready(self) -> None:
        """Once: enter an owned client, as `async with CosmosClient(...)` would, then check the
        account it read (`check_write_regions`)."""
        if self._initialized:
            return
        async with self._initializing:
            if not self._initialized:
                if self._cosmos is not None and not self._entered:
                    await async_store_call(BACKEND, self._cosmos.__aenter__)
                    self._entered = True
                connection = sdk_connection(self._container)
                account = cached_account(connection)
                if account is None:  # a caller's client not entered yet: one account read
                    account = await async_store_call(BACKEND, connection.GetDatabaseAccount)
                check_write_regions(account, endpoint=str(getattr(connection, "url_connection", "")),
                                    accept=self._accept_multi_region)
                self._initialized = True

    async def perform(self, step: StoreStep) -> Any:
        await self._ready()
        return await send_request_async(BACKEND, self._container, self.request_for(step))

    async def close(self) -> None:
        """Close the client this store created; a caller's client stays open."""
        if self._cosmos is not None:
            await self._cosmos.close()

    async def __aenter__(self) -> AsyncCosmosIdempotencyStore:
        await self._ready()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()
