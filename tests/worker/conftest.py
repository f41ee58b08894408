"""The real worker with the app loaded (one per test process), and app services on the local
servers installed the way `tests/functions/conftest.py` installs them."""

from __future__ import annotations

import pytest

from functions.services import build_services, configure
from local_stack.worker import WorkerHost, sample_settings
from tests.functions.conftest import FakeNotificationApi, settings_for
from tests.support.settlement import SettlementRecorder
from tests.support.worker_probe import ROOT


@pytest.fixture(scope="session")
def worker() -> WorkerHost:
    """The worker host: app indexed and loaded with the sample settings as its environment."""
    return WorkerHost.start(ROOT, sample_settings(ROOT))


@pytest.fixture
def api() -> FakeNotificationApi:
    return FakeNotificationApi()


@pytest.fixture
def settlements() -> SettlementRecorder:
    return SettlementRecorder()


@pytest.fixture
def services_for(stack, api, clock):
    """Install app services for a backend (the functions reach them through `services()`)."""

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
