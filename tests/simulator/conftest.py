"""Servers for the scenario tests: the harness's own (maintenance reconciles whole stores,
so scenarios stay off the session stack the other suites share)."""

from __future__ import annotations

import pytest

from simulator.stack import SimStack


@pytest.fixture(scope="package")
def sim_endpoints():
    with SimStack(cosmos=True) as endpoints:
        yield endpoints
