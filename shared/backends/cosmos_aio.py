"""Cosmos DB backend on `azure.cosmos.aio`: the async variant of `CosmosIdempotencyStore`.

Every request is built once, by the mapping it shares with the sync store
(`CosmosMapping`: items, batches, the store-contract errors); only sending it
differs (`send_request_async`, awaited on a ready client).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from azure.cosmos.aio import ContainerProxy, CosmosClient

from shared.backends.cosmos import BACKEND, CosmosMapping, cached_account, check_write_regions
from shared.backends.sdk_requests import async_store_call, send_request_async
from shared.core.store import AsyncIdempotencyStore, StoreStep


class AsyncCosmosIdempotencyStore(CosmosMapping, AsyncIdempotencyStore):
    """Dedup records and business documents in one Cosmos container, through the async SDK.

    Build it like the sync store: from the account endpoint and a credential
    (an `AsyncTokenCredential` in Azure, or the account key), from a
    connection string, or around an existing `azure.cosmos.aio` container.
    A client the store creates is its own: it is initialized (the SDK's
    `__aenter__`, which reads the account) on the first request, not in
    `__init__`, and `close` closes it. A container passed to `from_container`
    stays its caller's, who initializes (`async with CosmosClient(...)`) and
    closes it. `async with store:` initializes and closes an owned client.
    `minimal_responses` as for the sync store.

    The account is checked on that first request (or `async with`), not in `__init__`,
    which makes no request: one with more than one write region is refused then
    (MultiRegionWritesError, on every request until the account changes), from the
    properties the client read when it was entered; `accept_duplicates_across_write_regions`
    as for the sync store.
    """

    name = "cosmos"

    def __init__(self, endpoint: str, credential: Any = None, *, database: str, container: str,
                 partition_key_path: str = "/pk", container_client: ContainerProxy | None = None,
                 minimal_responses: bool = True,
                 accept_duplicates_across_write_regions: bool = False,
                 **client_options: Any) -> None:
        self._minimal_responses(minimal_responses)
        if not partition_key_path.startswith("/") or "/" in partition_key_path[1:]:
            raise ValueError("partition_key_path must be a top-level path such as '/pk'")
        self._pk_field = partition_key_path[1:]
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
        """Once: initialize an owned client (account read, session consistency), as
        `async with CosmosClient(...)` would (a caller's client is the caller's to initialize),
        then check the account it read (`check_write_regions`)."""
        if self._initialized:
            return
        async with self._initializing:
            if not self._initialized:
                if self._cosmos is not None and not self._entered:
                    await async_store_call(BACKEND, self._cosmos.__aenter__)
                    self._entered = True
                connection: Any = getattr(self._container, "client_connection", None)
                if connection is not None:  # None: not an SDK container (a test's stand-in)
                    account = cached_account(connection)
                    if account is None:  # a caller's client not entered yet: one account read
                        account = await async_store_call(BACKEND, connection.GetDatabaseAccount)
                    check_write_regions(account,
                                        endpoint=str(getattr(connection, "url_connection", "")),
                                        accept=self._accept_multi_region)
                self._initialized = True

    async def perform(self, step: StoreStep) -> Any:
        """One step's request on a ready client; its failure translated by `translate_error`."""
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
