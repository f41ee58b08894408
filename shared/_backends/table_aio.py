"""Table Storage backend on `azure.data.tables.aio`: the async variant of `TableIdempotencyStore`.

The requests are the sync store's (`TableMapping`); only sending them differs.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.credentials_async import AsyncTokenCredential
from azure.data.tables.aio import TableClient

from shared._backends.sdk_requests import async_store_call, send_request_async
from shared._backends.table_batch import Codec, submit_transaction_async
from shared._backends.table_mapping import BACKEND, TableMapping
from shared._core.exceptions import RecordExistsError
from shared._core.store import AsyncIdempotencyStore, StoreStep


class AsyncTableIdempotencyStore(TableMapping, AsyncIdempotencyStore):
    """Dedup records and business entities in one Azure Table, through the async SDK.

    Built like the sync store; `__init__` makes no request (`ensure_table` creates a missing
    table). `close`, and `async with store:`, close a client the store created, not a caller's.
    """

    name = "table"

    def __init__(self, endpoint: str, credential: AsyncTokenCredential | AzureNamedKeyCredential |
                 AzureSasCredential | None = None, *, table_name: str,
                 table_client: TableClient | None = None, batch_codec: Codec = "lean",
                 **client_options: Any) -> None:
        self._batch_codec = batch_codec
        self._owned: TableClient | None = None  # the client this store created, if any
        if table_client is None:
            table_client = self._owned = TableClient(endpoint, table_name, credential=credential,
                                                     **client_options)
        self._client = table_client

    @classmethod
    def from_connection_string(cls, conn_str: str, *, table_name: str, batch_codec: Codec = "lean",
                               **client_options: Any) -> AsyncTableIdempotencyStore:
        client = TableClient.from_connection_string(conn_str, table_name, **client_options)
        store = cls.from_table_client(client, batch_codec=batch_codec)
        store._owned = client  # closed with the store
        return store

    async def ensure_table(self) -> None:
        """Create the table if it is missing (local runs; in Azure, Bicep creates it)."""
        with contextlib.suppress(RecordExistsError):
            await async_store_call(BACKEND, self._client.create_table,
                                   on_status={409: lambda: RecordExistsError(self._client.table_name)})

    @staticmethod
    async def _submit(client: TableClient, batch: list[tuple[Any, ...]], *,
                      codec: Codec) -> list[Any]:
        return await submit_transaction_async(client, batch, codec=codec)  # looked up when sent

    async def perform(self, step: StoreStep) -> Any:
        return await send_request_async(BACKEND, self._client, self.request_for(step))

    async def close(self) -> None:
        """Close the client this store created; a caller's client stays open."""
        if self._owned is not None:
            await self._owned.close()

    async def __aenter__(self) -> AsyncTableIdempotencyStore:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()
