"""A local stack of the chaos tests' own (keep-alive Cosmos server; they pause its processes)."""

from __future__ import annotations

import os

import pytest

from simulator.stack import endpoints, local_stack

SEED = int(os.environ.get("CHAOS_SEED", "20240"))


@pytest.fixture(scope="package")
def chaos_endpoints():
    with local_stack() as stack:
        yield endpoints(stack)


@pytest.fixture(scope="package")
def seed():
    print(f"\nchaos seed: {SEED} (replay with CHAOS_SEED={SEED})")
    return SEED
