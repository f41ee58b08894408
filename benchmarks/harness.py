"""Runs every variant through the same workload and measures it.

Phases, in order, each on a fresh table / container per variant:

1. warm-up (not measured): connections, SDK caches, code paths;
2. new messages, interleaved: the messages are split into rounds and in each
   round every variant (both backends, in a seeded random order) handles its
   slice, so drift on the machine hits all variants alike; per message: store
   requests and latency;
3. duplicates: redeliveries of messages from phase 2, one at a time;
4. Event Hubs: batches handled once (first pass), then a host restart
   (process-local state dropped) and the same batches replayed;
5. concurrent copies: each message delivered as `copies` simultaneous copies
   on separate threads; extra effects show who lets a duplicate through.

Store requests are data-plane requests counted by `benchmarks.counting`;
SDK management requests (account, database, table, container) are counted
apart and reported, never mixed in.
"""

from __future__ import annotations

import contextlib
import gc
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from azure.cosmos import CosmosClient
from azure.data.tables import TableServiceClient

from benchmarks.counting import (
    RequestCounter,
    counted_cosmos_client,
    counted_cosmos_store,
    counted_table_store,
)
from benchmarks.variants import BASELINE, VARIANTS, Variant
from benchmarks.workload import Message, Sizes, Workload, build_workload

BACKENDS = ("table", "cosmos")


@dataclass(frozen=True)
class Endpoints:
    table_connection_string: str
    cosmos_endpoint: str
    cosmos_key: str
    cosmos_verify: bool = True


@dataclass
class VariantResult:
    name: str
    label: str
    backend: str
    project: bool
    new_requests: list[int] = field(default_factory=list)
    new_latency: list[float] = field(default_factory=list)
    new_cpu: list[float] = field(default_factory=list)  # client process CPU (SDK, serialization)
    dup_requests: list[int] = field(default_factory=list)
    dup_latency: list[float] = field(default_factory=list)
    first_batch_requests: list[int] = field(default_factory=list)
    replay_batch_requests: list[int] = field(default_factory=list)
    replay_extra_effects: int = 0
    concurrent_extra_effects: int = 0
    concurrent_requests: int = 0
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    meta_requests: int = 0  # SDK management requests during the measured phases
    retried_calls: int = 0  # wire attempts beyond logical calls (Table client only)


@dataclass
class BenchmarkRun:
    sizes: Sizes
    seed: int
    backends: tuple[str, ...]
    results: list[VariantResult]
    seconds: float
    started_at: str

    def result(self, name: str, backend: str) -> VariantResult | None:
        return next((r for r in self.results if r.name == name and r.backend == backend), None)


@dataclass
class _Slot:
    variant: Variant
    counter: RequestCounter
    result: VariantResult
    cleanup: Callable[[], None] = lambda: None


def _measure(slot: _Slot, action: Callable[[], Any]) -> tuple[Any, int, float, float]:
    """(result, store requests, wall seconds, client CPU seconds) of one action."""
    before = slot.counter.data()
    cpu = time.process_time()
    started = time.perf_counter()
    value = action()
    elapsed = time.perf_counter() - started
    return value, slot.counter.data() - before, elapsed, time.process_time() - cpu


class _Backends:
    """Creates counted stores for each variant, and removes what it created."""

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        self.tables: list[str] = []
        self.database = f"bench-{uuid.uuid4().hex[:8]}"
        self._cosmos_admin: CosmosClient | None = None
        self._clients: list[Any] = []
        self.database_used = False

    def slot(self, name: str, backend: str) -> _Slot:
        counter = RequestCounter(backend)
        if backend == "table":
            table = f"bench{uuid.uuid4().hex[:12]}"
            self.tables.append(table)
            store = counted_table_store(self.endpoints.table_connection_string, table, counter)
            self._clients.append(store)
        else:
            client = counted_cosmos_client(self.endpoints.cosmos_endpoint, self.endpoints.cosmos_key,
                                           counter, verify=self.endpoints.cosmos_verify)
            self._clients.append(client)
            self.database_used = True
            store = counted_cosmos_store(client, self.database, f"c{uuid.uuid4().hex[:12]}")
        cls = VARIANTS[name]
        variant = cls(backend, store)
        result = VariantResult(name, cls.label, backend, cls.project)
        return _Slot(variant, counter, result)

    def close(self) -> None:
        """Best effort: a server that already stopped leaves nothing to remove."""
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.close()
        if self.tables:
            service = TableServiceClient.from_connection_string(self.endpoints.table_connection_string)
            for table in self.tables:
                with contextlib.suppress(Exception):
                    service.delete_table(table)
        if self.database_used:
            with contextlib.suppress(Exception):
                admin = CosmosClient(self.endpoints.cosmos_endpoint, self.endpoints.cosmos_key,
                                     connection_verify=self.endpoints.cosmos_verify)
                admin.delete_database(self.database)
                admin.close()


def _tally(result: VariantResult, phase: str, outcome: str) -> None:
    result.outcomes.setdefault(phase, Counter())[outcome] += 1


def _phase_new(slots: list[_Slot], workload: Workload, sizes: Sizes, rng: random.Random) -> None:
    rounds = max(1, min(sizes.rounds, len(workload.new) or 1))
    chunk = -(-len(workload.new) // rounds) if workload.new else 0
    for r in range(rounds):
        part = workload.new[r * chunk:(r + 1) * chunk]
        order = list(slots)
        rng.shuffle(order)
        gc.collect()
        for slot in order:
            for message in part:
                outcome, requests, elapsed, cpu = _measure(
                    slot, lambda m=message, s=slot: s.variant.handle(m))
                slot.result.new_requests.append(requests)
                slot.result.new_latency.append(elapsed)
                slot.result.new_cpu.append(cpu)
                _tally(slot.result, "new", outcome)


def _phase_duplicates(slot: _Slot, workload: Workload) -> None:
    gc.collect()
    for message in workload.duplicates:
        outcome, requests, elapsed, _ = _measure(slot, lambda m=message: slot.variant.handle(m))
        slot.result.dup_requests.append(requests)
        slot.result.dup_latency.append(elapsed)
        _tally(slot.result, "duplicate", outcome)


def _phase_event_hubs(slot: _Slot, workload: Workload) -> None:
    for batch in workload.batches:
        outcomes, requests, _, _ = _measure(slot, lambda b=batch: slot.variant.handle_batch(b))
        slot.result.first_batch_requests.append(requests)
        for outcome in outcomes:
            _tally(slot.result, "eh_first", outcome)
    slot.variant.restart()
    applied_before = slot.variant.effects.total()
    for batch in workload.batches:
        outcomes, requests, _, _ = _measure(slot, lambda b=batch: slot.variant.handle_batch(b))
        slot.result.replay_batch_requests.append(requests)
        for outcome in outcomes:
            _tally(slot.result, "eh_replay", outcome)
    slot.result.replay_extra_effects = slot.variant.effects.total() - applied_before


def _phase_concurrent(slot: _Slot, workload: Workload, copies: int) -> None:
    if not workload.concurrent:
        return
    before = slot.counter.data()
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=copies) as pool:
        for message in workload.concurrent:
            barrier = threading.Barrier(copies)

            def deliver(m: Message = message, b: threading.Barrier = barrier) -> str:
                b.wait(timeout=30)
                try:
                    return slot.variant.handle(m)
                except Exception as error:
                    return f"error:{type(error).__name__}"

            for future in [pool.submit(deliver) for _ in range(copies)]:
                outcome = future.result(timeout=60)
                with lock:
                    _tally(slot.result, "concurrent", outcome)
    slot.result.concurrent_requests = slot.counter.data() - before
    slot.result.concurrent_extra_effects = slot.variant.effects.extra(
        [m.message_id for m in workload.concurrent])


def run_benchmark(endpoints: Endpoints, sizes: Sizes, *, seed: int = 1,
                  backends: tuple[str, ...] = BACKENDS, variants: tuple[str, ...] | None = None,
                  progress: Callable[[str], None] = lambda _: None) -> BenchmarkRun:
    names = tuple(variants or VARIANTS)
    if BASELINE not in names:
        names = (BASELINE, *names)
    workload = build_workload(sizes, seed)
    rng = random.Random(seed)
    started = time.perf_counter()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    stores = _Backends(endpoints)
    try:
        slots = [stores.slot(name, backend) for backend in backends for name in names]
        progress(f"{len(slots)} variants ready; warming up")
        for slot in slots:
            for message in workload.warmup:
                slot.variant.handle(message)
                slot.variant.handle(message)
            slot.variant.restart()
        meta_before = {id(slot): slot.counter.meta() for slot in slots}
        calls_before = {id(slot): (slot.counter.data("call"), slot.counter.data("wire"))
                        for slot in slots}
        progress(f"new messages: {len(workload.new)} x {len(slots)} variants "
                 f"in {sizes.rounds} interleaved rounds")
        _phase_new(slots, workload, sizes, rng)
        for slot in slots:
            label = f"{slot.result.name} ({slot.result.backend})"
            progress(f"{label}: duplicates, Event Hubs replay, concurrent copies")
            _phase_duplicates(slot, workload)
            _phase_event_hubs(slot, workload)
            _phase_concurrent(slot, workload, sizes.copies)
        for slot in slots:
            slot.result.meta_requests = slot.counter.meta() - meta_before[id(slot)]
            if slot.result.backend == "table":
                calls0, wire0 = calls_before[id(slot)]
                calls = slot.counter.data("call") - calls0
                wire = slot.counter.data("wire") - wire0
                slot.result.retried_calls = wire - calls
    finally:
        stores.close()
    return BenchmarkRun(sizes=sizes, seed=seed, backends=tuple(backends),
                        results=[slot.result for slot in slots],
                        seconds=time.perf_counter() - started, started_at=started_at)
