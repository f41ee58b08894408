"""The indexing policies on the local Cosmos server: created as declared, queries still work.

The local server (@vercel/cosmosdb-server) stores and returns a container's policy but does
not enforce it: a filter on an excluded path still answers (it scans). So the server proves
the create request and the queries, and tests/infra/test_infra_cosmos_indexing.py (not the
server) is what catches a query on a path the policy leaves out.
"""

from __future__ import annotations

import uuid

from functions.services import real_stores
from functions.settings import COSMOS_CONTAINERS, COSMOS_INDEXING, Settings
from replay.stores import document_lister
from shared import DedupKey, Idempotency, IdempotencyConfig, request_hash
from shared._backends import CosmosIdempotencyStore


def test_local_creation_gives_every_container_its_policy_and_the_sweep_and_listing_work(
        stack, cosmos_client):
    database = f"ix{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env({
        "DEDUP_BACKEND": "cosmos", "TABLE_CONNECTION_STRING": stack.table_connection_string,
        "COSMOS_ENDPOINT": stack.cosmos_endpoint, "COSMOS_KEY": stack.cosmos_key,
        "COSMOS_DATABASE": database, "COSMOS_VERIFY_TLS": "true" if stack.cosmos_verify else "false",
        "NOTIFICATION_API_URL": "http://127.0.0.1:9/unused"})
    try:
        stores = real_stores(settings)
        for name in COSMOS_CONTAINERS:
            properties = cosmos_client.get_database_client(database).get_container_client(name).read()
            assert properties["indexingPolicy"] == COSMOS_INDEXING[name], name
        ledger = stores("ledger")
        assert isinstance(ledger, CosmosIdempotencyStore)
        now = [1000.0]
        idem = Idempotency(ledger, config=IdempotencyConfig(clock=lambda: now[0]))
        idem.claim(DedupKey("ix", "stuck"), request_hash("x"))
        idem.run(DedupKey("ix", "done"), request_hash("x"), lambda: 1)
        now[0] += 10 * 24 * 3600  # past the lease and the default TTL
        assert [r.key.key for r in ledger.iter_records(in_progress_before=now[0])] == ["stuck"]
        assert {r.key.key for r in ledger.iter_records(expired_before=now[0])} == {"done", "stuck"}
        listed = list(document_lister(ledger)(None))
        partition = listed[0].partition
        assert listed and all(d.partition == partition
                              for d in document_lister(ledger)(partition))
    finally:
        cosmos_client.delete_database(database)
