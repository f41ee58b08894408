"""Cosmos DB writes ask for `Prefer: return=minimal`, and the etag is still read after them.

The service then answers a point write with its status and headers (the `etag` among them)
and no item, and a transactional batch with each operation's status and `eTag` but no
`resourceBody` (the REST API's documented behaviour; the .NET SDK's
`EnableContentResponseOnWrite` / `EnableContentResponseOnOperations` send the same header).
The local server ignores the header and echoes the item anyway, so these tests make its
answers minimal at the client's transport (`MinimalAnswers`: the body of a point write's
answer dropped, `resourceBody` dropped from each operation of a batch answer) and check that
the store reads every etag it needs from what is left, and that the etags it read are the
ones the server holds (a conditional write under each succeeds, under an older one fails).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.pipeline.transport import AioHttpTransport, RequestsTransport
from azure.cosmos import CosmosClient, PartitionKey
from azure.cosmos.aio import CosmosClient as AsyncCosmosClient

from shared import CosmosIdempotencyStore, DedupKey
from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._core.exceptions import OperationFailedError, RecordChangedError
from shared._core.outbox import outgoing
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import WriteOp

PREFER = "Prefer"
MINIMAL = "return=minimal"
NOW = 1_800_000_000.0


class MinimalAnswers(RequestsTransport):
    """A requests transport that records each request's method and `Prefer` header, and
    answers a successful write that asked for `return=minimal` the way the service does."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[str, str, str | None]] = []  # (method, path, Prefer)

    def send(self, request: Any, **kwargs: Any) -> Any:
        response = super().send(request, **kwargs)
        prefer = request.headers.get(PREFER)
        path = request.url.split("?")[0]
        if "/docs" in path:
            self.seen.append((request.method, path, prefer))
        if prefer == MINIMAL and 200 <= response.status_code < 300:
            raw = response.internal_response
            raw._content = minimal_body(request, raw.content)
        return response

    def writes(self) -> list[tuple[str, str | None]]:
        return [(method, prefer) for method, _, prefer in self.seen if method != "GET"]


def minimal_body(request: Any, body: bytes) -> bytes:
    """What the service answers to a successful write that asked for `return=minimal`."""
    if request.headers.get("x-ms-cosmos-is-batch-request", "").lower() == "true":
        results = json.loads(body)
        for result in results:
            result.pop("resourceBody", None)
        return json.dumps(results).encode()
    return b""  # status and headers only


class AsyncMinimalAnswers(AioHttpTransport):
    """`MinimalAnswers` for the async SDK."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prefer: list[tuple[str, str | None]] = []  # (method, Prefer) of the writes

    async def send(self, request: Any, **kwargs: Any) -> Any:
        response = await super().send(request, **kwargs)
        prefer = request.headers.get(PREFER)
        if "/docs" in request.url and request.method != "GET":
            self.prefer.append((request.method, prefer))
        if prefer == MINIMAL and 200 <= response.status_code < 300:
            response._content = minimal_body(request, response.body())
            response._decompressed_content = True
        return response


@pytest.fixture
def minimal(stack, cosmos_database) -> Iterator[tuple[CosmosIdempotencyStore, MinimalAnswers]]:
    """A store on a fresh container, through its own client on the recording transport."""
    name = f"m{uuid.uuid4().hex[:16]}"
    cosmos_database.create_container(name, PartitionKey("/pk"), default_ttl=-1,
                                     indexing_policy=record_indexing_policy("/pk"))
    transport = MinimalAnswers()
    client = CosmosClient(stack.cosmos_endpoint, stack.cosmos_key,
                          connection_verify=stack.cosmos_verify, transport=transport)
    container = client.get_database_client(cosmos_database.id).get_container_client(name)
    try:
        yield CosmosIdempotencyStore.from_container(container, "/pk"), transport
    finally:
        client.close()
        cosmos_database.delete_container(name)


def record(name: str, **changes: Any) -> IdempotencyRecord:
    base = IdempotencyRecord(DedupKey("minimal", name), RecordState.IN_PROGRESS, "h" * 43, NOW, NOW,
                             expires_at=NOW + 3600, lease_expires_at=NOW + 60)
    return base.evolve(**changes)


def etag_on_server(store: CosmosIdempotencyStore, found: IdempotencyRecord) -> str | None:
    stored = store.get_record(found.partition_key, found.id)
    assert stored is not None
    return stored.etag


def test_point_writes_ask_for_minimal_answers_and_still_read_the_etag(minimal):
    store, transport = minimal
    put = store.put_record_if_absent(record("a"))
    assert put.etag is not None and put.etag == etag_on_server(store, put)
    done = store.replace_record_if_unchanged(put.evolve(state=RecordState.COMPLETED,
                                                        lease_expires_at=None))
    assert done.etag is not None and done.etag != put.etag
    assert done.etag == etag_on_server(store, done)
    with pytest.raises(RecordChangedError):  # the etag of the create is stale now
        store.replace_record_if_unchanged(put)
    store.delete_record_if_unchanged(done)  # under the etag the replace answered
    assert store.get_record(done.partition_key, done.id) is None
    # create, replace, the refused replace ask for it; a delete answers no item anyway
    assert transport.writes() == [("POST", MINIMAL), ("PUT", MINIMAL), ("PUT", MINIMAL),
                                  ("DELETE", None)]
    assert all(prefer is None for method, _, prefer in transport.seen if method == "GET")


def test_a_transactional_batch_asks_for_minimal_answers_and_still_reads_each_etag(minimal):
    store, transport = minimal
    key = DedupKey("minimal", "b")
    message = outgoing(key, "q", {"n": 1}, ordinal=0)
    marker = IdempotencyRecord(key, RecordState.COMPLETED, "h" * 43, NOW, NOW,
                               expires_at=NOW + 3600, partition="acct", outbox=(message,))
    written: list[Any] = []
    committed = store.commit(marker, [WriteOp("create", "balance", {"balanceCents": 5})],
                             written=written)
    (_, prefer) = transport.writes()[-1]
    assert prefer == MINIMAL
    assert committed.etag is not None and committed.etag == etag_on_server(store, committed)
    (balance,) = written
    assert balance.etag is not None
    assert balance.etag == store.read_document("acct", "balance").etag
    # the balance's etag is the server's: a replace under it commits, then it is stale
    updated = store.write_documents("acct", [WriteOp("replace", "balance", {"balanceCents": 9},
                                                     balance.etag)])
    assert updated[0].etag == store.read_document("acct", "balance").etag
    with pytest.raises(OperationFailedError):  # 412 on the replace
        store.write_documents("acct", [WriteOp("replace", "balance", {"balanceCents": 1},
                                               balance.etag)])
    # the marker's etag is the server's: recording the dispatch (a patch) under it succeeds
    cleared = store.record_dispatched(committed)
    assert cleared.outbox == () and cleared.etag == etag_on_server(store, cleared)
    assert transport.writes()[-1] == ("PATCH", MINIMAL)


def test_full_answers_are_one_option_away(stack, cosmos_database):
    """`minimal_responses=False`: no Prefer header; the etag is read as before."""
    name = f"f{uuid.uuid4().hex[:16]}"
    cosmos_database.create_container(name, PartitionKey("/pk"), default_ttl=-1)
    transport = MinimalAnswers()
    client = CosmosClient(stack.cosmos_endpoint, stack.cosmos_key,
                          connection_verify=stack.cosmos_verify, transport=transport)
    try:
        container = client.get_database_client(cosmos_database.id).get_container_client(name)
        store = CosmosIdempotencyStore.from_container(container, "/pk", minimal_responses=False)
        put = store.put_record_if_absent(record("c"))
        assert put.etag == etag_on_server(store, put)
        assert transport.writes() == [("POST", None)]
    finally:
        client.close()
        cosmos_database.delete_container(name)


def test_the_async_store_asks_for_minimal_answers_and_still_reads_the_etags(stack, cosmos_database):
    name = f"a{uuid.uuid4().hex[:16]}"
    cosmos_database.create_container(name, PartitionKey("/pk"), default_ttl=-1)
    sync_container = cosmos_database.get_container_client(name)

    def on_server(found: IdempotencyRecord) -> str | None:
        return sync_container.read_item(found.id, found.partition_key)["_etag"]

    async def scenario() -> None:
        transport = AsyncMinimalAnswers()
        async with AsyncCosmosClient(stack.cosmos_endpoint, stack.cosmos_key,
                                     connection_verify=stack.cosmos_verify,
                                     transport=transport) as client:
            container = client.get_database_client(cosmos_database.id).get_container_client(name)
            store = AsyncCosmosIdempotencyStore.from_container(container, "/pk")
            put = await store.put_record_if_absent(record("d"))
            assert put.etag is not None and put.etag == on_server(put)
            done = await store.replace_record_if_unchanged(put.evolve(
                state=RecordState.COMPLETED, lease_expires_at=None))
            assert done.etag is not None and done.etag == on_server(done)
            key = DedupKey("minimal", "e")
            marker = IdempotencyRecord(key, RecordState.COMPLETED, "h" * 43, NOW, NOW,
                                       expires_at=NOW + 3600, partition="acct",
                                       outbox=(outgoing(key, "q", {"n": 1}, ordinal=0),))
            committed = await store.commit(marker, [WriteOp("create", "balance", {"n": 1})])
            assert committed.etag is not None and committed.etag == on_server(committed)
            cleared = await store.record_dispatched(committed)
            assert cleared.etag is not None and cleared.etag == on_server(cleared)
            assert transport.prefer == [("POST", MINIMAL), ("PUT", MINIMAL), ("POST", MINIMAL),
                                        ("PATCH", MINIMAL)]

    try:
        asyncio.run(scenario())
    finally:
        cosmos_database.delete_container(name)


class _Answer(dict[str, Any]):
    """An SDK answer: an item (maybe empty) with its response headers."""

    def __init__(self, item: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__(item)
        self.headers = headers

    def get_response_headers(self) -> dict[str, str]:
        return self.headers


def test_server_time_reads_the_date_header_and_falls_back_to_the_items_ts():
    from shared._backends.cosmos import server_time

    date = "Sun, 06 Nov 1994 08:49:37 GMT"  # RFC 9110's example: 784111777
    assert server_time(_Answer({}, {"date": date})) == 784111777.5
    assert server_time(_Answer({}, {"Date": date})) == 784111777.5
    assert server_time(_Answer({}, {"date": date})) == 784111777.5  # the cached answer, the same
    assert server_time(_Answer({"_ts": 1000}, {"date": "not a date"})) == 1000.5
    assert server_time(_Answer({"_ts": True}, {})) is None
    assert server_time({"_ts": 7}) == 7.5
