"""App settings: one place, clear startup errors, the retention rule enforced."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from functions.settings import SETTING_NAMES, Settings, SettingsError
from shared._core.exceptions import RetentionConfigError

BASE = {"TABLE_CONNECTION_STRING": "UseDevelopmentStorage=true",
        "COSMOS_ENDPOINT": "https://localhost:8081/",
        "NOTIFICATION_API_URL": "https://notifications.example/send"}


def test_defaults_are_valid_and_hold_the_retention_rule():
    settings = Settings.from_env(BASE)
    assert settings.backend == "cosmos"
    assert settings.ttl.total_seconds() == 7 * 86400
    assert settings.idempotency_config().window == settings.window


@pytest.mark.parametrize(("overrides", "message"), [
    ({"DEDUP_BACKEND": "redis"}, "DEDUP_BACKEND"),
    ({"TABLE_CONNECTION_STRING": ""}, "TABLE_ENDPOINT"),
    ({"COSMOS_ENDPOINT": ""}, "COSMOS_ENDPOINT"),
    ({"SERVICEBUS_MAX_DELIVERY_COUNT": "ten"}, "SERVICEBUS_MAX_DELIVERY_COUNT"),
    ({"SERVICEBUS_MAX_DELIVERY_COUNT": "0"}, "at least 1"),
    ({"PAYMENTS_MISSING_KEY_POLICY": "drop"}, "PAYMENTS_MISSING_KEY_POLICY"),
    ({"NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY": "maybe"}, "true or false"),
    ({"NOTIFICATION_API_URL": ""}, "NOTIFICATION_API_URL"),
    ({"NOTIFICATION_API_URL": "notifications/send"}, "absolute http"),
    ({"DEDUP_LOG_DUPLICATES": "sometimes"}, "DEDUP_LOG_DUPLICATES"),
    ({"TRACE_SAMPLING_RATIO": "5%"}, "TRACE_SAMPLING_RATIO"),
    ({"TRACE_SAMPLING_RATIO": "2"}, "between 0 and 1"),
    ({"TABLE_BATCH_CODEC": "fast"}, "TABLE_BATCH_CODEC"),
    ({"ORDER_AUDIT_QUEUE_NAME": "Order_Audit"}, "ORDER_AUDIT_QUEUE_NAME"),
    ({"ORDER_AUDIT_QUEUE_NAME": "a" * 57}, "-poison"),  # the host's poison queue: 63 at most
    ({"QUEUE_MAX_DEQUEUE_COUNT": "0"}, "QUEUE_MAX_DEQUEUE_COUNT"),
])
def test_invalid_settings_fail_with_the_setting_named(overrides, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({**BASE, **overrides})


def test_ttl_shorter_than_the_redelivery_window_fails_startup():
    with pytest.raises(RetentionConfigError, match="redelivery window"):
        Settings.from_env({**BASE, "DEDUP_TTL_SECONDS": "3600",
                           "SERVICEBUS_MAX_DELIVERY_COUNT": "20"})


def test_the_order_audit_queue_settings_and_the_triggers_connection():
    settings = Settings.from_env({**BASE, "AzureWebJobsStorage": "UseDevelopmentStorage=true"})
    assert (settings.order_audit_queue, settings.queue_max_dequeue_count) == ("order-audit", 5)
    assert settings.queue_connection == "UseDevelopmentStorage=true"
    azure = Settings.from_env({**BASE, "AzureWebJobsStorage__queueServiceUri":
                               "https://acct.queue.core.windows.net", "ORDER_AUDIT_QUEUE_NAME": "a" * 56})
    assert azure.queue_connection is None
    assert azure.queue_service_uri == "https://acct.queue.core.windows.net"


def test_the_order_audit_poison_queue_is_reached_through_the_triggers_connection():
    from functions.services import poison_queue

    local = poison_queue(Settings.from_env({**BASE, "AzureWebJobsStorage": "UseDevelopmentStorage=true"}))
    assert local.url == "http://127.0.0.1:10001/devstoreaccount1/order-audit-poison"
    # The trigger's encoding (base64), so the envelopes read like the host's poison messages.
    assert type(local._message_encode_policy).__name__ == "TextBase64EncodePolicy"
    azure = poison_queue(Settings.from_env({**BASE, "AzureWebJobsStorage__queueServiceUri":
                                            "https://acct.queue.core.windows.net"}))
    assert azure.url == "https://acct.queue.core.windows.net/order-audit-poison"
    with pytest.raises(SettingsError, match="AzureWebJobsStorage__queueServiceUri"):
        poison_queue(Settings.from_env(BASE))


def test_table_backend_needs_no_cosmos():
    assert Settings.from_env({"DEDUP_BACKEND": "table", **{k: v for k, v in BASE.items()
                                                            if k != "COSMOS_ENDPOINT"}}).backend \
        == "table"


def test_sample_settings_define_every_setting_and_parse():
    sample = json.loads(Path(__file__).parent.parent.joinpath("local.settings.sample.json").read_text())
    values = sample["Values"]
    assert set(SETTING_NAMES) <= set(values)
    Settings.from_env(values)


def test_telemetry_settings_reach_the_telemetry_and_the_sampler():
    from functions.services import build_services
    from shared._core.observability import DEFAULT_SAMPLING_RATIO
    from shared.testing import InMemoryIdempotencyStore

    defaults = Settings.from_env(BASE)
    assert (defaults.log_duplicates, defaults.trace_sampling_ratio) == (False, DEFAULT_SAMPLING_RATIO)
    chosen = Settings.from_env({**BASE, "DEDUP_LOG_DUPLICATES": "true", "TRACE_SAMPLING_RATIO": "0.2"})
    assert (chosen.log_duplicates, chosen.trace_sampling_ratio) == (True, 0.2)
    for settings in (defaults, chosen):
        services = build_services(settings, stores=lambda role: InMemoryIdempotencyStore())
        assert services.telemetry.log_duplicates is settings.log_duplicates


def test_table_batch_codec_defaults_to_lean_and_reaches_every_table_store(stack):
    from functions.services import RealAsyncStores, real_stores

    assert Settings.from_env(BASE).table_batch_codec == "lean"
    settings = Settings.from_env({**BASE, "DEDUP_BACKEND": "table", "TABLE_BATCH_CODEC": "SDK",
                                  "TABLE_CONNECTION_STRING": stack.table_connection_string})
    assert settings.table_batch_codec == "sdk"
    stores = real_stores(settings)
    async_stores = RealAsyncStores(settings)
    try:
        for role in ("ledger", "dedup", "parked"):
            assert stores(role)._batch_codec == "sdk"  # pyright: ignore[reportAttributeAccessIssue] - the Table store's
            assert async_stores(role)._batch_codec == "sdk"
    finally:
        asyncio.run(async_stores.aclose())


def test_the_batch_codec_setting_names_the_table_stores_codecs():
    """TABLE_BATCH_CODEC accepts exactly what `TableIdempotencyStore(batch_codec=...)` takes."""
    from typing import get_args

    from functions.settings import BatchCodec
    from shared._backends.table_batch import CODECS

    assert get_args(BatchCodec) == CODECS
