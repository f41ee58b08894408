"""Wires the app: stores from settings, then the domain services on top of them.

`build_services` takes its stores from a factory (role name -> store), so
tests and the delivery simulator pass their own (in-memory stores, stores
with injected faults) through that seam; the default factory builds the real
ones from settings. The functions reach the built services through
`services()`: those a caller set for the functions it invokes (`use_services`:
the simulated host, tests), else the process's own, built from app settings on
first use (the Functions host sets none).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from azure.cosmos import CosmosClient, PartitionKey
from azure.data.tables import TableServiceClient

from domain.balance_projection import BalanceProjection
from domain.http_payments import CONSUMER as HTTP_CONSUMER
from domain.http_payments import HttpPaymentService
from domain.notifications import NotificationService, Sender, urllib_sender
from domain.order_audit import CONSUMER as AUDIT_CONSUMER
from domain.order_audit import OrderAuditTrail
from domain.order_status import OrderStatusService
from domain.orders import OrderService
from domain.payments import (
    AsyncPaymentProcessor,
    PaymentProcessor,
    PaymentRules,
    async_payment_processor,
    payment_processor,
)
from functions.settings import (
    COSMOS_CONTAINERS,
    COSMOS_INDEXING,
    QUEUE_CONNECTION,
    QUEUE_SERVICE_URI,
    STORE_ROLES,
    TABLE_FOR,
    TABLES,
    Settings,
    SettingsError,
)
from shared import (
    CosmosIdempotencyStore,
    DispatchRejectedError,
    DocumentCache,
    Idempotency,
    IdempotencyKeyEndpoint,
    IdempotencyStore,
    Maintenance,
    ParkingLot,
    PartitionWatermark,
    RetryBudget,
    ServiceBusDispatcher,
    StorageQueueConsumer,
    TableIdempotencyStore,
    Telemetry,
    aio,
    sdk_transport,
)
from shared.testing import InMemoryDispatcher  # the default when stores are given (tests)

#: The store SDKs' retries, set explicitly on every client built here. With the payments batch's
#: tries per account group (PAYMENTS_MAX_ATTEMPTS, A) and its cap on an honoured Retry-After
#: (shared._flows.batch.MAX_RETRY_AFTER_SECONDS, R), a batch whose every request is throttled raises
#: for the host's retry after at most A x (2 x 1 s + R) of waiting: 21 s by default, well inside the
#: 10-minute function timeout and the 60 s Service Bus lock (a Service Bus message waits at most
#: 2 s per store request). `shared._backends.retry` explains the layers.
RETRY_BUDGET = RetryBudget(sdk_retries=2, sdk_wait=1.0)

StoreFactory = Callable[[str], IdempotencyStore]
AsyncStoreFactory = Callable[[str], Any]  # role -> an async store (shared.aio.AsyncStore)


def _endpoint(value: str | None, setting: str) -> str:
    """An endpoint setting `Settings.from_env` required for this configuration."""
    if not value:
        raise ValueError(f"{setting} is not set")
    return value


def _credential(settings: Settings) -> Any:
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(managed_identity_client_id=settings.azure_client_id)


class RealAsyncStores:
    """Async stores (`azure.cosmos.aio`, `azure.data.tables.aio`) for the async functions, by
    role as `real_stores` places them: endpoint + the app's identity in Azure (one async
    credential for all), keys or connection strings locally. `real_stores` creates the
    tables and containers they use.

    A client binds to the event loop of its first request: use them on the worker's loop
    (`services()` does), and `aclose()` them there. `dispatcher()` is the async outbox
    dispatcher on the same identity, closed with them.
    """

    def __init__(self, settings: Settings, *, budget: RetryBudget = RETRY_BUDGET,
                 **client_options: Any) -> None:
        self.settings = settings
        self.client_options = client_options
        self.budget = budget
        self.built: dict[str, Any] = {}
        self._credential: Any = None
        self._dispatcher: Any = None

    def _identity(self) -> Any:
        if self._credential is None:
            from azure.identity.aio import DefaultAzureCredential

            self._credential = DefaultAzureCredential(
                managed_identity_client_id=self.settings.azure_client_id)
        return self._credential

    def dispatcher(self) -> Any:
        """The async Service Bus dispatcher (`shared._backends.dispatch_aio`) for the async functions,
        on the trigger's connection as `real_dispatcher` reads it."""
        if self._dispatcher is None:
            settings = self.settings
            connection = settings.service_bus_connection
            if connection and "endpoint=" in connection.lower():
                self._dispatcher = aio.ServiceBusDispatcher.from_connection_string(
                    connection, topics=_topics(settings))
            elif settings.service_bus_namespace:
                self._dispatcher = aio.ServiceBusDispatcher(
                    settings.service_bus_namespace, self._identity(), topics=_topics(settings))
            else:
                self._dispatcher = UnconfiguredDispatcher()
        return self._dispatcher

    def __call__(self, role: str) -> Any:
        if role not in self.built:
            self.built[role] = self._build(role)
        return self.built[role]

    def _build(self, role: str) -> Any:
        settings = self.settings
        # Each client its own transport, without per-request proxy lookups (shared._backends.sdk_transport).
        transport = {"transport": aio.sdk_transport()}
        if settings.backend == "cosmos" and role in COSMOS_CONTAINERS:
            return aio.CosmosIdempotencyStore(
                _endpoint(settings.cosmos_endpoint, "COSMOS_ENDPOINT"),
                settings.cosmos_key or self._identity(),
                database=settings.cosmos_database, container=role,
                partition_key_path=COSMOS_CONTAINERS[role],
                connection_verify=settings.cosmos_verify_tls,
                accept_duplicates_across_write_regions=(
                    settings.cosmos_accept_duplicates_across_write_regions),
                **{**transport, **self.budget.cosmos_options(), **self.client_options})
        options = {**transport, **self.budget.table_options(), **self.client_options}
        codec = settings.table_batch_codec
        if settings.table_connection_string:
            return aio.TableIdempotencyStore.from_connection_string(
                settings.table_connection_string, table_name=TABLE_FOR[role], batch_codec=codec,
                **options)
        return aio.TableIdempotencyStore(_endpoint(settings.table_endpoint, "TABLE_ENDPOINT"),
                                          self._identity(), table_name=TABLE_FOR[role],
                                          batch_codec=codec, **options)

    async def aclose(self) -> None:
        """Close every store built here and the dispatcher, then the credential (they do not
        own it)."""
        for store in self.built.values():
            await store.close()
        self.built.clear()
        if self._dispatcher is not None:
            closed = self._dispatcher.close()
            if inspect.isawaitable(closed):
                await closed
            self._dispatcher = None
        if self._credential is not None:
            await self._credential.close()
            self._credential = None


class UnconfiguredDispatcher:
    """No Service Bus connection in the settings (a tool that only reads): a dispatch is
    refused, so the messages stay pending (and alert) instead of vanishing."""

    def dispatch(self, messages: Any) -> None:
        raise DispatchRejectedError("no Service Bus connection is configured (ServiceBusConnection "
                                    "or ServiceBusConnection__fullyQualifiedNamespace)")

    def close(self) -> None:
        pass


def _topics(settings: Settings) -> tuple[str, ...]:
    """The outbox destinations that are topics (the rest, balance changes, are queues)."""
    return (settings.notifications_topic,)


def real_dispatcher(settings: Settings) -> ServiceBusDispatcher | UnconfiguredDispatcher:
    """The outbox's dispatcher on the trigger's Service Bus connection: a connection string
    locally, the namespace and the app's identity in Azure (Data Sender on the destinations
    only). The destinations that are topics are named; the rest are queues."""
    topics = _topics(settings)
    connection = settings.service_bus_connection
    if connection and "endpoint=" in connection.lower():
        return ServiceBusDispatcher.from_connection_string(connection, topics=topics)
    if not settings.service_bus_namespace:
        return UnconfiguredDispatcher()
    return ServiceBusDispatcher(settings.service_bus_namespace, _credential(settings),
                                topics=topics)


def poison_queue(settings: Settings) -> Any:
    """The order-audit queue's `<queue>-poison` client on the trigger's connection, with the
    trigger's message encoding (base64, the host's default), so its envelopes read like the
    host's own poison messages."""
    from azure.storage.queue import QueueClient, TextBase64EncodePolicy

    name = f"{settings.order_audit_queue}-poison"
    options = {"message_encode_policy": TextBase64EncodePolicy(), "transport": sdk_transport()}
    if settings.queue_connection:
        return QueueClient.from_connection_string(settings.queue_connection, name, **options)
    if settings.queue_service_uri:
        return QueueClient(settings.queue_service_uri, name, credential=_credential(settings),
                           **options)
    raise SettingsError(f"set {QUEUE_CONNECTION} (local: a connection string) or "
                        f"{QUEUE_SERVICE_URI} (Azure, identity): the order_audit trigger's poison "
                        "queue is reached through that connection")


def real_stores(settings: Settings, *, budget: RetryBudget = RETRY_BUDGET,
                **client_options: Any) -> StoreFactory:
    """The stores of `STORE_ROLES` in Cosmos DB or Table Storage, as settings say.

    With keys or connection strings (local runs) missing tables and containers
    are created; in Azure, Bicep creates them and the app's identity holds
    data-plane roles only. notify/audit records and parked entries always live
    in Table Storage; the other roles follow DEDUP_BACKEND. The SDK clients
    retry as `budget` says (`client_options` override it).
    """
    # Each client its own transport, without per-request proxy lookups (shared._backends.sdk_transport).
    table_options = {"transport": sdk_transport(), **budget.table_options(), **client_options}
    if settings.table_connection_string:
        table_service = TableServiceClient.from_connection_string(
            settings.table_connection_string, **table_options)
        for name in TABLES:
            table_service.create_table_if_not_exists(name)
    else:
        table_service = TableServiceClient(_endpoint(settings.table_endpoint, "TABLE_ENDPOINT"),
                                           credential=_credential(settings), **table_options)
    database = None
    if settings.backend == "cosmos":
        cosmos = CosmosClient(_endpoint(settings.cosmos_endpoint, "COSMOS_ENDPOINT"),
                              settings.cosmos_key or _credential(settings),
                              connection_verify=settings.cosmos_verify_tls,
                              **{"transport": sdk_transport(), **budget.cosmos_options(),
                                 **client_options})
        if settings.cosmos_key:
            created = cosmos.create_database_if_not_exists(settings.cosmos_database)
            for name, path in COSMOS_CONTAINERS.items():
                created.create_container_if_not_exists(
                    name, PartitionKey(path), default_ttl=-1 if path == "/pk" else None,
                    indexing_policy=COSMOS_INDEXING[name])
        database = cosmos.get_database_client(settings.cosmos_database)
    built: dict[str, IdempotencyStore] = {}

    def store(role: str) -> IdempotencyStore:
        if role not in built:
            if database is not None and role in COSMOS_CONTAINERS:
                built[role] = CosmosIdempotencyStore.from_container(
                    database.get_container_client(role), COSMOS_CONTAINERS[role],
                    accept_duplicates_across_write_regions=(
                        settings.cosmos_accept_duplicates_across_write_regions))
            else:
                built[role] = TableIdempotencyStore.from_table_client(
                    table_service.get_table_client(TABLE_FOR[role]),
                    batch_codec=settings.table_batch_codec)
        return built[role]

    return store


@dataclass
class Services:
    """The app's consumers, built once per process. The functions run on the async variant
    (`async_stores`); the HTTP endpoint, the timer and the tools on the sync one (`stores`)."""

    settings: Settings
    stores: dict[str, IdempotencyStore]  # by role: the sync stores
    async_stores: dict[str, Any]  # by role: the async stores the functions run on
    orders: OrderService[aio.ServiceBusConsumer]
    notify: NotificationService
    audit: NotificationService
    order_status: OrderStatusService
    balance_projection: BalanceProjection
    order_audit: OrderAuditTrail  # the Storage Queue consumer (sync: a queue trigger)
    payments: PaymentProcessor  # the sync payments path: HTTP requests, the replay tool
    payments_async: AsyncPaymentProcessor  # the Event Hubs trigger's path; same stores
    payments_consumer: aio.EventHubConsumer
    http_payments: HttpPaymentService
    maintenance: Maintenance
    parking: ParkingLot
    telemetry: Telemetry
    async_factory: Any = None  # what built async_stores, when it has more to close
    dispatcher: Any = None  # sends what the sync paths' commits recorded (shared._backends.dispatch)
    async_dispatcher: Any = None  # the same for the async functions (may be a sync one)

    async def aclose(self) -> None:
        """Close what the async stores' factory opened (`RealAsyncStores`: clients and the
        credential), on the event loop that used them. Sync stores behind `ThreadedStore`
        stay open: they are the sync services' too."""
        closer = getattr(self.async_factory, "aclose", None)
        if closer is not None:
            await closer()


def build_services(settings: Settings, *, stores: StoreFactory | None = None,
                   async_stores: AsyncStoreFactory | None = None,
                   sender: Sender = urllib_sender, clock: Callable[[], float] = time.time,
                   sleep: Callable[[float], None] = time.sleep,
                   telemetry: Telemetry | None = None, dispatcher: Any = None,
                   async_dispatcher: Any = None) -> Services:
    """Wire the consumers on the stores `stores(role)` returns (default: real ones).

    The async functions run on `async_stores(role)`; without them (tests, the simulator's
    fault-injecting stores) on the sync stores, each request on a thread. `dispatcher`
    sends the sync paths' outgoing messages (default: Service Bus from settings with the
    real stores, an `InMemoryDispatcher` with given ones); `async_dispatcher` those of the
    async functions (default: `dispatcher` when one is given, else the async Service Bus
    dispatcher of `RealAsyncStores`, else the same as the sync paths').
    """
    telemetry = telemetry or Telemetry(log_duplicates=settings.log_duplicates)
    if stores is None:
        stores = real_stores(settings)
        async_stores = async_stores or RealAsyncStores(settings)
        if async_dispatcher is None and dispatcher is None and isinstance(async_stores,
                                                                          RealAsyncStores):
            async_dispatcher = async_stores.dispatcher()
        dispatcher = dispatcher or real_dispatcher(settings)
    dispatcher = dispatcher if dispatcher is not None else InMemoryDispatcher()
    async_dispatcher = async_dispatcher if async_dispatcher is not None else dispatcher
    by_role = {role: stores(role) for role in STORE_ROLES}
    on_loop = {role: (async_stores(role) if async_stores else aio.ThreadedStore(by_role[role]))
               for role in STORE_ROLES}
    config = dataclasses.replace(settings.idempotency_config(), clock=clock)
    parking = ParkingLot(by_role["parked"], telemetry=telemetry, clock=clock)
    async_parking = aio.ParkingLot(on_loop["parked"], telemetry=telemetry, clock=clock)

    def idem(role: str) -> Idempotency:
        return Idempotency(by_role[role], config=config, telemetry=telemetry,
                           dispatcher=dispatcher)

    def async_idem(role: str) -> aio.Idempotency:
        return aio.Idempotency(on_loop[role], config=config, telemetry=telemetry,
                               dispatcher=async_dispatcher)

    # An instance owns a partition's batches for a while: it remembers the partition's mark
    # and the balances it wrote (both re-checked by etag when it writes them next).
    mark = {"consumer": "payments", "event_hub": settings.payments_hub,
            "consumer_group": settings.payments_consumer_group, "remember": True}
    rules = PaymentRules(settings.payments_hub, settings.missing_key_policy,
                         balance_changes_queue=settings.balance_changes_queue)
    options: dict[str, Any] = {"max_attempts": settings.payments_max_attempts,
                               "max_concurrency": settings.payments_max_concurrency}
    payments = payment_processor(
        Idempotency(by_role["ledger"], config=config, telemetry=telemetry,
                    documents=DocumentCache(), dispatcher=dispatcher),
        PartitionWatermark(by_role["dedup"], **mark), parking, rules=rules, sleep=sleep, **options)
    payments_async = async_payment_processor(
        aio.Idempotency(on_loop["ledger"], config=config, telemetry=telemetry,
                        documents=DocumentCache(), dispatcher=async_dispatcher),
        aio.PartitionWatermark(on_loop["dedup"], **mark), async_parking,
        rules=rules, sleep=_async_sleep(sleep), **options)

    def notifications(consumer: str) -> NotificationService:
        return NotificationService(aio.ServiceBusConsumer(consumer, async_idem("notifications")),
                                   async_parking, api_url=settings.notification_api_url,
                                   api_honours_key=settings.notification_api_honours_key,
                                   sender=sender)

    record_roles = ("dedup", "ledger", "notifications")
    topic = settings.notifications_topic
    return Services(
        settings=settings,
        stores=by_role,
        async_stores=on_loop,
        orders=OrderService(aio.ServiceBusConsumer("orders", async_idem("orders"), sends_to=(topic,)),
                            notifications_topic=topic),
        notify=notifications("notify"),
        audit=notifications("audit"),
        order_status=OrderStatusService(
            aio.ServiceBusConsumer("order_status", telemetry=telemetry), on_loop["order-status"]),
        balance_projection=BalanceProjection(
            aio.ServiceBusConsumer("balance_projection", async_idem("dedup"))),
        order_audit=OrderAuditTrail(StorageQueueConsumer(
            AUDIT_CONSUMER, idem("dedup"), poison=lambda: poison_queue(settings),
            max_dequeue_count=settings.queue_max_dequeue_count)),
        payments=payments,
        payments_async=payments_async,
        payments_consumer=aio.EventHubConsumer(payments_async),
        http_payments=HttpPaymentService(
            IdempotencyKeyEndpoint(idem("dedup"), name=HTTP_CONSUMER,
                                   caller_header=settings.http_caller_header), payments),
        maintenance=Maintenance({role: by_role[role] for role in record_roles}, parking,
                                grace_seconds=settings.window.length.total_seconds(), clock=clock,
                                # the consumers that send and record dispatches (payments: its
                                # single events; a batch's mark records its own): the sync variant
                                # of the same stores the functions commit to
                                outbox={"orders": idem("orders"), "payments": payments.ledger},
                                outbox_age_seconds=settings.outbox_sweep_age.total_seconds(),
                                telemetry=telemetry),
        parking=parking,
        telemetry=telemetry,
        async_factory=async_stores,
        dispatcher=dispatcher,
        async_dispatcher=async_dispatcher,
    )


def _async_sleep(sleep: Callable[[float], None]) -> Callable[[float], Any]:
    """The async service's sleep: asyncio's, unless a test or the simulator injected its own."""
    return asyncio.sleep if sleep is time.sleep else sleep


_lock = threading.Lock()
_services: Services | None = None
_given: contextvars.ContextVar[Services | None] = contextvars.ContextVar("services", default=None)


def services() -> Services:
    """The services of the running invocation: those its caller set (`use_services`),
    else the process-wide services, built from app settings on first use."""
    given = _given.get()
    if given is not None:
        return given
    global _services
    with _lock:
        if _services is None:
            _services = build_services(Settings.from_env())
        return _services


@contextlib.contextmanager
def use_services(value: Services) -> Iterator[Services]:
    """Run the functions invoked from this context on `value`, never touching the process's
    services: what runs in this context sees them, as do the tasks it creates (and the
    worker's threads, through the local worker driver, which carries the caller's context).
    Concurrent callers (simulated hosts, tests) may each use their own."""
    token = _given.set(value)
    try:
        yield value
    finally:
        _given.reset(token)
