"""A store outage raises the retriable error: never read as "not a duplicate"."""

from __future__ import annotations

import pytest
from azure.cosmos import CosmosClient, PartitionKey

from local_stack import AZURITE_KEY, COSMOS_LOCAL_KEY, LocalStack, free_port
from shared import CosmosIdempotencyStore, DedupKey, Idempotency, TableIdempotencyStore, request_hash
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._core.exceptions import StoreUnavailableError


def _closed_port_store(backend: str):
    port = free_port()
    if backend == "table":
        conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
                f"TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
        return TableIdempotencyStore.from_connection_string(conn, table_name="dedup", retry_total=0)
    return CosmosIdempotencyStore(f"https://127.0.0.1:{port}/", COSMOS_LOCAL_KEY, database="d",
                                  container="c", connection_verify=False)


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_closed_port_raises_store_unavailable_and_never_runs_the_handler(backend):
    calls = []
    with pytest.raises(StoreUnavailableError):
        store = _closed_port_store(backend)
        Idempotency(store).run(DedupKey("c", "k"), request_hash("x"), lambda: calls.append(1))
    assert calls == []


def test_servers_stopped_mid_run_raise_store_unavailable_then_recover():
    """Both servers stop after the stores were built (an outage for a stretch)."""
    with LocalStack() as stack:
        client = CosmosClient(stack.cosmos_endpoint, COSMOS_LOCAL_KEY, connection_verify=False,
                              retry_total=0)

        def cosmos_container():
            db = client.create_database_if_not_exists("d")
            return db.create_container_if_not_exists(
                "c", PartitionKey("/pk"), default_ttl=-1, indexing_policy=record_indexing_policy("/pk"))

        table = TableIdempotencyStore.from_connection_string(
            stack.table_connection_string, table_name="dedup", create_table=True, retry_total=0)
        cosmos = CosmosIdempotencyStore.from_container(cosmos_container())
        stores = {"table": table, "cosmos": cosmos}
        for store in stores.values():
            Idempotency(store).run(DedupKey("c", "before"), request_hash("x"), lambda: 1)

        stack.azurite.stop()
        stack.cosmos.stop()
        calls = []
        for name, store in stores.items():
            with pytest.raises(StoreUnavailableError):
                Idempotency(store).run(DedupKey("c", "during"), request_hash("x"),
                                       lambda: calls.append(1))
            with pytest.raises(StoreUnavailableError):  # a duplicate check must not say "new"
                Idempotency(store).run(DedupKey("c", "before"), request_hash("x"),
                                       lambda: calls.append(1))
            assert calls == [], name

        stack.azurite.start()
        stack.cosmos.start()
        table.ensure_table()  # in-memory servers come back empty
        cosmos_container()
        for store in stores.values():
            outcome = Idempotency(store).run(DedupKey("c", "after"), request_hash("x"), lambda: 2)
            assert outcome.result == 2
