"""Latency mode: the payment consumers behind relays that add network round-trip time.

For each RTT, one relay (`local_stack.relay`, a child process) runs in front
of Azurite's table port and one in front of the Cosmos server. The added RTT
is checked first with point reads (direct vs through the relay, alternated;
the Cosmos client has endpoint discovery off, or it would follow the
address the local server advertises and go around the relay). Then, for each
account count, every variant on both backends handles the same batches on
fresh tables / containers: a warm-up batch on another partition (not
measured), the batches in order, interleaved (each batch is handled by every
variant in a seeded random order, so drift on the machine hits all alike),
and finally, after a simulated host restart, a replay of the last batch (the
host replays from its last checkpoint). Balances are read back afterwards
(not measured) and compared with the workload's sums.

Per variant: wall time, client process CPU time (the relays and servers are
other processes) and data-plane store requests (exact, `benchmarks.counting`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import os
import random
import re
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from azure.cosmos import CosmosClient, PartitionKey
from azure.data.tables import TableClient, TableServiceClient

from benchmarks.counting import (
    RequestCounter,
    counted_async_cosmos_client,
    counted_async_table_store,
    counted_cosmos_client,
    counted_cosmos_store,
    counted_table_store,
    pooled_transport,
)
from benchmarks.harness import BACKENDS, Endpoints
from benchmarks.hash_cost import HashCost, measure, payment_contents
from benchmarks.latency_variants import (
    LATENCY_VARIANTS,
    PaymentStores,
    PaymentVariant,
    PaymentWorkload,
    balance_of,
    build_payment_workload,
)
from functions.services import build_services
from functions.settings import Settings
from local_stack.relay import Relay
from shared import AsyncCosmosIdempotencyStore, InMemoryIdempotencyStore

PARTITION = "0"
DEFAULT_CONCURRENCY = 16
WARMUP_PARTITION = "warmup"


class RttNotVerifiedError(RuntimeError):
    """The point reads through a relay were not slower by the RTT it should add."""


@dataclass(frozen=True)
class LatencySizes:
    events: int = 2000
    batch_size: int = 100
    accounts: tuple[int, ...] = (20, 200)
    warmup_events: int = 100
    # Threads of the no-dedup grouped limit; None: the app's own bound
    # (PartitionBatchProcessor.max_concurrency)
    concurrency: int | None = None
    probe_reads: int = 30  # point reads per path (direct, relayed) when checking the RTT


@dataclass
class Probe:
    """Median point-read latency without and with the relay."""

    backend: str
    nominal_ms: float
    direct_ms: float
    relayed_ms: float
    reads: int
    when: str = "before"  # the scenarios of this RTT: checked before and after them

    @property
    def added_ms(self) -> float:
        return self.relayed_ms - self.direct_ms


@dataclass
class LatencyResult:
    rtt_ms: float  # nominal
    accounts: int
    backend: str
    name: str
    label: str
    dedup: bool
    events: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    requests: int = 0
    batch_requests: list[int] = field(default_factory=list)
    batch_seconds: list[float] = field(default_factory=list)
    batch_accounts: list[int] = field(default_factory=list)
    batch_events: list[int] = field(default_factory=list)
    batch_retried: list[int] = field(default_factory=list)  # requests sent again after a failure
    replay_events: int = 0
    replay_requests: int = 0
    replay_retried: int = 0  # of those, sent again after a transport failure
    replay_seconds: float = 0.0
    meta_requests: int = 0
    retried_calls: int = 0  # requests sent again (Table: SDK retries; Cosmos: transport failures)
    balances_checked: int = 0
    balance_mismatches: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else float("nan")


@dataclass
class LatencyRun:
    sizes: LatencySizes
    seed: int
    rtts: tuple[float, ...]
    backends: tuple[str, ...]
    variants: tuple[str, ...]
    probes: list[Probe]
    results: list[LatencyResult]
    started_at: str
    seconds: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    hash_cost: HashCost | None = None  # the request hash's CPU per event, canonical vs previous

    def result(self, rtt: float, accounts: int, backend: str, name: str) -> LatencyResult | None:
        return next((r for r in self.results if (r.rtt_ms, r.accounts, r.backend, r.name)
                     == (rtt, accounts, backend, name)), None)

    def probes_of(self, rtt: float, backend: str) -> list[Probe]:
        return [p for p in self.probes if (p.nominal_ms, p.backend) == (rtt, backend)]

    def added_ms(self, rtt: float, backend: str) -> float:
        """Mean of the added RTTs measured before and after this RTT's scenarios."""
        found = self.probes_of(rtt, backend)
        return sum(p.added_ms for p in found) / len(found) if found else float("nan")


# -- endpoints --------------------------------------------------------------------------------
_TABLE_ENDPOINT = re.compile(r"(TableEndpoint=https?://)([^:/;]+):(\d+)")


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def table_port(connection_string: str) -> int:
    match = _TABLE_ENDPOINT.search(connection_string)
    if match is None or not _loopback(match.group(2)):
        raise ValueError("latency mode needs the local Azurite (a loopback TableEndpoint)")
    return int(match.group(3))


def cosmos_port(endpoint: str) -> int:
    parts = urlsplit(endpoint)
    if not parts.hostname or not _loopback(parts.hostname) or parts.port is None:
        raise ValueError("latency mode needs the local Cosmos server (a loopback endpoint)")
    return parts.port


def relayed_endpoints(direct: Endpoints, table_relay_port: int, cosmos_relay_port: int) -> Endpoints:
    table = _TABLE_ENDPOINT.sub(lambda m: f"{m.group(1)}127.0.0.1:{table_relay_port}",
                                direct.table_connection_string)
    parts = urlsplit(direct.cosmos_endpoint)
    cosmos = urlunsplit((parts.scheme, f"127.0.0.1:{cosmos_relay_port}", parts.path or "/",
                         parts.query, parts.fragment))
    return Endpoints(table, cosmos, direct.cosmos_key, direct.cosmos_verify)


def cosmos_client(endpoints: Endpoints, **options: Any) -> CosmosClient:
    """A plain client for the local server: endpoint discovery off (see the module docstring)."""
    return CosmosClient(endpoints.cosmos_endpoint, endpoints.cosmos_key,
                        connection_verify=endpoints.cosmos_verify, enable_endpoint_discovery=False,
                        **options)


# -- RTT check ----------------------------------------------------------------------------------
def _median_reads(readers: list[Callable[[], Any]], reads: int) -> list[float]:
    """Alternates the readers (so drift hits all alike); median milliseconds of each."""
    for read in readers:  # connections, caches
        for _ in range(3):
            read()
    samples: list[list[float]] = [[] for _ in readers]
    for _ in range(reads):
        for index, read in enumerate(readers):
            started = time.perf_counter()
            read()
            samples[index].append((time.perf_counter() - started) * 1000)
    return [statistics.median(s) for s in samples]


def probe_rtt(direct: Endpoints, relayed: Endpoints, nominal_ms: float, *, reads: int,
              backends: tuple[str, ...], when: str = "before") -> list[Probe]:
    """Point reads of one small document, directly and through the relay."""
    probes = []
    if "table" in backends:
        name = f"probe{uuid.uuid4().hex[:12]}"
        service = TableServiceClient.from_connection_string(direct.table_connection_string)
        service.create_table(name)
        clients = [TableClient.from_connection_string(e.table_connection_string, name,
                                                      transport=pooled_transport(4))
                   for e in (direct, relayed)]
        try:
            clients[0].create_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})
            fast, slow = _median_reads([lambda c=c: c.get_entity("p", "r") for c in clients], reads)
            probes.append(Probe("table", nominal_ms, fast, slow, reads, when))
        finally:
            for client in clients:
                client.close()
            with contextlib.suppress(Exception):
                service.delete_table(name)
    if "cosmos" in backends:
        database = f"probe-{uuid.uuid4().hex[:8]}"
        clients = [cosmos_client(e, transport=pooled_transport(4, verify=e.cosmos_verify))
                   for e in (direct, relayed)]
        try:
            created = clients[0].create_database_if_not_exists(database)
            created.create_container("c", PartitionKey("/pk")).create_item({"id": "r", "pk": "p"})
            containers = [c.get_database_client(database).get_container_client("c") for c in clients]
            fast, slow = _median_reads([lambda c=c: c.read_item("r", "p") for c in containers], reads)
            probes.append(Probe("cosmos", nominal_ms, fast, slow, reads, when))
        finally:
            with contextlib.suppress(Exception):
                clients[0].delete_database(database)
            for client in clients:
                client.close()
    return probes


def check_probes(probes: list[Probe]) -> None:
    for probe in probes:
        if probe.nominal_ms > 0 and probe.added_ms < 0.5 * probe.nominal_ms:
            raise RttNotVerifiedError(
                f"{probe.backend}: point reads through the relay were only {probe.added_ms:.2f} ms "
                f"slower than direct ones (expected about {probe.nominal_ms:g} ms): the client is "
                "not going through the relay (Cosmos: endpoint discovery must be off)")


# -- stores per variant ----------------------------------------------------------------------------
@dataclass
class _Slot:
    variant: PaymentVariant
    counters: list[RequestCounter]
    result: LatencyResult

    def data(self) -> int:
        return sum(c.data() for c in self.counters)

    def meta(self) -> int:
        return sum(c.meta() for c in self.counters)

    def retried(self) -> int:
        """Requests sent again: Table wire attempts beyond calls, Cosmos transport failures."""
        return sum(c.data("wire") - c.data("call") if c.backend == "table" else c.error_count()
                   for c in self.counters)


class _Stores:
    """Counted stores through the relays for each variant; removes what it created."""

    def __init__(self, direct: Endpoints, relayed: Endpoints, pool_size: int) -> None:
        self.direct = direct
        self.relayed = relayed
        self.pool_size = pool_size
        self.database = f"lat-{uuid.uuid4().hex[:8]}"
        self.tables: list[str] = []
        self.closables: list[Any] = []
        self.async_closables: list[Any] = []
        self.loop = asyncio.Runner()  # the async variants' event loop (their clients live on it)
        self.database_used = False

    def _table(self, counter: RequestCounter) -> tuple[Any, Any]:
        """A fresh table: a sync store on it and, for the async variants, an async one."""
        name = f"lat{uuid.uuid4().hex[:12]}"
        self.tables.append(name)
        store = counted_table_store(self.relayed.table_connection_string, name, counter,
                                    transport=pooled_transport(self.pool_size))
        self.closables.append(store)
        aio = counted_async_table_store(self.relayed.table_connection_string, name, counter)
        self.async_closables.append(aio)
        return store, aio

    def stores(self, backend: str, roles: tuple[str, ...]) -> tuple[PaymentStores, list[RequestCounter]]:
        table_counter = RequestCounter("table")
        if backend == "table":
            made = {role: self._table(table_counter) for role in roles}
            return self._payment_stores(made), [table_counter]
        cosmos_counter = RequestCounter("cosmos")
        client = counted_cosmos_client(self.relayed.cosmos_endpoint, self.relayed.cosmos_key,
                                       cosmos_counter, verify=self.relayed.cosmos_verify,
                                       pool_size=self.pool_size, enable_endpoint_discovery=False)
        self.closables.append(client)
        aio_client = self.loop.run(counted_async_cosmos_client(
            self.relayed.cosmos_endpoint, self.relayed.cosmos_key, cosmos_counter,
            verify=self.relayed.cosmos_verify, enable_endpoint_discovery=False))
        self.async_closables.append(aio_client)
        self.database_used = True
        made = {}
        for role in roles:
            if role == "parked":  # the parking lot always lives in Table Storage
                made[role] = self._table(table_counter)
                continue
            store = counted_cosmos_store(client, self.database, f"{role}-{uuid.uuid4().hex[:8]}")
            container = (aio_client.get_database_client(self.database)
                         .get_container_client(store.container.id))
            made[role] = (store, AsyncCosmosIdempotencyStore.from_container(container))
        return self._payment_stores(made), [cosmos_counter, table_counter]

    def _payment_stores(self, made: dict[str, tuple[Any, Any]]) -> PaymentStores:
        stores = PaymentStores(**{role: pair[0] for role, pair in made.items()})
        stores.aio = {role: pair[1] for role, pair in made.items()}
        stores.run = self.loop.run
        return stores

    def close(self) -> None:
        """Best effort, directly (not through the relays)."""
        for closable in self.closables:
            with contextlib.suppress(Exception):
                closable.close()
        for closable in self.async_closables:
            with contextlib.suppress(Exception):
                self.loop.run(closable.close())
        self.loop.close()
        if self.tables:
            service = TableServiceClient.from_connection_string(self.direct.table_connection_string)
            for table in self.tables:
                with contextlib.suppress(Exception):
                    service.delete_table(table)
        if self.database_used:
            with contextlib.suppress(Exception):
                admin = cosmos_client(self.direct)
                admin.delete_database(self.database)
                admin.close()


def app_concurrency(settings: Settings, default: int = DEFAULT_CONCURRENCY) -> int:
    """The bound the app puts on concurrent account groups (`default` when it has none)."""
    services = build_services(settings, stores=lambda _role: InMemoryIdempotencyStore())
    value = getattr(services.payments, "max_concurrency", None)
    return value if isinstance(value, int) and value > 0 else default


def settings_for(backend: str, endpoints: Endpoints) -> Settings:
    """App settings pointing at the relayed endpoints, every other setting at its default."""
    return Settings.from_env({
        "DEDUP_BACKEND": backend,
        "TABLE_CONNECTION_STRING": endpoints.table_connection_string,
        "COSMOS_ENDPOINT": endpoints.cosmos_endpoint,
        "COSMOS_KEY": endpoints.cosmos_key,
        "COSMOS_VERIFY_TLS": "true" if endpoints.cosmos_verify else "false",
        "NOTIFICATION_API_URL": "http://127.0.0.1:9/unused",  # required; payments never call it
    })


# -- one scenario: an RTT and an account count --------------------------------------------------------
def _measure(slot: _Slot, action: Callable[[], None]) -> tuple[int, int, float, float]:
    """(store requests, of which sent again after a failure, wall seconds, CPU seconds)."""
    before, retried = slot.data(), slot.retried()
    cpu = time.process_time()
    started = time.perf_counter()
    action()
    elapsed = time.perf_counter() - started
    return slot.data() - before, slot.retried() - retried, elapsed, time.process_time() - cpu


def _verify(slot: _Slot, workload: PaymentWorkload) -> None:
    """Balances after the run: every batch once, plus the replayed one again without dedup."""
    expected = dict(workload.expected)
    if not slot.variant.dedup:
        for account, cents in workload.batch_delta(workload.batches[-1]).items():
            expected[account] += cents
    store = slot.variant.stores.ledger
    mismatches = sum(1 for account, cents in expected.items()
                     if (balance_of(store, account) or 0) != cents)
    slot.result.balances_checked = len(expected)
    slot.result.balance_mismatches = mismatches


def run_scenario(direct: Endpoints, relayed: Endpoints, *, rtt_ms: float, accounts: int,
                 sizes: LatencySizes, seed: int, backends: tuple[str, ...],
                 variants: tuple[str, ...], progress: Callable[[str], None]) -> list[LatencyResult]:
    workload = build_payment_workload(events=sizes.events, accounts=accounts,
                                      batch_size=sizes.batch_size, seed=seed,
                                      warmup_events=sizes.warmup_events)
    concurrency = sizes.concurrency or DEFAULT_CONCURRENCY
    stores = _Stores(direct, relayed, pool_size=max(64, concurrency))
    slots: list[_Slot] = []
    try:
        for backend in backends:
            settings = settings_for(backend, relayed)
            for name in variants:
                cls = LATENCY_VARIANTS[name]
                made, counters = stores.stores(backend, cls.roles)
                variant = cls(backend, made, settings=settings, concurrency=concurrency)
                slots.append(_Slot(variant, counters, LatencyResult(
                    rtt_ms, accounts, backend, name, cls.label, cls.dedup)))
        progress(f"rtt {rtt_ms:g} ms, {accounts} accounts: {len(slots)} variants ready; warming up")
        for slot in slots:
            for start in range(0, len(workload.warmup), sizes.batch_size):
                slot.variant.process(workload.warmup[start:start + sizes.batch_size],
                                     WARMUP_PARTITION)
        meta_before = {id(slot): slot.meta() for slot in slots}
        retried_before = {id(slot): slot.retried() for slot in slots}
        rng = random.Random(f"{seed}-{rtt_ms}-{accounts}")
        for index, batch in enumerate(workload.batches):
            order = list(slots)
            rng.shuffle(order)
            gc.collect()
            for slot in order:
                requests, retried, elapsed, cpu = _measure(
                    slot, lambda s=slot, b=batch: s.variant.process(b, PARTITION))
                result = slot.result
                result.batch_retried.append(retried)
                result.events += len(batch)
                result.seconds += elapsed
                result.cpu_seconds += cpu
                result.requests += requests
                result.batch_requests.append(requests)
                result.batch_seconds.append(elapsed)
                result.batch_events.append(len(batch))
                result.batch_accounts.append(len(workload.accounts_in(batch)))
            if index % 5 == 4:
                progress(f"rtt {rtt_ms:g} ms, {accounts} accounts: batch {index + 1}"
                         f"/{len(workload.batches)}")
        last = workload.batches[-1]
        for slot in slots:  # a host restart, then the last checkpointed batch again
            slot.variant.restart()
            requests, retried, elapsed, _ = _measure(
                slot, lambda s=slot: s.variant.process(last, PARTITION))
            slot.result.replay_events = len(last)
            slot.result.replay_requests = requests
            slot.result.replay_retried = retried
            slot.result.replay_seconds = elapsed
        for slot in slots:
            slot.result.meta_requests = slot.meta() - meta_before[id(slot)]
            slot.result.retried_calls = slot.retried() - retried_before[id(slot)]
            slot.result.outcomes = dict(slot.variant.outcomes)
            _verify(slot, workload)
    finally:
        for slot in slots:
            slot.variant.close()
        stores.close()
    return [slot.result for slot in slots]


def run_latency(direct: Endpoints, sizes: LatencySizes, rtts: tuple[float, ...], *, seed: int = 1,
                backends: tuple[str, ...] = BACKENDS, variants: tuple[str, ...] | None = None,
                progress: Callable[[str], None] = lambda _: None) -> LatencyRun:
    names = tuple(variants or LATENCY_VARIANTS)
    if sizes.concurrency is None:
        sizes = replace(sizes, concurrency=app_concurrency(settings_for(backends[0], direct)))
    ports = {"table": table_port(direct.table_connection_string),
             "cosmos": cosmos_port(direct.cosmos_endpoint)}
    started = time.perf_counter()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_before = os.getloadavg()
    probes: list[Probe] = []
    results: list[LatencyResult] = []
    for rtt in rtts:
        with Relay(ports["table"], delay_ms=rtt / 2) as table_relay, \
                Relay(ports["cosmos"], delay_ms=rtt / 2) as cosmos_relay:
            relayed = relayed_endpoints(direct, table_relay.port, cosmos_relay.port)
            for when in ("before", "after"):
                if when == "after":
                    for accounts in sizes.accounts:
                        results += run_scenario(direct, relayed, rtt_ms=rtt, accounts=accounts,
                                                sizes=sizes, seed=seed, backends=backends,
                                                variants=names, progress=progress)
                measured = probe_rtt(direct, relayed, rtt, reads=sizes.probe_reads,
                                     backends=backends, when=when)
                progress(f"rtt check ({when}): " + ", ".join(
                    f"{p.backend} +{p.added_ms:.2f} ms (direct {p.direct_ms:.2f} ms)"
                    for p in measured))
                check_probes(measured)
                probes += measured
    return LatencyRun(sizes=sizes, seed=seed, rtts=tuple(rtts), backends=tuple(backends),
                      variants=names, probes=probes, results=results, started_at=started_at,
                      seconds=time.perf_counter() - started, load_before=load_before,
                      load_after=os.getloadavg(),
                      hash_cost=measure(payment_contents(events=sizes.events, seed=seed)))
