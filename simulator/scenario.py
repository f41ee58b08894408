"""One chaos scenario end to end: services on the real stores, the workload, the checks.

    result = run_scenario(ScenarioConfig(backend="cosmos", seed=7), endpoints)
    print(format_report(result)); sys.exit(0 if result.ok else 1)

The app's services are built by `functions.services.build_services` with a
fake notification API, the simulation's clock and a store factory that wraps
each real store for fault injection (and, for the counter-proofs, in a
dedup-off or non-atomic variant), and handed to the simulated host, which runs
the functions on them. After the run, maintenance reconciles with grace 0 and
the checker reads the stores.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from functions.services import Services, build_services, real_stores
from functions.settings import Settings
from shared._backends import CosmosIdempotencyStore, TableIdempotencyStore
from shared._core.store import IdempotencyStore
from shared._triggers.maintenance import Maintenance
from simulator.check import Checker, CheckResult, DeadLetter, Evidence, stores_of
from simulator.clock import SimClock
from simulator.eventhubs import EventHub
from simulator.faults import (
    DedupOffStore,
    FakeNotificationApi,
    FaultLog,
    FaultPlan,
    FaultySender,
    FaultyStore,
    MarkFirstDispatch,
    NonAtomicStore,
    OutageController,
    OutboxBypassStore,
    SimulatedDispatcher,
    stable_seed,
)
from simulator.host import DeliveryStats, HostConfig, SimulatedHost
from simulator.workload import Names, Workload, generate

# SDK options for the harness: a paused server must time out, not hang.
CLIENT_OPTIONS = {"connection_timeout": 2, "read_timeout": 3, "retry_total": 2,
                  "retry_backoff_factor": 0.2}


@dataclass
class ScenarioConfig:
    backend: str = "table"
    seed: int = 1
    messages: int = 20_000
    events: int = 20_000
    duplicate_rate: float = 0.25
    fault_rate: float = 0.05
    consumers: int = 4
    partitions: int = 4
    max_batch: int = 100
    outages: int | None = None  # default: 2 when faults are on
    outage_seconds: float = 2.5
    # auto: pause the server process (wall time); fail-fast: every call to the server's stores
    # answers 503 for outage_seconds of virtual time (see simulator.faults.OutageController).
    outage_mode: str = "auto"
    outage_servers: tuple[str, ...] | None = None  # default: the backend's store, then Azurite
    outage_meets: tuple[str, ...] = ()  # outage n starts at the next store call of [n % len]
    hub_failovers: int = 0  # the event hub recreated / failed over (sequence numbers restart)
    hostile: bool = True  # the hostile-input cases in the workload (see simulator.workload)
    oversize_bytes: int = 10 * 1024 * 1024  # one order and one payment event this large (0: none)
    dedup_off: bool = False
    non_atomic: str | None = None  # effect-first | marker-first
    api_honours_key: bool = True
    transient_as_permanent: bool = False  # counter-proof: 429/503 surface as a permanent 400
    # outbox (the app as it is) | before-commit | after-commit | mark-first: the outbox
    # counter-proofs (mark-first: an Event Hubs batch's mark moves before its dispatch)
    publish: str = "outbox"
    lock_duration: int = 60
    max_delivery_count: int = 10
    lease_seconds: int = 54  # shorter than the 60 s lock, as the app requires
    duplicate_detection_window: int = 600
    duration: float = 3600.0  # virtual seconds over which the producer sends
    tag: str = ""  # distinguishes runs sharing one stack and seed

    @property
    def run_id(self) -> str:
        return f"{self.backend[0]}{stable_seed('run', self.seed, self.backend) % 16**6:06x}{self.tag}"


@dataclass
class Endpoints:
    """Where the stores are; `processes` are pids of servers the harness started (it may pause them)."""

    table_connection_string: str
    cosmos_endpoint: str
    cosmos_key: str
    cosmos_verify: bool = False
    processes: dict[str, int] = field(default_factory=dict)


@dataclass
class ScenarioResult:
    config: ScenarioConfig
    workload: Workload
    stats: DeliveryStats
    check: CheckResult
    faults: dict[str, int]
    sent: dict[str, int]
    wall_seconds: float
    run_seconds: float
    check_seconds: float
    virtual_seconds: float
    checkpoint_lag: int
    outages: list[tuple[str, str, float]]
    maintenance_parked: int
    outage_failures: dict[str, int] = field(default_factory=dict)  # "server: function" -> calls
    outage_held: dict[str, int] = field(default_factory=dict)  # answered after a pause ended
    evidence: Evidence | None = None  # what the checker was given besides the stores
    started_at: float = 0.0  # virtual time the host started (origin of the report's time axes)
    fault_times: list[tuple[float, str]] = field(default_factory=list)  # (virtual time, fault kind)
    hub_incarnations: int = 1  # 1 + the failovers that happened (sequence numbers restarted)

    @property
    def ok(self) -> bool:
        return self.check.ok and not self.stats.errors


def app_settings(config: ScenarioConfig, endpoints: Endpoints) -> dict[str, str]:
    run = config.run_id
    return {
        "DEDUP_BACKEND": config.backend,
        "TABLE_CONNECTION_STRING": endpoints.table_connection_string,
        "COSMOS_ENDPOINT": endpoints.cosmos_endpoint,
        "COSMOS_KEY": endpoints.cosmos_key,
        "COSMOS_VERIFY_TLS": "true" if endpoints.cosmos_verify else "false",
        "COSMOS_DATABASE": f"sim-{run}",
        "NOTIFICATION_API_URL": "http://notifications.sim.invalid/send",
        "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY": "true" if config.api_honours_key else "false",
        "ORDERS_QUEUE_NAME": "orders",
        "ORDER_STATUS_QUEUE_NAME": "order-status",
        "NOTIFICATIONS_TOPIC_NAME": "notifications",
        "NOTIFY_SUBSCRIPTION_NAME": "notify",
        "AUDIT_SUBSCRIPTION_NAME": "audit",
        "BALANCE_CHANGES_QUEUE": "balance-changes",
        "PAYMENTS_HUB_NAME": f"payments-{run}",
        "PAYMENTS_CONSUMER_GROUP": "payments-processor",
        "SERVICEBUS_LOCK_DURATION_SECONDS": str(config.lock_duration),
        "SERVICEBUS_MAX_DELIVERY_COUNT": str(config.max_delivery_count),
        "DEDUP_LEASE_SECONDS": str(config.lease_seconds),
    }


@dataclass
class Rig:
    """The harness around one run: virtual clock, fake notification API, fault log and plan,
    store outages, and the dispatcher that hands what the app publishes to the broker."""

    clock: SimClock
    api: FakeNotificationApi
    faults: FaultLog
    plan: FaultPlan
    outages: OutageController
    dispatcher: SimulatedDispatcher

    @classmethod
    def start(cls, config: ScenarioConfig, endpoints: Endpoints, plan: FaultPlan | None) -> Rig:
        clock = SimClock()
        faults = FaultLog(clock)
        plan = plan or FaultPlan(config.seed, fault_rate=config.fault_rate,
                                 duplicate_rate=config.duplicate_rate,
                                 non_atomic=config.non_atomic is not None)
        outages = OutageController(faults, processes=endpoints.processes,
                                   duration=config.outage_seconds, mode=config.outage_mode,
                                   clock=clock, meets=config.outage_meets)
        return cls(clock, FakeNotificationApi(honours_key=config.api_honours_key), faults, plan,
                   outages, SimulatedDispatcher())


def run_scenario(config: ScenarioConfig, endpoints: Endpoints, *,
                 progress: Callable[[int, ScenarioConfig], Callable[[int], None]] | None = None,
                 plan: FaultPlan | None = None, workload: Workload | None = None) -> ScenarioResult:
    """Run one scenario; `progress(total, config)` may return a callback fed with released sends.

    `plan` replaces the seeded fault plan (tests script single faults); `workload` the
    generated workload.
    """
    started = time.perf_counter()
    env = app_settings(config, endpoints)
    settings = Settings.from_env(env)
    workload = workload or generate_workload(config, env)
    rig = Rig.start(config, endpoints, plan)
    services = build_app(config, settings, rig)
    host = start_host(config, workload, env, rig, services, progress)
    stats = host.run()
    readers, maintenance_parked = reconcile(config, settings, rig, host)
    check_started = time.perf_counter()
    evidence = observe(config, workload, host, stats, rig)
    check = Checker(workload.items, stores_of(dict(readers.stores)), run_id=config.run_id,
                    hub=env["PAYMENTS_HUB_NAME"], evidence=evidence).run()
    assert host.hub is not None
    return ScenarioResult(
        config=config, workload=workload, stats=stats, check=check, faults=rig.faults.counts(),
        sent=dict(host.sent_copies), wall_seconds=time.perf_counter() - started,
        run_seconds=host.wall_seconds, check_seconds=time.perf_counter() - check_started,
        virtual_seconds=rig.clock() - host.t0, checkpoint_lag=checkpoint_lag(host.hub),
        outages=rig.outages.history, maintenance_parked=maintenance_parked,
        outage_failures=dict(rig.outages.failed_calls), outage_held=dict(rig.outages.held_calls),
        evidence=evidence, started_at=host.t0, fault_times=list(rig.faults.times),
        hub_incarnations=host.hub.incarnation + 1)


def generate_workload(config: ScenarioConfig, env: dict[str, str]) -> Workload:
    """The seeded workload the scenario's settings describe."""
    return generate(
        seed=config.seed, messages=config.messages, events=config.events,
        duplicate_rate=config.duplicate_rate, run_id=config.run_id,
        duplicate_detection_window=config.duplicate_detection_window, duration=config.duration,
        names=Names(hub=env["PAYMENTS_HUB_NAME"]), hostile=config.hostile,
        oversize_bytes=config.oversize_bytes)


def build_app(config: ScenarioConfig, settings: Settings, rig: Rig) -> Services:
    """The app's services on the real stores, each wrapped for fault injection (and, for a
    counter-proof, in a dedup-off, non-atomic, outbox-bypassing or mark-first variant)."""
    real = real_stores(settings, **CLIENT_OPTIONS)
    dispatcher: SimulatedDispatcher | MarkFirstDispatch = rig.dispatcher
    if config.publish == "mark-first":
        dispatcher = MarkFirstDispatch(rig.dispatcher)

    def faulty(role: str) -> IdempotencyStore:
        store = inner = real(role)
        if config.dedup_off:
            inner = DedupOffStore(inner)
        if config.non_atomic:
            inner = NonAtomicStore(inner, config.non_atomic)
        if isinstance(dispatcher, MarkFirstDispatch):
            inner = dispatcher.store(inner)
        elif config.publish != "outbox":
            inner = OutboxBypassStore(inner, config.publish, rig.dispatcher)
        return FaultyStore(inner, label=_label(store, role), server=_server_of(store),
                           outages=rig.outages,
                           transient_as_permanent=config.transient_as_permanent)

    return build_services(settings, stores=faulty, sender=FaultySender(rig.api), clock=rig.clock,
                          sleep=rig.clock.sleep, dispatcher=dispatcher)


def start_host(config: ScenarioConfig, workload: Workload, env: dict[str, str], rig: Rig,
               services: Services,
               progress: Callable[[int, ScenarioConfig], Callable[[int], None]] | None
               ) -> SimulatedHost:
    """The simulated host, its functions on `services`, wired to the rig's broker."""
    servers = list(config.outage_servers or (["cosmos", "azurite"] if config.backend == "cosmos"
                                             else ["azurite"]))
    outages = config.outages if config.outages is not None else (2 if config.fault_rate > 0 else 0)
    host_config = HostConfig(consumers=config.consumers, partitions=config.partitions,
                             max_batch=config.max_batch, lock_duration=config.lock_duration,
                             max_delivery_count=config.max_delivery_count,
                             duplicate_detection_window=config.duplicate_detection_window,
                             outages=outages, hub_failovers=config.hub_failovers)
    callback = progress(len(workload.sends()), config) if progress is not None else None
    host = SimulatedHost(workload, services=services, settings=env, clock=rig.clock,
                         plan=rig.plan, faults=rig.faults, outages=rig.outages,
                         outage_servers=servers, config=host_config, progress=callback)
    rig.dispatcher.namespace = host.namespace
    return host


def reconcile(config: ScenarioConfig, settings: Settings, rig: Rig,
              host: SimulatedHost) -> tuple[Services, int]:
    """Past every lease, maintenance with grace 0 closes what is left; its outbox sweep (age
    0) dispatches what no redelivery repaired, and the host delivers that to notify and
    audit. Returns services on unwrapped stores with the SDKs' default timeouts (the checks
    read whole containers) and the entries maintenance parked."""
    rig.clock.advance(config.lease_seconds + config.lock_duration + 1)
    readers = build_services(settings, sender=rig.api, clock=rig.clock, sleep=rig.clock.sleep,
                             dispatcher=rig.dispatcher)
    records = {name: readers.stores[name] for name in ("dedup", "ledger", "notifications", "orders")}
    maintenance = Maintenance(records, readers.parking, grace_seconds=0, clock=rig.clock,
                              outbox=readers.maintenance.outbox, outbox_age_seconds=0)
    report = maintenance.run()
    parked = report.parked
    if report.outbox_dispatched:
        host.drain()
        parked += maintenance.run().parked
    return readers, parked


def observe(config: ScenarioConfig, workload: Workload, host: SimulatedHost,
            stats: DeliveryStats, rig: Rig) -> Evidence:
    """What the harness saw outside the stores: the broker's dead letters and drops, the
    API's calls, the host's delivery outcomes, and what the outbox published."""
    outcomes: dict[tuple[str, str, int], Counter[str]] = defaultdict(Counter)
    faulted: dict[tuple[str, str, int, int], tuple[int, int]] = {}
    for function, logical, variant, copy, outcome, detail in stats.trace:
        outcomes[(function, logical, variant)][outcome] += 1
        if detail.startswith("delivery "):  # Service Bus: "delivery N, fault <kind|None>"
            deliveries, with_fault = faulted.get((function, logical, variant, copy), (0, 0))
            faulted[(function, logical, variant, copy)] = (
                deliveries + 1, with_fault + (not detail.endswith("fault None")))
    return Evidence(
        dead_letters=[DeadLetter(host.entity_function[entity.path].name, m.origin.logical,
                                 m.origin.variant, m.dead_letter_reason or "",
                                 m.dead_letter_description or "", m.delivery_count,
                                 m.origin.copy)
                      for entity in host.namespace.entities for m in entity.dead_letters],
        api_calls=list(rig.api.calls), api_honours_key=config.api_honours_key,
        broker_dropped={(item.logical, item.variant) for item in workload.service_bus_items
                        if (item.logical, item.variant) not in host.accepted},
        outcomes=dict(outcomes), stalled_batches=stats.gave_up, faulted_deliveries=faulted,
        outbox_delivered=True, outbox_orders=dict(rig.dispatcher.orders),
        published=dict(rig.dispatcher.bodies))


def checkpoint_lag(hub: EventHub) -> int:
    """Events behind the checkpoints, over every partition."""
    return sum(max(0, hub.length(p) - hub.resume_position(p)) for p in hub.partition_ids)


def _server_of(store: IdempotencyStore) -> str:
    return "cosmos" if isinstance(store, CosmosIdempotencyStore) else "azurite"


def _label(store: IdempotencyStore, name: str) -> str:
    if isinstance(store, TableIdempotencyStore):
        return f"table {store.client.table_name}"
    if isinstance(store, CosmosIdempotencyStore):
        return f"cosmos {store.container.id}"
    return name
