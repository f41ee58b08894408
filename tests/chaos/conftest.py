"""Servers of the chaos tests' own: one set per backend (they pause them for outages)."""

from __future__ import annotations

import contextlib
import os

import pytest

from simulator.stack import stack_for

SEED = int(os.environ.get("CHAOS_SEED", "20240"))


@pytest.fixture(scope="package")
def chaos_stacks():
    """Endpoints by backend; the table backend's scenario gets an Azurite of its own."""
    with contextlib.ExitStack() as servers:
        yield {backend: servers.enter_context(stack_for(backend)) for backend in ("table", "cosmos")}


@pytest.fixture(scope="package")
def seed():
    print(f"\nchaos seed: {SEED} (replay with CHAOS_SEED={SEED})")
    return SEED
