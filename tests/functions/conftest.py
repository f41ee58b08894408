"""Fixtures for invoking the registered functions against the real local servers."""

from __future__ import annotations

import asyncio
import inspect
import uuid

import pytest

from functions.services import build_services, real_stores
from functions.settings import Settings
from simulator.faults import FakeNotificationApi
from simulator.host_inputs import indexed_functions
from tests.support.doubles import FailingDispatcher
from tests.support.services import installing


def settings_for(stack, backend: str, **overrides: str) -> Settings:
    env = {
        "DEDUP_BACKEND": backend,
        "TABLE_CONNECTION_STRING": stack.table_connection_string,
        "COSMOS_ENDPOINT": stack.cosmos_endpoint,
        "COSMOS_KEY": stack.cosmos_key,
        "COSMOS_VERIFY_TLS": "true" if stack.cosmos_verify else "false",
        "COSMOS_DATABASE": "functions-tests",
        "NOTIFICATION_API_URL": "http://notifications.invalid/send",
        # A unique hub name per test keeps high-water marks apart.
        "PAYMENTS_HUB_NAME": f"payments-{uuid.uuid4().hex[:8]}",
        "PAYMENTS_CONSUMER_GROUP": "payments-processor",
        **overrides,
    }
    return Settings.from_env(env)


@pytest.fixture
def api() -> FakeNotificationApi:
    return FakeNotificationApi()


@pytest.fixture
def services_for(stack, api, clock):
    """Install app services for a backend; returns them. Undone after the test."""

    with installing() as use:
        def install(backend: str, **overrides: str):
            settings = settings_for(stack, backend, **overrides)
            # Real stores; the async payments path runs on them through threads (loop-agnostic:
            # each test may run its own loop). tests/worker covers the real async stores.
            return use(build_services(settings, stores=real_stores(settings), sender=api,
                                      clock=clock, sleep=lambda _: None,
                                      dispatcher=FailingDispatcher()))

        yield install


@pytest.fixture
def services(services_for, backend):
    return services_for(backend)


def registered_functions() -> tuple:
    return indexed_functions()


def function(name: str):
    """The user function registered under `name`, called as the worker would call it (an
    `async def` one awaited on an event loop of its own)."""
    for fn in registered_functions():
        if fn.get_function_name() == name:
            user = fn.get_user_function()
            if inspect.iscoroutinefunction(user):
                return lambda *args, **kwargs: asyncio.run(user(*args, **kwargs))
            return user
    raise KeyError(name)
