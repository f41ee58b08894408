"""The real worker with the app loaded (one per test process), and app services on the local
servers installed the way `tests/functions/conftest.py` installs them."""

from __future__ import annotations

import pytest

from local_stack.worker import WorkerHost, sample_settings

# The same app services on the local servers as the function tests (one definition).
from tests.functions.conftest import api, services, services_for  # noqa: F401
from tests.support.settlement import SettlementRecorder
from tests.support.worker_probe import ROOT


@pytest.fixture(scope="session")
def worker() -> WorkerHost:
    """The worker host: app indexed and loaded with the sample settings as its environment."""
    return WorkerHost.start(ROOT, sample_settings(ROOT))


@pytest.fixture
def settlements() -> SettlementRecorder:
    return SettlementRecorder()
