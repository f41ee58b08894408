"""The benchmark runner: every variant through the same seeded workload, measured alike.

One procedure for both modes. A scenario gives each variant, on each backend,
fresh tables / containers behind counted clients (`benchmarks.counting`); warms
every variant up (not measured); runs the measured phase interleaved: the work
is cut into chunks and each chunk is handled by every variant in a seeded random
order, so drift on the machine hits all alike; then runs each variant's other
phases one variant at a time, a host restart (process-local state dropped)
before the replay. Every unit of work is one `Sample`: store requests (exact,
data plane; SDK management requests counted apart), wall time, this process's
CPU time, and the dispatcher's sends and messages.

* Loopback (`run_loopback`), on the servers as they are: new messages (the
  measured phase, in rounds, one sample per message); duplicates (redeliveries);
  Event Hubs batches, first pass, restart, replay; concurrent copies (each
  message delivered as simultaneous copies on threads; extra effects show who
  lets a duplicate through).
* Latency (`run_latency`), behind relays that add each RTT (`benchmarks.rtt`,
  checked before and after): for each account count, payment batches on one
  partition (one sample per batch), then, after a restart, the last batch again
  (the host replays from its last checkpoint). Balances are read back and
  compared with the workload's sums.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from threading import Barrier
from typing import Any

from azure.cosmos import CosmosClient
from azure.data.tables import TableServiceClient

from benchmarks import rtt
from benchmarks.counting import (
    BACKENDS,
    Endpoints,
    RequestCounter,
    SendTally,
    counted_async_cosmos_client,
    counted_async_table_store,
    counted_cosmos_client,
    counted_cosmos_store,
    counted_table_store,
    pooled_transport,
)
from benchmarks.hash_cost import HashCost, measure, payment_contents
from benchmarks.stats import Figures, Sample, figures
from benchmarks.variants import (
    BASELINE,
    LATENCY_VARIANTS,
    LOOPBACK_VARIANTS,
    MessageVariant,
    PaymentVariant,
    Setup,
    StoreSet,
    Variant,
    balance_of,
)
from benchmarks.workload import (
    LatencySizes,
    Message,
    PaymentWorkload,
    Sizes,
    build_payment_workload,
    build_workload,
)
from functions.services import build_services
from functions.settings import Settings
from local_stack.relay import Relay
from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore
from shared.testing import InMemoryIdempotencyStore

__all__ = ["BACKENDS", "Endpoints", "Result", "Run", "run_latency", "run_loopback"]

PARTITION = "0"
WARMUP_PARTITION = "warmup"
DEFAULT_CONCURRENCY = 16
POOL_SIZE = 64  # connections per host: requests keeps 10, and each new one costs a handshake
Progress = Callable[[str], None]


@dataclass
class Result:
    name: str
    label: str
    backend: str
    project: bool
    dedup: bool
    main: str  # the interleaved phase the report rates
    rtt_ms: float = 0.0  # nominal added RTT (latency mode)
    accounts: int = 0  # latency mode
    phases: dict[str, list[Sample]] = field(default_factory=dict[str, list[Sample]])
    outcomes: dict[str, Counter[str]] = field(default_factory=dict[str, Counter[str]])
    meta_requests: int = 0  # SDK management requests during the measured phases
    retried_calls: int = 0  # requests sent again (Table: SDK retries; Cosmos: transport failures)
    replay_extra_effects: int = 0  # loopback: effects applied again by the replay
    concurrent_extra_effects: int = 0
    balances_checked: int = 0  # latency
    balance_mismatches: int = 0

    def samples(self, phase: str) -> list[Sample]:
        return self.phases.get(phase, [])

    def figures(self, phase: str | None = None) -> Figures:
        return figures(self.samples(phase or self.main))

    @property
    def events(self) -> int:
        return sum(s.events for s in self.samples(self.main))

    @property
    def cpu_seconds(self) -> float:
        return sum(s.cpu for s in self.samples(self.main))

    @property
    def events_per_second(self) -> float:
        return self.figures().events_per_second


@dataclass
class Run:
    mode: str  # "loopback" or "latency"
    sizes: Sizes | LatencySizes
    seed: int
    backends: tuple[str, ...]
    variants: tuple[str, ...]
    results: list[Result]
    started_at: str
    seconds: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    rtts: tuple[float, ...] = ()
    probes: list[rtt.Probe] = field(default_factory=list[rtt.Probe])
    hash_cost: HashCost | None = None  # the request hash's CPU per event, canonical vs previous

    def result(self, name: str, backend: str, *, rtt_ms: float = 0.0,
               accounts: int = 0) -> Result | None:
        return next((r for r in self.results if (r.name, r.backend, r.rtt_ms, r.accounts)
                     == (name, backend, rtt_ms, accounts)), None)

    def probes_of(self, rtt_ms: float, backend: str) -> list[rtt.Probe]:
        return [p for p in self.probes if (p.nominal_ms, p.backend) == (rtt_ms, backend)]

    def added_ms(self, rtt_ms: float, backend: str) -> float:
        """Mean of the added RTTs measured before and after this RTT's scenarios."""
        found = self.probes_of(rtt_ms, backend)
        return sum(p.added_ms for p in found) / len(found) if found else float("nan")


# -- stores --------------------------------------------------------------------------------------
class Stores:
    """Counted stores on fresh tables / containers for each variant; removes them at the end.

    Behind relays (`admin`: the direct endpoints, for the cleanup) the clients keep
    `pool_size` connections per host and ignore proxy variables, and Cosmos endpoint
    discovery is off (`benchmarks.rtt`); otherwise the SDKs' defaults, as against an account.
    """

    def __init__(self, endpoints: Endpoints, *, admin: Endpoints | None = None,
                 pool_size: int = POOL_SIZE) -> None:
        self.endpoints = endpoints
        self.admin = admin or endpoints
        self.relayed = admin is not None
        self.pool_size = pool_size
        self.database = f"bench-{uuid.uuid4().hex[:8]}"
        self.database_used = False
        self.tables: list[str] = []
        self.closables: list[Any] = []
        self.async_closables: list[Any] = []
        self.loop = asyncio.Runner()  # the async variants' event loop (their clients live on it)

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _table(self, counter: RequestCounter, aio: bool) -> tuple[Any, Any]:
        name = f"bench{uuid.uuid4().hex[:12]}"
        self.tables.append(name)
        connection = self.endpoints.table_connection_string
        options = {"transport": pooled_transport(self.pool_size)} if self.relayed else {}
        store = counted_table_store(connection, name, counter, **options)
        self.closables.append(store)
        if not aio:
            return store, None
        async_store = counted_async_table_store(connection, name, counter)
        self.async_closables.append(async_store)
        return store, async_store

    def make(self, backend: str, roles: Sequence[str], *, aio: bool
             ) -> tuple[StoreSet, list[RequestCounter]]:
        """A variant's stores by role (the parking lot always in Table Storage) and its counters."""
        table_counter = RequestCounter("table")
        if backend == "table":
            return self._set({role: self._table(table_counter, aio) for role in roles}), [table_counter]
        counter = RequestCounter("cosmos")
        e = self.endpoints
        relayed = {"pool_size": self.pool_size, "enable_endpoint_discovery": False}
        client = counted_cosmos_client(e.cosmos_endpoint, e.cosmos_key, counter,
                                       verify=e.cosmos_verify, **(relayed if self.relayed else {}))
        self.closables.append(client)
        async_client = None
        if aio:
            async_client = self.loop.run(counted_async_cosmos_client(
                e.cosmos_endpoint, e.cosmos_key, counter, verify=e.cosmos_verify,
                enable_endpoint_discovery=not self.relayed))
            self.async_closables.append(async_client)
        self.database_used = True
        made: dict[str, tuple[Any, Any]] = {}
        for role in roles:
            if role == "parked":
                made[role] = self._table(table_counter, aio)
                continue
            store = counted_cosmos_store(client, self.database, f"{role}-{uuid.uuid4().hex[:8]}")
            made[role] = (store, None if async_client is None else
                          AsyncCosmosIdempotencyStore.from_container(
                              async_client.get_database_client(self.database)
                              .get_container_client(store.container.id)))
        return self._set(made), [counter, table_counter]

    def _set(self, made: dict[str, tuple[Any, Any]]) -> StoreSet:
        return StoreSet(sync={role: pair[0] for role, pair in made.items()},
                        aio={role: pair[1] for role, pair in made.items() if pair[1] is not None},
                        run=self.loop.run)

    def close(self) -> None:
        """Best effort: a server that already stopped leaves nothing to remove."""
        for closable in self.closables:
            with contextlib.suppress(Exception):
                closable.close()
        for closable in self.async_closables:
            with contextlib.suppress(Exception):
                self.loop.run(closable.close())
        self.loop.close()
        if self.tables:
            service = TableServiceClient.from_connection_string(self.admin.table_connection_string)
            for table in self.tables:
                with contextlib.suppress(Exception):
                    service.delete_table(table)
        if self.database_used:
            with contextlib.suppress(Exception):
                admin = CosmosClient(self.admin.cosmos_endpoint, self.admin.cosmos_key,
                                     connection_verify=self.admin.cosmos_verify)
                admin.delete_database(self.database)
                admin.close()


# -- one variant on one backend ------------------------------------------------------------------
@dataclass
class Slot:
    variant: Any  # a MessageVariant (loopback) or a PaymentVariant (latency)
    counters: list[RequestCounter]
    tally: SendTally
    result: Result
    _before: tuple[int, int] = (0, 0)

    def data(self) -> int:
        return sum(c.data() for c in self.counters)

    def meta(self) -> int:
        return sum(c.meta() for c in self.counters)

    def retried(self) -> int:
        """Requests sent again: Table wire attempts beyond calls, Cosmos transport failures."""
        return sum(c.data("wire") - c.data("call") if c.backend == "table" else c.error_count()
                   for c in self.counters)

    def measure(self, phase: str, action: Callable[[], Any], *, events: int = 1,
                accounts: int = 0) -> Any:
        """Runs `action` as one sample of `phase`; a returned outcome (or list) is tallied."""
        data, retried, sends, messages = (self.data(), self.retried(), self.tally.sends,
                                          self.tally.messages)
        cpu = time.process_time()
        started = time.perf_counter()
        value = action()
        elapsed = time.perf_counter() - started
        self.result.phases.setdefault(phase, []).append(Sample(
            self.data() - data, self.retried() - retried, elapsed, time.process_time() - cpu,
            events, accounts, self.tally.sends - sends, self.tally.messages - messages))
        self.tally_outcomes(phase, value)
        return value

    def tally_outcomes(self, phase: str, value: Any) -> None:
        outcomes = self.result.outcomes.setdefault(phase, Counter())
        if isinstance(value, str):
            outcomes[value] += 1
        elif isinstance(value, list):
            outcomes.update(str(v) for v in value)

    def start(self) -> None:
        """The measured phases begin: management requests and resends are counted from here."""
        self._before = (self.meta(), self.retried())

    def finish(self) -> None:
        self.result.meta_requests = self.meta() - self._before[0]
        self.result.retried_calls = self.retried() - self._before[1]
        if self.variant.outcomes:
            self.result.outcomes["variant"] = Counter(self.variant.outcomes)


@contextlib.contextmanager
def _slots(stores: Stores, registry: Mapping[str, type[Variant]], names: Sequence[str],
           backends: Sequence[str], *, main: str, rtt_ms: float = 0.0, accounts: int = 0,
           env: Callable[[str], Mapping[str, str]] = lambda _b: {},
           concurrency: int = DEFAULT_CONCURRENCY,
           clock: Callable[[], float] = time.time) -> Iterator[list[Slot]]:
    """Each variant on each backend, on its own stores; closed afterwards. `clock`: the app's
    and the same-transactions variant's (a test freezes it to compare their bytes)."""
    slots: list[Slot] = []
    try:
        for backend in backends:
            for name in names:
                cls = registry[name]
                made, counters = stores.make(backend, cls.roles, aio=cls.aio)
                tally = SendTally()
                variant = cls(Setup(backend, made, tally, rtt_ms, env(backend), concurrency,
                                    tuple(counters), clock))
                slots.append(Slot(variant, counters, tally, Result(
                    name, cls.label, backend, cls.project, cls.dedup, main, rtt_ms, accounts)))
        yield slots
    finally:
        for slot in slots:
            slot.variant.close()


def _interleave[C](slots: list[Slot], chunks: Sequence[C], rng: random.Random,
                   handle: Callable[[Slot, C], None],
                   progress: Callable[[int], None] = lambda _i: None) -> None:
    """Each chunk handled by every slot, in a seeded random order per chunk."""
    for index, chunk in enumerate(chunks):
        order = list(slots)
        rng.shuffle(order)
        gc.collect()
        for slot in order:
            handle(slot, chunk)
        progress(index)


def _run(mode: str, sizes: Sizes | LatencySizes, seed: int, backends: Sequence[str],
         names: Sequence[str], body: Callable[[], tuple[list[Result], list[rtt.Probe]]],
         **extra: Any) -> Run:
    started = time.perf_counter()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()
    results, probes = body()
    return Run(mode=mode, sizes=sizes, seed=seed, backends=tuple(backends), variants=tuple(names),
               results=results, probes=probes, started_at=started_at,
               seconds=time.perf_counter() - started, load_before=load_before,
               load_after=os.getloadavg(), **extra)


# -- loopback ------------------------------------------------------------------------------------
def run_loopback(endpoints: Endpoints, sizes: Sizes, *, seed: int = 1,
                 backends: Sequence[str] = BACKENDS, variants: Sequence[str] | None = None,
                 progress: Progress = lambda _: None) -> Run:
    names = tuple(variants or LOOPBACK_VARIANTS)
    if BASELINE not in names:
        names = (BASELINE, *names)

    def body() -> tuple[list[Result], list[rtt.Probe]]:
        workload = build_workload(sizes, seed)
        with Stores(endpoints) as stores, \
                _slots(stores, LOOPBACK_VARIANTS, names, backends, main="new") as slots:
            progress(f"{len(slots)} variants ready; warming up")
            for slot in slots:
                for message in workload.warmup:
                    slot.variant.handle(message)
                    slot.variant.handle(message)
                slot.variant.restart()
                slot.start()
            progress(f"new messages: {len(workload.new)} x {len(slots)} variants "
                     f"in {sizes.rounds} interleaved rounds")
            rounds = max(1, min(sizes.rounds, len(workload.new) or 1))
            chunk = -(-len(workload.new) // rounds) if workload.new else 0

            def handle_new(slot: Slot, part: list[Message]) -> None:
                for message in part:
                    slot.measure("new", lambda m=message: slot.variant.handle(m))

            _interleave(slots, [workload.new[r * chunk:(r + 1) * chunk] for r in range(rounds)],
                        random.Random(seed), handle_new)
            for slot in slots:
                progress(f"{slot.result.name} ({slot.result.backend}): duplicates, "
                         "Event Hubs replay, concurrent copies")
                _loopback_phases(slot, slot.variant, workload.duplicates, workload.batches,
                                 workload.concurrent, sizes.copies)
                slot.finish()
            return [slot.result for slot in slots], []

    return _run("loopback", sizes, seed, backends, names, body)


def _loopback_phases(slot: Slot, variant: MessageVariant, duplicates: list[Message],
                     batches: list[list[Message]], concurrent: list[Message], copies: int) -> None:
    gc.collect()
    for message in duplicates:
        slot.measure("duplicate", lambda m=message: variant.handle(m))
    for batch in batches:
        slot.measure("first_pass", lambda b=batch: variant.handle_batch(b), events=len(batch))
    variant.restart()
    applied = variant.effects.total()
    for batch in batches:
        slot.measure("replay", lambda b=batch: variant.handle_batch(b), events=len(batch))
    slot.result.replay_extra_effects = variant.effects.total() - applied
    if not concurrent:
        return

    def deliver(message: Message, barrier: Barrier) -> str:
        barrier.wait(timeout=30)
        try:
            return variant.handle(message)
        except Exception as error:
            return f"error:{type(error).__name__}"

    def race() -> list[str]:
        outcomes: list[str] = []
        with ThreadPoolExecutor(max_workers=copies) as pool:
            for message in concurrent:
                barrier = Barrier(copies)
                futures = [pool.submit(deliver, message, barrier) for _ in range(copies)]
                outcomes += [future.result(timeout=60) for future in futures]
        return outcomes

    slot.measure("concurrent", race, events=len(concurrent) * copies)
    slot.result.concurrent_extra_effects = variant.effects.extra([m.message_id for m in concurrent])


# -- latency -------------------------------------------------------------------------------------
def app_env(backend: str, endpoints: Endpoints) -> dict[str, str]:
    """App settings pointing at `endpoints`, every other setting at its default."""
    return {
        "DEDUP_BACKEND": backend,
        "TABLE_CONNECTION_STRING": endpoints.table_connection_string,
        "COSMOS_ENDPOINT": endpoints.cosmos_endpoint,
        "COSMOS_KEY": endpoints.cosmos_key,
        "COSMOS_VERIFY_TLS": "true" if endpoints.cosmos_verify else "false",
        "NOTIFICATION_API_URL": "http://127.0.0.1:9/unused",  # required; payments never call it
    }


def app_concurrency(settings: Settings, default: int = DEFAULT_CONCURRENCY) -> int:
    """The bound the app puts on concurrent account groups (`default` when it has none)."""
    services = build_services(settings, stores=lambda _role: InMemoryIdempotencyStore())
    value = getattr(services.payments, "max_concurrency", None)
    return value if isinstance(value, int) and value > 0 else default


def _verify(slot: Slot, variant: PaymentVariant, workload: PaymentWorkload) -> None:
    """Balances after the run: every batch once, plus the replayed one again without dedup."""
    expected = dict(workload.expected)
    if not variant.dedup:
        for account, cents in workload.batch_delta(workload.batches[-1]).items():
            expected[account] += cents
    store = variant.stores.sync["ledger"]
    slot.result.balances_checked = len(expected)
    slot.result.balance_mismatches = sum(1 for account, cents in expected.items()
                                         if (balance_of(store, account) or 0) != cents)


def run_scenario(direct: Endpoints, relayed: Endpoints, *, rtt_ms: float, accounts: int,
                 sizes: LatencySizes, seed: int, backends: Sequence[str], variants: Sequence[str],
                 progress: Progress = lambda _: None) -> list[Result]:
    """One RTT and account count: every variant on every backend, interleaved per batch."""
    workload = build_payment_workload(events=sizes.events, accounts=accounts,
                                      batch_size=sizes.batch_size, seed=seed,
                                      warmup_events=sizes.warmup_events)
    concurrency = sizes.concurrency or DEFAULT_CONCURRENCY
    where = f"rtt {rtt_ms:g} ms, {accounts} accounts"
    with Stores(relayed, admin=direct, pool_size=max(POOL_SIZE, concurrency)) as stores, \
            _slots(stores, LATENCY_VARIANTS, variants, backends, main="batches", rtt_ms=rtt_ms,
                   accounts=accounts, env=lambda backend: app_env(backend, relayed),
                   concurrency=concurrency) as slots:
        progress(f"{where}: {len(slots)} variants ready; warming up")
        for slot in slots:
            for start in range(0, len(workload.warmup), sizes.batch_size):
                slot.variant.process(workload.warmup[start:start + sizes.batch_size],
                                     WARMUP_PARTITION)
            slot.start()

        def handle(slot: Slot, batch: list[Any]) -> None:
            slot.measure("batches", lambda: slot.variant.process(batch, PARTITION),
                         events=len(batch), accounts=len(workload.accounts_in(batch)))

        def report(index: int) -> None:
            if index % 5 == 4:
                progress(f"{where}: batch {index + 1}/{len(workload.batches)}")

        _interleave(slots, workload.batches, random.Random(f"{seed}-{rtt_ms}-{accounts}"),
                    handle, report)
        last = workload.batches[-1]
        for slot in slots:  # a host restart, then the last checkpointed batch again
            slot.variant.restart()
            slot.measure("replay", lambda s=slot: s.variant.process(last, PARTITION),
                         events=len(last), accounts=len(workload.accounts_in(last)))
        for slot in slots:
            slot.finish()
            _verify(slot, slot.variant, workload)
        return [slot.result for slot in slots]


def run_latency(direct: Endpoints, sizes: LatencySizes, rtts: Sequence[float], *, seed: int = 1,
                backends: Sequence[str] = BACKENDS, variants: Sequence[str] | None = None,
                progress: Progress = lambda _: None) -> Run:
    """Every RTT behind fresh relays, its RTT checked before and after its scenarios."""
    names = tuple(variants or LATENCY_VARIANTS)
    if sizes.concurrency is None:
        sizes = replace(sizes, concurrency=app_concurrency(
            Settings.from_env(app_env(backends[0], direct))))
    ports = {"table": rtt.table_port(direct.table_connection_string),
             "cosmos": rtt.cosmos_port(direct.cosmos_endpoint)}

    def body() -> tuple[list[Result], list[rtt.Probe]]:
        probes: list[rtt.Probe] = []
        results: list[Result] = []
        for rtt_ms in rtts:
            with Relay(ports["table"], delay_ms=rtt_ms / 2) as table_relay, \
                    Relay(ports["cosmos"], delay_ms=rtt_ms / 2) as cosmos_relay:
                relayed = rtt.relayed_endpoints(direct, table_relay.port, cosmos_relay.port)
                for when in ("before", "after"):
                    if when == "after":
                        for accounts in sizes.accounts:
                            results += run_scenario(direct, relayed, rtt_ms=rtt_ms,
                                                    accounts=accounts, sizes=sizes, seed=seed,
                                                    backends=backends, variants=names,
                                                    progress=progress)
                    measured = rtt.probe_rtt(direct, relayed, rtt_ms, reads=sizes.probe_reads,
                                             backends=tuple(backends), when=when)
                    progress(f"rtt check ({when}): " + ", ".join(
                        f"{p.backend} +{p.added_ms:.2f} ms (direct {p.direct_ms:.2f} ms)"
                        for p in measured))
                    rtt.check_probes(measured)  # through the module: a profile may switch it off
                    probes += measured
        return results, probes

    return _run("latency", sizes, seed, backends, names, body, rtts=tuple(rtts),
                hash_cost=measure(payment_contents(events=sizes.events, seed=seed)))
