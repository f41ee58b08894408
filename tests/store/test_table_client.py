"""Who closes a Table client: the store closes the client it created, never the caller's
(on Azurite, as the async store's test does)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.data.tables import TableClient, TableServiceClient

from shared import TableIdempotencyStore
from shared._core.store import WriteOp
from tests.conftest import StackInfo

PARTITION = "p"


@pytest.fixture
def table(stack: StackInfo, table_service: TableServiceClient) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:16]}"
    table_service.create_table(name)
    yield name
    table_service.delete_table(name)


def closed(store: TableIdempotencyStore) -> bool:
    """True when the store's client refuses requests because it was closed."""
    try:
        store.read_document(PARTITION, "d")
    except ValueError as error:  # azure-core, on a request after close()
        return "closed" in str(error)
    return False


def test_close_leaves_the_callers_client_open(stack: StackInfo, table: str) -> None:
    client = TableClient.from_connection_string(stack.table_connection_string, table)
    store = TableIdempotencyStore.from_table_client(client)
    store.write_documents(PARTITION, [WriteOp("create", "d", {"v": 1})])
    store.close()
    document = store.read_document(PARTITION, "d")  # still open
    assert document is not None and document.body["v"] == 1
    again = TableIdempotencyStore(client.url, table_name=table, table_client=client)
    assert again.read_document(PARTITION, "d") is not None  # the caller builds more on it
    again.close()
    client.close()
    assert closed(store)  # closing it was the caller's


def test_close_closes_the_client_the_store_created(stack: StackInfo, table: str) -> None:
    store = TableIdempotencyStore.from_connection_string(stack.table_connection_string,
                                                         table_name=table)
    store.write_documents(PARTITION, [WriteOp("create", "d", {"v": 1})])
    store.close()
    assert closed(store)
