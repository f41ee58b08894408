"""Fixtures for invoking the registered functions against the real local servers."""

from __future__ import annotations

import uuid

import pytest

from function_app import indexed_functions
from functions.services import build_services, configure
from functions.settings import Settings
from simulator.faults import FakeNotificationApi


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

    def install(backend: str, **overrides: str):
        services = build_services(settings_for(stack, backend, **overrides), sender=api,
                                  clock=clock, sleep=lambda _: None)
        configure(services)
        return services

    yield install
    configure(None)


@pytest.fixture
def services(services_for, backend):
    return services_for(backend)


def registered_functions() -> tuple:
    return indexed_functions()


def function(name: str):
    """The user function registered under `name`, as the worker would call it."""
    for fn in registered_functions():
        if fn.get_function_name() == name:
            return fn.get_user_function()
    raise KeyError(name)
