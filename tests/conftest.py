"""Shared fixtures: the real local servers, and fresh stores on them.

The session starts Azurite and the Cosmos-compatible server on free loopback
ports. To run the same suites against the Cosmos DB emulator or an Azure
account, and against Azure Table Storage, set:

    IDEMPOTENCY_TEST_COSMOS_ENDPOINT, IDEMPOTENCY_TEST_COSMOS_KEY
    IDEMPOTENCY_TEST_TABLE_CONNECTION_STRING
    IDEMPOTENCY_TEST_QUEUE_CONNECTION_STRING (the Storage queue tests)
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import urllib3
from azure.cosmos import CosmosClient, PartitionKey
from azure.data.tables import TableServiceClient

from local_stack import LocalStack, free_port
from local_stack.servers import azurite_queues, queue_connection_string
from shared._backends import (
    CosmosIdempotencyStore,
    IdempotencyStore,
    InMemoryIdempotencyStore,
    TableIdempotencyStore,
)
from shared._backends.cosmos_indexing import record_indexing_policy

# `function_app` validates its settings on import, as under the host: tests run with the
# committed sample settings (each test that needs other values builds its own Settings).
_SAMPLE = json.loads((Path(__file__).parent.parent / "local.settings.sample.json").read_text())
for _name, _value in _SAMPLE["Values"].items():
    if _value:  # an empty APPLICATIONINSIGHTS_CONNECTION_STRING would break the exporter's tests
        os.environ.setdefault(_name, _value)

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)

BACKENDS = ("table", "cosmos")


@dataclass
class StackInfo:
    table_connection_string: str
    cosmos_endpoint: str
    cosmos_key: str
    cosmos_verify: bool
    stack: LocalStack | None  # None when both point at external servers

    def app_settings(self) -> dict[str, str]:
        """The app settings that point the app's stores at these servers."""
        return {"TABLE_CONNECTION_STRING": self.table_connection_string,
                "COSMOS_ENDPOINT": self.cosmos_endpoint, "COSMOS_KEY": self.cosmos_key,
                "COSMOS_VERIFY_TLS": "true" if self.cosmos_verify else "false"}


@pytest.fixture(scope="session")
def stack() -> Iterator[StackInfo]:
    table_env = os.environ.get("IDEMPOTENCY_TEST_TABLE_CONNECTION_STRING")
    cosmos_env = os.environ.get("IDEMPOTENCY_TEST_COSMOS_ENDPOINT")
    local = None if (table_env and cosmos_env) else LocalStack()
    if local is not None:
        local.__enter__()
    try:
        yield StackInfo(
            table_connection_string=table_env or local.table_connection_string,
            cosmos_endpoint=cosmos_env or local.cosmos_endpoint,
            cosmos_key=os.environ.get("IDEMPOTENCY_TEST_COSMOS_KEY", "")
            if cosmos_env else local.environment()["COSMOS_KEY"],
            cosmos_verify=os.environ.get("IDEMPOTENCY_TEST_COSMOS_VERIFY", "true") == "true"
            if cosmos_env else False,
            stack=local,
        )
    finally:
        if local is not None:
            local.__exit__(None, None, None)


@pytest.fixture(scope="session")
def queue_service() -> Iterator[str]:
    """Azurite's queue service, started for the tests that ask for it: its connection string.
    IDEMPOTENCY_TEST_QUEUE_CONNECTION_STRING points the same tests at an Azure Storage account."""
    external = os.environ.get("IDEMPOTENCY_TEST_QUEUE_CONNECTION_STRING")
    if external:
        yield external
        return
    server = azurite_queues(free_port())
    server.start()
    try:
        yield queue_connection_string(server.port)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cosmos_client(stack: StackInfo) -> Iterator[CosmosClient]:
    client = CosmosClient(stack.cosmos_endpoint, stack.cosmos_key,
                          connection_verify=stack.cosmos_verify)
    yield client
    client.close()


@pytest.fixture(scope="session")
def cosmos_database(cosmos_client: CosmosClient):
    name = f"test-{uuid.uuid4().hex[:8]}"
    database = cosmos_client.create_database_if_not_exists(name)
    yield database
    cosmos_client.delete_database(name)


@pytest.fixture(scope="session")
def table_service(stack: StackInfo) -> TableServiceClient:
    return TableServiceClient.from_connection_string(stack.table_connection_string)


StoreFactory = Callable[..., IdempotencyStore]


@pytest.fixture
def make_store(stack: StackInfo, cosmos_database, table_service) -> Iterator[StoreFactory]:
    """Build a store on a fresh table / container so tests never see each other's data."""
    created: list[tuple[str, str]] = []

    def factory(backend: str, *, partition_key_path: str = "/pk") -> IdempotencyStore:
        if backend == "memory":
            return InMemoryIdempotencyStore()
        name = f"t{uuid.uuid4().hex[:16]}"
        created.append((backend, name))
        if backend == "table":
            table_service.create_table(name)
            return TableIdempotencyStore.from_connection_string(
                stack.table_connection_string, table_name=name)
        container = cosmos_database.create_container(
            name, PartitionKey(partition_key_path), default_ttl=-1,
            indexing_policy=record_indexing_policy(partition_key_path))
        return CosmosIdempotencyStore.from_container(container, partition_key_path)

    yield factory
    for backend, name in created:
        try:
            if backend == "table":
                table_service.delete_table(name)
            else:
                cosmos_database.delete_container(name)
        except Exception:
            pass


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store(make_store: StoreFactory, backend: str) -> IdempotencyStore:
    return make_store(backend)


class FakeClock:
    """A clock the tests move by hand, so leases and TTLs expire without sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
