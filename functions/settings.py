"""Every app setting the function app reads, in one place, with clear startup errors.

Binding expressions (`%ORDERS_QUEUE_NAME%`, `connection="ServiceBusConnection"`)
are resolved by the Functions host; the rest is read here. The infra contract
tests check that each name is defined in Bicep and local.settings.sample.json.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, get_args

from shared import IdempotencyConfig, RedeliveryWindow, record_indexing_policy, sampling_ratio_from

#: The Table store's `batch_codec` values (TABLE_BATCH_CODEC); tests hold them to the store's.
BatchCodec = Literal["lean", "sdk"]

# Read by the host for bindings (not by Python code).
BINDING_SETTINGS = (
    "AzureWebJobsStorage",
    "ServiceBusConnection",
    "EventHubConnection",
    "ORDERS_QUEUE_NAME",
    "ORDER_STATUS_QUEUE_NAME",
    "NOTIFICATIONS_TOPIC_NAME",
    "NOTIFY_SUBSCRIPTION_NAME",
    "AUDIT_SUBSCRIPTION_NAME",
    "BALANCE_CHANGES_QUEUE",
    "PAYMENTS_HUB_NAME",
    "PAYMENTS_CONSUMER_GROUP",
    "MAINTENANCE_SCHEDULE",
    "ORDER_AUDIT_QUEUE_NAME",
)
# Read by the app at startup.
APP_SETTINGS = (
    "DEDUP_BACKEND",
    "COSMOS_ENDPOINT",
    "COSMOS_KEY",
    "COSMOS_DATABASE",
    "COSMOS_ACCEPT_DUPLICATES_ACROSS_WRITE_REGIONS",
    "TABLE_ENDPOINT",
    "TABLE_CONNECTION_STRING",
    "TABLE_BATCH_CODEC",
    "NOTIFICATION_API_URL",
    "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY",
    "DEDUP_TTL_SECONDS",
    "DEDUP_LEASE_SECONDS",
    "SERVICEBUS_LOCK_DURATION_SECONDS",
    "SERVICEBUS_MAX_DELIVERY_COUNT",
    "SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS",
    "DEDUP_RETENTION_MARGIN_SECONDS",
    "PAYMENTS_MISSING_KEY_POLICY",
    "PAYMENTS_MAX_ATTEMPTS",
    "PAYMENTS_MAX_CONCURRENCY",
    "PAYMENTS_HUB_NAME",
    "PAYMENTS_CONSUMER_GROUP",
    "NOTIFICATIONS_TOPIC_NAME",
    "BALANCE_CHANGES_QUEUE",
    "OUTBOX_DUPLICATE_DETECTION_SECONDS",
    "OUTBOX_SWEEP_AGE_SECONDS",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "AZURE_CLIENT_ID",
    "COSMOS_VERIFY_TLS",
    "HTTP_CALLER_HEADER",
    "DEDUP_LOG_DUPLICATES",
    "TRACE_SAMPLING_RATIO",
    "ORDER_AUDIT_QUEUE_NAME",
    "QUEUE_MAX_DEQUEUE_COUNT",
)
# Only for local runs (keys, emulator TLS); Azure uses the app's managed identity instead.
LOCAL_ONLY_SETTINGS = ("COSMOS_KEY", "COSMOS_VERIFY_TLS", "TABLE_CONNECTION_STRING")
SETTING_NAMES = tuple(dict.fromkeys(BINDING_SETTINGS + APP_SETTINGS))

# The app's stores by role, and where each lives (Bicep creates them; see infra/).
# Cosmos containers with their partition key path, for DEDUP_BACKEND=cosmos:
COSMOS_CONTAINERS = {"orders": "/orderId", "order-status": "/orderId", "ledger": "/pk",
                     "dedup": "/pk"}
# Each container's indexing policy: only what the sweep and the listing tools query (every
# container holds idempotency records); point reads and writes need no index. Bicep
# (infra/core/cosmos.bicep) declares the same policies; tests/infra holds it to these.
COSMOS_INDEXING = {name: record_indexing_policy(path) for name, path in COSMOS_CONTAINERS.items()}
# Tables by role: the same roles for DEDUP_BACKEND=table, plus the two that always live in
# Table Storage (the parking lot, and the notify/audit records).
TABLE_FOR = {"orders": "orders", "order-status": "orderstatus", "ledger": "ledger",
             "dedup": "dedup", "notifications": "dedup", "parked": "parked"}
TABLES = tuple(dict.fromkeys(TABLE_FOR.values()))
STORE_ROLES = tuple(TABLE_FOR)


_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an RFC 9110 token


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names it and says what is expected."""


# How the dispatcher reaches Service Bus: the trigger's connection, as the host reads it (a
# connection string locally, the namespace + the app's identity in Azure).
SERVICE_BUS_CONNECTION = "ServiceBusConnection"
SERVICE_BUS_NAMESPACE = "ServiceBusConnection__fullyQualifiedNamespace"
# How the order-audit consumer reaches its poison queue: the queue trigger's connection, as the
# host reads it (a connection string locally, the queue endpoint + the app's identity in Azure).
QUEUE_CONNECTION = "AzureWebJobsStorage"
QUEUE_SERVICE_URI = "AzureWebJobsStorage__queueServiceUri"


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as error:
        raise SettingsError(f"{name}={raw!r} is not an integer") from error
    if value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise SettingsError(f"{name}={raw!r} must be true or false")


def _ratio(env: Mapping[str, str]) -> float:
    try:
        return sampling_ratio_from(env)
    except ValueError as error:
        raise SettingsError(str(error)) from error


def _url(env: Mapping[str, str], name: str) -> str:
    """A required absolute http(s) URL: an empty one would fail every delivery instead."""
    raw = env.get(name, "").strip()
    parsed = urllib.parse.urlsplit(raw)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise SettingsError(f"{name}={raw!r} must be an absolute http(s) URL (notify and audit "
                            "POST every notification there)")
    return raw


_QUEUE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")


def _queue_name(env: Mapping[str, str], name: str, default: str) -> str:
    """A Storage queue name that leaves room for the host's `-poison` suffix (63 chars)."""
    value = (env.get(name) or default).strip()
    if not _QUEUE_NAME.match(value) or len(value) > 63 - len("-poison"):
        raise SettingsError(f"{name}={value!r} must be a Storage queue name (3-56 lowercase letters, "
                            "digits and single hyphens, so that `<name>-poison` is one too)")
    return value


@dataclass(frozen=True)
class Settings:
    """The app's configuration, validated once at startup."""

    backend: str
    cosmos_endpoint: str | None
    cosmos_key: str | None
    cosmos_database: str
    cosmos_verify_tls: bool
    table_endpoint: str | None
    table_connection_string: str | None
    table_batch_codec: BatchCodec
    notification_api_url: str
    notification_api_honours_key: bool
    ttl: timedelta
    lease: timedelta
    window: RedeliveryWindow
    missing_key_policy: str
    payments_max_attempts: int
    payments_max_concurrency: int
    payments_hub: str
    payments_consumer_group: str
    azure_client_id: str | None
    notifications_topic: str = "notifications"
    # Where payments sends BalanceChanged (a queue; balance_projection reads it). Empty: payments
    # publishes nothing (a benchmark compares the two).
    balance_changes_queue: str = "balance-changes"
    service_bus_connection: str | None = None  # a connection string (local runs)
    service_bus_namespace: str | None = None  # <name>.servicebus.windows.net (identity)
    outbox_duplicate_detection: timedelta = timedelta(days=2)
    outbox_sweep_age: timedelta = timedelta(minutes=10)
    http_caller_header: str | None = None
    # Duplicates and in-progress claims logged at INFO (an investigation), not DEBUG; they are
    # always counted by cause in the dedup.messages metric.
    log_duplicates: bool = False
    trace_sampling_ratio: float = sampling_ratio_from({})  # share of traces exported (TRACE_SAMPLING_RATIO)
    # Run on a Cosmos account with several write regions, where a message can take effect once
    # per region (the stores refuse such an account otherwise; see shared._backends.cosmos).
    cosmos_accept_duplicates_across_write_regions: bool = False
    # The order-audit Storage queue (its poison queue is `<name>-poison`, as the host names it).
    order_audit_queue: str = "order-audit"
    # The host's maxDequeueCount (host.json extensions.queues; Bicep sets both from one parameter):
    # the consumer poisons a message with its reason on that delivery instead of the host.
    queue_max_dequeue_count: int = 5
    queue_connection: str | None = None  # a connection string (local runs)
    queue_service_uri: str | None = None  # https://<account>.queue.core.windows.net (identity)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        backend = env.get("DEDUP_BACKEND", "cosmos").strip().lower()
        if backend not in ("cosmos", "table"):
            raise SettingsError(f"DEDUP_BACKEND={backend!r} must be 'cosmos' or 'table'")
        table_endpoint = env.get("TABLE_ENDPOINT") or None
        table_conn = env.get("TABLE_CONNECTION_STRING") or None
        if not (table_endpoint or table_conn):
            raise SettingsError("set TABLE_ENDPOINT (Azure, identity) or TABLE_CONNECTION_STRING "
                                "(local, e.g. UseDevelopmentStorage=true): parked messages, "
                                "notifications and the table backend live there")
        cosmos_endpoint = env.get("COSMOS_ENDPOINT") or None
        if backend == "cosmos" and not cosmos_endpoint:
            raise SettingsError("DEDUP_BACKEND=cosmos needs COSMOS_ENDPOINT")
        codec = env.get("TABLE_BATCH_CODEC", "lean").strip().lower() or "lean"
        if codec not in get_args(BatchCodec):
            raise SettingsError(f"TABLE_BATCH_CODEC={codec!r} must be 'lean' (the lean $batch codec, "
                                "which falls back to the SDK's by itself) or 'sdk'")
        policy = env.get("PAYMENTS_MISSING_KEY_POLICY", "park").strip().lower()
        if policy not in ("park", "sequence"):
            raise SettingsError(f"PAYMENTS_MISSING_KEY_POLICY={policy!r} must be 'park' or 'sequence'")
        window = RedeliveryWindow(
            lock_duration=timedelta(seconds=_int(env, "SERVICEBUS_LOCK_DURATION_SECONDS", 60, 1)),
            max_delivery_count=_int(env, "SERVICEBUS_MAX_DELIVERY_COUNT", 10, 1),
            max_auto_lock_renewal=timedelta(
                seconds=_int(env, "SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS", 300, 0)),
            margin=timedelta(seconds=_int(env, "DEDUP_RETENTION_MARGIN_SECONDS", 86400, 0)),
        )
        # The two-phase lease follows the message lock: shorter than the lock, so a crashed
        # holder's key is free again when the broker redelivers the message (a longer lease
        # makes each redelivery wait and burns the delivery count until the message is
        # dead-lettered); the flow renews it while the handler runs.
        lock_seconds = window.lock_duration.total_seconds()
        lease = timedelta(seconds=_int(env, "DEDUP_LEASE_SECONDS", max(1, int(lock_seconds * 0.9)), 1))
        if lease.total_seconds() >= lock_seconds:
            raise SettingsError(
                f"DEDUP_LEASE_SECONDS={int(lease.total_seconds())} must be shorter than the lock "
                f"(SERVICEBUS_LOCK_DURATION_SECONDS={int(lock_seconds)}): a crashed holder's lease "
                "would outlive the lock and every redelivery would wait until the message is "
                "dead-lettered")
        caller_header = env.get("HTTP_CALLER_HEADER", "").strip() or None
        if caller_header is not None and not _HEADER_NAME.match(caller_header):
            raise SettingsError(f"HTTP_CALLER_HEADER={caller_header!r} must be an HTTP header name "
                                "(letters, digits and !#$%&'*+-.^_`|~)")
        if caller_header is not None and caller_header.lower() == "idempotency-key":
            raise SettingsError("HTTP_CALLER_HEADER must name the header that identifies the "
                                "caller, not Idempotency-Key")
        settings = cls(
            backend=backend,
            cosmos_endpoint=cosmos_endpoint,
            cosmos_key=env.get("COSMOS_KEY") or None,
            cosmos_database=env.get("COSMOS_DATABASE", "idempotency") or "idempotency",
            cosmos_verify_tls=_bool(env, "COSMOS_VERIFY_TLS", True),
            table_endpoint=table_endpoint,
            table_connection_string=table_conn,
            table_batch_codec="sdk" if codec == "sdk" else "lean",
            notification_api_url=_url(env, "NOTIFICATION_API_URL"),
            notification_api_honours_key=_bool(env, "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY", True),
            ttl=timedelta(seconds=_int(env, "DEDUP_TTL_SECONDS", 7 * 86400, 1)),
            lease=lease,
            window=window,
            missing_key_policy=policy,
            payments_max_attempts=_int(env, "PAYMENTS_MAX_ATTEMPTS", 3, 1),
            payments_max_concurrency=_int(env, "PAYMENTS_MAX_CONCURRENCY", 16, 1),
            payments_hub=env.get("PAYMENTS_HUB_NAME", "payments") or "payments",
            payments_consumer_group=env.get("PAYMENTS_CONSUMER_GROUP", "$Default") or "$Default",
            azure_client_id=env.get("AZURE_CLIENT_ID") or None,
            notifications_topic=env.get("NOTIFICATIONS_TOPIC_NAME", "notifications") or "notifications",
            balance_changes_queue=env.get("BALANCE_CHANGES_QUEUE", "balance-changes").strip(),
            service_bus_connection=(env.get(SERVICE_BUS_CONNECTION) or "").strip() or None,
            service_bus_namespace=(env.get(SERVICE_BUS_NAMESPACE) or "").strip() or None,
            outbox_duplicate_detection=timedelta(
                seconds=_int(env, "OUTBOX_DUPLICATE_DETECTION_SECONDS", 2 * 86400, 20)),
            outbox_sweep_age=timedelta(seconds=_int(env, "OUTBOX_SWEEP_AGE_SECONDS", 600, 1)),
            http_caller_header=caller_header,
            log_duplicates=_bool(env, "DEDUP_LOG_DUPLICATES", False),
            trace_sampling_ratio=_ratio(env),
            cosmos_accept_duplicates_across_write_regions=_bool(
                env, "COSMOS_ACCEPT_DUPLICATES_ACROSS_WRITE_REGIONS", False),
            order_audit_queue=_queue_name(env, "ORDER_AUDIT_QUEUE_NAME", "order-audit"),
            queue_max_dequeue_count=_int(env, "QUEUE_MAX_DEQUEUE_COUNT", 5, 1),
            queue_connection=(env.get(QUEUE_CONNECTION) or "").strip() or None,
            queue_service_uri=(env.get(QUEUE_SERVICE_URI) or "").strip() or None,
        )
        settings.idempotency_config()  # the retention rule is a startup error
        settings.check_outbox_window()
        return settings

    def check_outbox_window(self) -> None:
        """Refuse a destination duplicate-detection window shorter than the redelivery window.

        The destinations are the notifications topic and the balance-changes queue; Bicep
        gives both the window of OUTBOX_DUPLICATE_DETECTION_SECONDS.

        A committed message is re-sent (same id) while a copy of its incoming message can
        still arrive, and by the sweeper: inside the destination's window the broker drops
        the re-send; beyond it only the next consumer's dedup would. Like the dedup TTL,
        the window must cover the redelivery horizon (Bicep sets both from one parameter).
        """
        horizon = self.window.length
        if self.outbox_duplicate_detection < horizon:
            raise SettingsError(
                f"OUTBOX_DUPLICATE_DETECTION_SECONDS={int(self.outbox_duplicate_detection.total_seconds())}"
                f" is shorter than the redelivery window ({int(horizon.total_seconds())} s): a "
                "re-dispatch after the broker forgot the first send would reach the destination "
                "again; raise the destinations' duplicateDetectionHistoryTimeWindow (at most 7 days)")
        if self.outbox_duplicate_detection > timedelta(days=7):
            raise SettingsError("OUTBOX_DUPLICATE_DETECTION_SECONDS must be at most 604800 "
                                "(Service Bus keeps at most 7 days of duplicate detection)")

    def idempotency_config(self) -> IdempotencyConfig:
        return IdempotencyConfig(ttl=self.ttl, lease=self.lease, window=self.window)
