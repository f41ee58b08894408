"""The outbox destinations' duplicate-detection window is held to the redelivery window at
startup, as the dedup TTL is: a re-dispatch inside it is dropped by the broker."""

from __future__ import annotations

import pytest

from functions.services import UnconfiguredDispatcher, real_dispatcher
from functions.settings import Settings, SettingsError
from shared._backends.dispatch import ServiceBusDispatcher
from shared._core.exceptions import DispatchRejectedError

BASE = {"TABLE_CONNECTION_STRING": "UseDevelopmentStorage=true",
        "COSMOS_ENDPOINT": "https://localhost:8081/",
        "NOTIFICATION_API_URL": "https://notifications.example/send"}


def test_the_default_window_covers_the_default_redelivery_window():
    settings = Settings.from_env(BASE)
    assert settings.outbox_duplicate_detection >= settings.window.length


def test_a_window_shorter_than_the_redelivery_window_fails_startup():
    with pytest.raises(SettingsError, match="OUTBOX_DUPLICATE_DETECTION_SECONDS=3600"):
        Settings.from_env({**BASE, "OUTBOX_DUPLICATE_DETECTION_SECONDS": "3600"})


def test_a_window_past_what_service_bus_keeps_fails_startup():
    with pytest.raises(SettingsError, match="at most 604800"):
        Settings.from_env({**BASE, "OUTBOX_DUPLICATE_DETECTION_SECONDS": "700000"})


def test_the_dispatcher_follows_the_trigger_connection():
    local = Settings.from_env({**BASE, "ServiceBusConnection": (
        "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;")})
    assert isinstance(real_dispatcher(local), ServiceBusDispatcher)
    azure = Settings.from_env({**BASE, "ServiceBusConnection__fullyQualifiedNamespace":
                               "sb-x.servicebus.windows.net"})
    assert isinstance(real_dispatcher(azure), ServiceBusDispatcher)
    unconfigured = real_dispatcher(Settings.from_env(BASE))
    assert isinstance(unconfigured, UnconfiguredDispatcher)
    with pytest.raises(DispatchRejectedError):
        unconfigured.dispatch([])


def test_the_async_payments_path_gets_an_async_dispatcher_on_the_same_connection():
    """`payments` runs on the event loop: its dispatcher is the aio one (sends awaited), on the
    trigger's connection like the sync one, built and closed with the async stores."""
    import asyncio

    from functions.services import RealAsyncStores
    from shared._backends import dispatch_aio

    local = Settings.from_env({**BASE, "ServiceBusConnection": (
        "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;")})
    stores = RealAsyncStores(local)
    dispatcher = stores.dispatcher()
    assert isinstance(dispatcher, dispatch_aio.ServiceBusDispatcher)
    assert stores.dispatcher() is dispatcher  # one per app
    asyncio.run(stores.aclose())
    assert isinstance(RealAsyncStores(Settings.from_env(BASE)).dispatcher(), UnconfiguredDispatcher)


def test_balance_changes_go_to_the_named_queue_by_default_and_nowhere_when_it_is_empty():
    assert Settings.from_env(BASE).balance_changes_queue == "balance-changes"
    assert Settings.from_env({**BASE, "BALANCE_CHANGES_QUEUE": "bc-2"}).balance_changes_queue == "bc-2"
    assert Settings.from_env({**BASE, "BALANCE_CHANGES_QUEUE": " "}).balance_changes_queue == ""
