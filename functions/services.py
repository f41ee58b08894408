"""Builds the app's services from settings, once per worker process.

Tests and the delivery simulator call `configure()` with their own settings
(pointing at Azurite and the Cosmos server) and a fake HTTP sender.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from azure.cosmos import CosmosClient, PartitionKey
from azure.data.tables import TableServiceClient

from domain.http_payments import HttpPaymentService
from domain.maintenance import Maintenance
from domain.notifications import NotificationService, Sender, urllib_sender
from domain.order_status import OrderStatusService
from domain.orders import OrderService
from domain.payments import PaymentService
from shared import (
    CosmosIdempotencyStore,
    Idempotency,
    IdempotencyStore,
    TableIdempotencyStore,
)
from shared.parking import ParkingLot
from shared.settings import COSMOS_CONTAINERS, TABLES, Settings
from shared.telemetry import Telemetry
from shared.watermark import PartitionWatermark

TABLE_FOR = {"orders": "orders", "order-status": "orderstatus", "ledger": "ledger", "dedup": "dedup"}


def _credential(settings: Settings) -> Any:
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(managed_identity_client_id=settings.azure_client_id)


@dataclass
class Services:
    settings: Settings
    stores: dict[str, IdempotencyStore]
    orders: OrderService
    payments: PaymentService
    notify: NotificationService
    audit: NotificationService
    http_payments: HttpPaymentService
    order_status: OrderStatusService
    maintenance: Maintenance
    parking: ParkingLot
    telemetry: Telemetry


def build_services(settings: Settings, *, sender: Sender = urllib_sender,
                   clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                   telemetry: Telemetry | None = None, **client_options: Any) -> Services:
    """Wire stores and services. Keys/connection strings (local runs) also create
    missing tables and containers; in Azure, Bicep creates them and the app's
    identity holds data-plane roles only."""
    telemetry = telemetry or Telemetry()
    if settings.table_connection_string:
        table_service = TableServiceClient.from_connection_string(
            settings.table_connection_string, **client_options)
        for name in TABLES:
            table_service.create_table_if_not_exists(name)
    else:
        table_service = TableServiceClient(settings.table_endpoint, credential=_credential(settings),
                                           **client_options)

    def table(name: str) -> TableIdempotencyStore:
        return TableIdempotencyStore.from_table_client(table_service.get_table_client(name))

    stores: dict[str, IdempotencyStore]
    if settings.backend == "cosmos":
        credential = settings.cosmos_key or _credential(settings)
        cosmos = CosmosClient(settings.cosmos_endpoint, credential,
                              connection_verify=settings.cosmos_verify_tls, **client_options)
        if settings.cosmos_key:
            database = cosmos.create_database_if_not_exists(settings.cosmos_database)
            for name, path in COSMOS_CONTAINERS.items():
                database.create_container_if_not_exists(
                    name, PartitionKey(path), default_ttl=-1 if path == "/pk" else None)
        database = cosmos.get_database_client(settings.cosmos_database)
        stores = {name: CosmosIdempotencyStore.from_container(database.get_container_client(name),
                                                              path)
                  for name, path in COSMOS_CONTAINERS.items()}
    else:
        stores = {name: table(table_name) for name, table_name in TABLE_FOR.items()}
    notifications_store = table("dedup")  # the two-phase consumers always use Table Storage
    config = dataclasses.replace(settings.idempotency_config(), clock=clock)
    parking = ParkingLot(table("parked"), telemetry=telemetry, clock=clock)

    def idem(store: IdempotencyStore) -> Idempotency:
        return Idempotency(store, config=config, telemetry=telemetry)

    payments = PaymentService(
        idem(stores["ledger"]),
        PartitionWatermark(stores["dedup"], consumer="payments", event_hub=settings.payments_hub,
                           consumer_group=settings.payments_consumer_group),
        parking, event_hub=settings.payments_hub, missing_key_policy=settings.missing_key_policy,
        max_attempts=settings.payments_max_attempts, sleep=sleep)
    api_url = settings.notification_api_url or ""

    def notifications(consumer: str) -> NotificationService:
        return NotificationService(consumer, idem(notifications_store), parking, api_url=api_url,
                                   api_honours_key=settings.notification_api_honours_key,
                                   sender=sender)

    return Services(
        settings=settings,
        stores={**stores, "notifications": notifications_store},
        orders=OrderService(idem(stores["orders"])),
        payments=payments,
        notify=notifications("notify"),
        audit=notifications("audit"),
        http_payments=HttpPaymentService(idem(stores["dedup"]), payments),
        order_status=OrderStatusService(stores["order-status"]),
        maintenance=Maintenance({"dedup": stores["dedup"], "ledger": stores["ledger"],
                                 "notifications": notifications_store}, parking,
                                grace_seconds=settings.window.length.total_seconds(), clock=clock),
        parking=parking,
        telemetry=telemetry,
    )


_lock = threading.Lock()
_services: Services | None = None


def services() -> Services:
    """The process-wide services, built from app settings on first use."""
    global _services
    with _lock:
        if _services is None:
            _services = build_services(Settings.from_env())
        return _services


def configure(value: Services | None) -> None:
    """Install services (tests, simulator) or reset to build from settings again."""
    global _services
    with _lock:
        _services = value
