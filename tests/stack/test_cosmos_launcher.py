"""The Cosmos server launcher (tools/cosmos-server/launch.js), a test-stack compatibility layer.

Each gap is shown on the unpatched server first, so the patch is known to matter. Both
servers are started here, whatever the session's stack points at.
"""

from __future__ import annotations

import uuid

import pytest
from azure.cosmos import CosmosClient, PartitionKey
from azure.cosmos.exceptions import (
    CosmosBatchOperationError,
    CosmosHttpResponseError,
    CosmosResourceNotFoundError,
)

from local_stack import COSMOS_LOCAL_KEY, ServerProcess, free_port
from local_stack.servers import NODE_BIN, cosmos_server


def _database(server: ServerProcess):
    server.start()
    client = CosmosClient(f"https://127.0.0.1:{server.port}/", COSMOS_LOCAL_KEY,
                          connection_verify=False)
    return client.create_database_if_not_exists("d")


@pytest.fixture(scope="module")
def unpatched_container():
    port = free_port()
    server = ServerProcess("cosmosdb-server", [str(NODE_BIN / "cosmosdb-server"), "-p", str(port)],
                           port)
    try:
        yield _database(server).create_container_if_not_exists("c", PartitionKey("/pk"))
    finally:
        server.stop()


@pytest.fixture(scope="module")
def launcher():
    server = cosmos_server(free_port())
    try:
        yield server, _database(server)
    finally:
        server.stop()


@pytest.fixture
def patched_container(launcher):
    return launcher[1].create_container(f"l{uuid.uuid4().hex[:10]}", PartitionKey("/pk"))


def _stale_replace_batch(container, pk: str):
    container.create_item({"id": "acct", "pk": pk, "balance": 0})
    stale = container.read_item("acct", pk)
    container.replace_item("acct", {**stale, "balance": 1})
    batch = [("create", ({"id": "marker", "pk": pk},)),
             ("replace", ("acct", {"id": "acct", "pk": pk, "balance": 5}),
              {"if_match_etag": stale["_etag"]})]
    return container.execute_item_batch(batch, partition_key=pk)


def test_gap_unpatched_server_keeps_the_marker_of_a_failed_batch(unpatched_container):
    pk = uuid.uuid4().hex
    with pytest.raises(CosmosHttpResponseError):
        _stale_replace_batch(unpatched_container, pk)
    # Real Cosmos DB would have rolled the marker back:
    assert unpatched_container.read_item("marker", pk)["id"] == "marker"


def test_patched_failed_batch_leaves_nothing_and_reports_412(patched_container):
    pk = uuid.uuid4().hex
    with pytest.raises(CosmosBatchOperationError) as failure:
        _stale_replace_batch(patched_container, pk)
    statuses = [r["statusCode"] for r in failure.value.operation_responses]
    assert failure.value.error_index == 1 and statuses == [424, 412]
    with pytest.raises(CosmosResourceNotFoundError):
        patched_container.read_item("marker", pk)
    assert patched_container.read_item("acct", pk)["balance"] == 1


def test_gap_unpatched_server_fails_a_missing_point_read_with_500(unpatched_container):
    with pytest.raises(CosmosHttpResponseError) as failure:
        unpatched_container.read_item("missing", "nope")
    assert failure.value.status_code == 500


def test_patched_missing_point_read_is_404(patched_container):
    with pytest.raises(CosmosResourceNotFoundError):
        patched_container.read_item("missing", "nope")


def test_patched_duplicate_batch_fails_at_index_0_with_409_and_changes_nothing(patched_container):
    pk = uuid.uuid4().hex
    batch = [("create", ({"id": "marker", "pk": pk},)),
             ("create", ({"id": "order", "pk": pk, "v": 1},))]
    patched_container.execute_item_batch(batch, partition_key=pk)
    again = [("create", ({"id": "marker", "pk": pk},)),
             ("upsert", ({"id": "order", "pk": pk, "v": 2},))]
    with pytest.raises(CosmosBatchOperationError) as failure:
        patched_container.execute_item_batch(again, partition_key=pk)
    assert failure.value.error_index == 0
    assert failure.value.operation_responses[0]["statusCode"] == 409
    assert patched_container.read_item("order", pk)["v"] == 1


def test_gap_ttl_is_not_enforced_so_the_client_checks_expiry(launcher):
    """Gap 3: items with ttl never expire here. The dedup code checks the marker expiry (iX) on
    every read (tests/store/test_conformance.py::test_expired_record_is_taken_over...)."""
    container = launcher[1].create_container(f"l{uuid.uuid4().hex[:10]}", PartitionKey("/pk"),
                                                 default_ttl=-1)
    pk = uuid.uuid4().hex
    container.create_item({"id": "short", "pk": pk, "ttl": 1})
    import time

    time.sleep(1.5)
    assert container.read_item("short", pk)["id"] == "short"


def test_patched_server_keeps_connections_alive(launcher):
    """The original answers `Connection: close`: one TLS handshake per request."""
    import http.client
    import ssl

    connection = http.client.HTTPSConnection("127.0.0.1", launcher[0].port,
                                             context=ssl._create_unverified_context())
    connection.request("GET", "/")
    response = connection.getresponse()
    response.read()
    assert response.getheader("connection") == "keep-alive"
    connection.close()
