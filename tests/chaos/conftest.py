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


def run_in_workers(configs, stacks, log_dir):
    """Run one scenario per backend at once, each in a worker process (as the demo does);
    returns {backend: {"report", "summary", "ok"}} (a backend whose worker died is missing)."""
    import multiprocessing
    import queue

    from demo.worker import run_backend

    context = multiprocessing.get_context("spawn")
    updates = context.Queue()
    workers = []
    for backend, config in configs.items():
        worker = context.Process(target=run_backend, args=(config, stacks[backend], updates,
                                                           str(log_dir / f"{backend}-{config.tag}.log")))
        worker.start()
        workers.append(worker)
    results = {}
    while len(results) < len(configs):
        try:
            kind, backend, *rest = updates.get(timeout=5)
        except queue.Empty:
            if not any(w.is_alive() for w in workers):
                break
            continue
        if kind in ("done", "failed"):
            results[backend] = {"report": rest[0], "summary": rest[1], "ok": rest[2]}
    for worker in workers:
        worker.join(timeout=30)
    return results
