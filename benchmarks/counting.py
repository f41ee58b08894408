"""Exact store request counting through the azure-core pipeline.

Table Storage (`azure-data-tables`): the client honours azure-core's
`per_call_policies` and `per_retry_policies`, so a `SansIOHTTPPolicy` in each
list counts logical calls and wire attempts (they differ only when the SDK
retried).

Cosmos DB (`azure-cosmos` 4.17): the client builds its own policy list and
does *not* honour `per_call_policies` / `per_retry_policies`; worse, it passes
them on to every request as options, and `requests` then fails with
`TypeError: Session.request() got an unexpected keyword argument
'per_call_policies'`. It does honour `transport=`, so requests are counted by
a transport that wraps the default `RequestsTransport`: every HTTP request the
SDK sends, retries included, passes through its `send` exactly once.

Requests are classified as `data` (entities/documents, entity-group
transactions, transactional batches) or `meta` (account, database, table and
container management, which the SDKs issue on first use and on their own
refresh timers). Store requests per message are data requests.

Outgoing messages are not sent anywhere: a costed dispatcher
(`CostedDispatcher`, `AsyncCostedDispatcher`) counts the sends a Service Bus
dispatcher would make and waits one round trip for each (`SendTally`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from azure.core.pipeline import PipelineRequest
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.core.pipeline.transport import AioHttpTransport, RequestsTransport
from azure.cosmos import CosmosClient
from azure.cosmos.aio import CosmosClient as AsyncCosmosClient
from azure.data.tables import TableClient
from requests.adapters import HTTPAdapter

from shared._backends import CosmosIdempotencyStore, TableIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._backends.dispatch import by_destination, send_plan
from shared._backends.sdk_transport import async_transport, proxy_configured
from shared._backends.table_aio import AsyncTableIdempotencyStore
from shared._core.outbox import OutgoingMessage

BACKENDS = ("table", "cosmos")


@dataclass(frozen=True)
class Endpoints:
    """Where the counted clients go: the local servers (or relays in front of them), or an
    emulator or account given as the tests' `IDEMPOTENCY_TEST_*` variables."""

    table_connection_string: str
    cosmos_endpoint: str
    cosmos_key: str
    cosmos_verify: bool = True


def classify(backend: str, method: str, url: str) -> str:
    path = urlsplit(url).path
    if backend == "cosmos":
        return "data" if "/docs" in path else "meta"
    parts = [p for p in path.split("/") if p]
    last = parts[-1] if parts else ""
    if last == "$batch":
        return "data"
    if last.startswith("Tables") or not parts:
        return "meta"
    return "data"


@dataclass(frozen=True)
class SentRequest:
    """One request as it went on the wire (recorded while `RequestCounter.recording`)."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes


def _body_of(request: Any) -> bytes:
    """The body of an azure-core request (`azure.core.rest.HttpRequest.content`, or the
    pipeline transport request's `body`) as bytes."""
    body = getattr(request, "content", None)
    if body is None:
        body = getattr(request, "body", None)
    if body is None:
        return b""
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


class RequestCounter:
    """Thread-safe tallies of store requests, by layer and kind; while `recording`, the
    requests themselves (what the same-transactions variant learns the app's bytes from)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str]] = Counter()  # (layer, kind) -> n
        self.requests: Counter[tuple[str, str]] = Counter()  # (method, kind) -> n, wire layer
        self.errors: Counter[str] = Counter()  # transport failures (the SDK may send again)
        self._recorded: list[SentRequest] | None = None

    def record(self, layer: str, method: str, url: str, request: Any = None) -> None:
        kind = classify(self.backend, method, url)
        with self._lock:
            self.counts[(layer, kind)] += 1
            if layer == "wire":
                self.requests[(method, kind)] += 1
                if self._recorded is not None and request is not None:
                    self._recorded.append(SentRequest(method, url, dict(request.headers),
                                                      _body_of(request)))

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[SentRequest]]:
        """The wire requests sent while inside, in the order they were sent."""
        recorded: list[SentRequest] = []
        with self._lock:
            self._recorded = recorded
        try:
            yield recorded
        finally:
            with self._lock:
                self._recorded = None

    def record_error(self, error: BaseException) -> None:
        with self._lock:
            self.errors[type(error).__name__] += 1

    def error_count(self) -> int:
        with self._lock:
            return sum(self.errors.values())

    def data(self, layer: str = "wire") -> int:
        with self._lock:
            return self.counts[(layer, "data")]

    def meta(self, layer: str = "wire") -> int:
        with self._lock:
            return self.counts[(layer, "meta")]


class CountingPolicy(SansIOHTTPPolicy):
    """Counts each request that passes this point of the pipeline."""

    def __init__(self, counter: RequestCounter, layer: str) -> None:
        self._counter = counter
        self._layer = layer

    def on_request(self, request: PipelineRequest) -> None:
        http = request.http_request
        self._counter.record(self._layer, http.method, http.url, http)


class _SharedContextAdapter(HTTPAdapter):
    """Hands urllib3 one prebuilt SSL context instead of one per new connection."""

    def __init__(self, ssl_context: ssl.SSLContext, **kwargs: Any) -> None:
        self._ssl_context = ssl_context
        super().__init__(**kwargs)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ssl_context"] = self._ssl_context
        super().init_poolmanager(*args, **kwargs)


def _session(verify: bool, pool_size: int | None = None, *, trust_env: bool = True
             ) -> requests.Session:
    """A session with one shared SSL context; `pool_size` keeps that many connections per host;
    `trust_env` is azure-core's `use_env_settings`, which it applies only to sessions it makes.

    requests keeps at most 10 idle connections per host by default: with more
    concurrent requests, the extra connections are closed after use and the
    next request pays a new TCP (and TLS) handshake. The latency benchmark
    sizes the pool for its concurrency and ignores proxy variables (loopback only).
    """
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    session = requests.Session()
    session.trust_env = trust_env
    if pool_size is None:
        session.mount("https://", _SharedContextAdapter(context))
    else:
        session.trust_env = False
        for scheme in ("https://", "http://"):
            session.mount(scheme, _SharedContextAdapter(context, pool_connections=4,
                                                        pool_maxsize=pool_size))
    return session


def pooled_transport(pool_size: int, *, verify: bool = True) -> RequestsTransport:
    """The default transport (uncounted) with a connection pool of `pool_size` per host."""
    return RequestsTransport(session=_session(verify, pool_size), session_owner=True)


class CountingTransport(RequestsTransport):
    """The default transport, counting every request it sends.

    The local Cosmos server answers every request with `Connection: close`
    (real Cosmos DB keeps connections alive), so each request opens a new TLS
    connection, and urllib3 then loads the system CA bundle again each time
    (~30 ms of client CPU here, more than the request itself). The session
    given to this transport reuses one SSL context, which removes that client
    artifact for every variant alike; the TCP and TLS handshakes remain.
    """

    def __init__(self, counter: RequestCounter, *, verify: bool = True, pool_size: int | None = None,
                 use_env_settings: bool = True, **kwargs: Any) -> None:
        super().__init__(session=_session(verify, pool_size, trust_env=use_env_settings),
                         session_owner=True, use_env_settings=use_env_settings, **kwargs)
        self._counter = counter

    def send(self, request: Any, **kwargs: Any) -> Any:
        self._counter.record("wire", request.method, request.url, request)
        try:
            return super().send(request, **kwargs)
        except Exception as error:  # e.g. a keep-alive connection the server had closed
            self._counter.record_error(error)
            raise


class AsyncCountingTransport(AioHttpTransport):
    """`CountingTransport` for the async clients (aiohttp): every request counted as sent."""

    def __init__(self, counter: RequestCounter, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._counter = counter

    async def send(self, request: Any, **kwargs: Any) -> Any:
        self._counter.record("wire", request.method, request.url, request)
        try:
            return await super().send(request, **kwargs)
        except Exception as error:
            self._counter.record_error(error)
            raise


def counted_async_table_store(connection_string: str, table_name: str, counter: RequestCounter,
                              **options: Any) -> AsyncTableIdempotencyStore:
    """An async Table store whose calls and wire attempts are counted like the sync one's."""
    return AsyncTableIdempotencyStore.from_connection_string(
        connection_string, table_name=table_name,
        per_call_policies=[CountingPolicy(counter, "call")],
        per_retry_policies=[CountingPolicy(counter, "wire")],
        **{"transport": async_transport(), **options})  # as the app builds its clients


async def counted_async_cosmos_client(endpoint: str, key: str, counter: RequestCounter, *,
                                      verify: bool = True, **options: Any) -> AsyncCosmosClient:
    """An async CosmosClient (entered: account read, session consistency) counting every request
    at its transport; `enable_endpoint_discovery=False` behind a relay, as for the sync one."""
    client = AsyncCosmosClient(endpoint, key, connection_verify=verify,
                               transport=AsyncCountingTransport(counter, use_env_settings=proxy_configured()),
                               **options)
    await client.__aenter__()
    return client


def counted_table_client(connection_string: str, table_name: str,
                         counter: RequestCounter, **options: Any) -> TableClient:
    """A TableClient whose logical calls and wire attempts are counted."""
    return TableClient.from_connection_string(
        connection_string, table_name,
        per_call_policies=[CountingPolicy(counter, "call")],
        per_retry_policies=[CountingPolicy(counter, "wire")], **options)


def counted_table_store(connection_string: str, table_name: str, counter: RequestCounter, *,
                        create: bool = True, **options: Any) -> TableIdempotencyStore:
    """`options` go to the TableClient (e.g. `transport=pooled_transport(...)`)."""
    store = TableIdempotencyStore.from_table_client(
        counted_table_client(connection_string, table_name, counter, **options))
    if create:
        store.ensure_table()
    return store


def counted_cosmos_client(endpoint: str, key: str, counter: RequestCounter, *,
                          verify: bool = True, pool_size: int | None = None,
                          **options: Any) -> CosmosClient:
    """A CosmosClient whose every HTTP request is counted at the transport.

    Behind a relay, pass `enable_endpoint_discovery=False`: the local Cosmos
    server advertises its own address, and with discovery on the SDK sends
    its requests there, around the relay.
    """
    return CosmosClient(endpoint, key, connection_verify=verify,
                        transport=CountingTransport(counter, verify=verify, pool_size=pool_size),
                        **options)


def counted_cosmos_store(client: CosmosClient, database: str, container: str, *,
                         partition_key_path: str = "/pk") -> CosmosIdempotencyStore:
    from azure.cosmos import PartitionKey

    db = client.create_database_if_not_exists(database)
    proxy = db.create_container_if_not_exists(container, PartitionKey(partition_key_path),
                                              default_ttl=-1,
                                              indexing_policy=record_indexing_policy(partition_key_path))
    return CosmosIdempotencyStore.from_container(proxy, partition_key_path)


# -- outgoing messages ---------------------------------------------------------------------------
class SendTally:
    """Dispatch calls, the sends they make and the messages those carry; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = 0
        self.sends = 0
        self.messages = 0

    def add(self, messages: Sequence[OutgoingMessage]) -> int:
        """Tally one dispatch call; the sends it costs: as `shared._backends.dispatch.ServiceBusDispatcher`
        makes them, one per destination and per batch that fits one send."""
        sends = sum(len(send_plan(group)) for _, group in by_destination(messages))
        self.count(sends, len(messages))
        return sends

    def count(self, sends: int, messages: int) -> None:
        """Tally one dispatch call of `messages` in `sends` sends (cut by the caller)."""
        with self._lock:
            self.calls += 1
            self.sends += sends
            self.messages += messages


class CostedDispatcher:
    """Sends nothing, costs what a real send costs at `rtt_ms`: one round trip per send,
    the calling thread blocked meanwhile (the sync variant)."""

    def __init__(self, tally: SendTally, rtt_ms: float) -> None:
        self.tally = tally
        self.rtt_ms = rtt_ms

    def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        sends = self.tally.add(messages)
        if sends and self.rtt_ms > 0:
            time.sleep(sends * self.rtt_ms / 1000)

    def close(self) -> None:
        pass


class AsyncCostedDispatcher:
    """`CostedDispatcher` for the async variant: the round trips are awaited (the loop stays free)."""

    def __init__(self, tally: SendTally, rtt_ms: float) -> None:
        self.tally = tally
        self.rtt_ms = rtt_ms

    async def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        sends = self.tally.add(messages)
        await asyncio.sleep(sends * self.rtt_ms / 1000 if self.rtt_ms > 0 else 0)

    async def close(self) -> None:
        pass
