"""A simulated Functions host: competing instances that deliver to the real functions
through the real Python worker.

Each instance is a thread that, like a Functions host instance, runs every
trigger of the app: it receives Service Bus messages from every queue and
subscription (PeekLock, one message at a time) and Event Hubs batches from the
partitions it owns. Every delivery is an invocation request into the real
worker (`local_stack.worker`: `azure_functions_runtime`, with the app indexed
and loaded as the host loads it); the worker decodes the inputs with its own
converters and runs the function on its thread pool, and the function calls
the services the host was given (`functions.services.use_services`, set on
each instance thread and carried into the worker) against the real stores. The functions, their bindings
and the retry policy come from the worker's functions metadata.

The host reproduces what the Functions runtime does around the call:

* Service Bus: the function settles through `ServiceBusMessageActions`, which
  calls the host over gRPC; the local settlement server hands each call to
  this delivery (lock check, the fault hook before the ack, the simulated
  broker). An invocation that failed with the message unsettled abandons it;
  a crash leaves the lock to expire; settling after the lock was lost fails.
* Event Hubs: the function's retry policy re-runs a failed batch (virtual
  backoff) before the checkpoint; the checkpoint is written after every batch;
  a crash writes none and the partition's next owner replays.

Fault injection finds the current invocation with `simulator.faults.current()`,
a thread-local of the thread that called the function. The worker runs the
function on its own pool thread, so invocations are also registered by the
worker's invocation id (`WorkerHost.current_invocation_id()`, set by the
worker on its pool thread) and `current()` falls back to that registry.

Virtual time (`SimClock`) moves with the producer's schedule: when the backlog
runs low the clock jumps to release the next chunk of sends; at the end it
jumps to the next lock expiry so crashed deliveries come back.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from functions.services import Services, use_services
from local_stack.host_data import SentMessage
from local_stack.settlement_server import SettlementCall
from local_stack.worker import RetryOptions, WorkerHost, sample_settings
from simulator import faults as fault_module
from simulator.clock import SimClock
from simulator.eventhubs import Batch, EventHub, PartitionOwnership
from simulator.faults import (
    FaultKind,
    FaultLog,
    FaultPlan,
    Invocation,
    OutageController,
    SimulatedCrash,
    invocation,
    stable_seed,
)
from simulator.servicebus import Delivery, MessageLockLostError, Origin, ServiceBusNamespace
from simulator.workload import Item, Workload

# How each Service Bus consumer deduplicates (decides which faults make sense).
STYLE = {"orders": "outbox", "order_status": "natural", "notify": "two_phase", "audit": "two_phase"}
CAUSES = ("producer retry", "redelivery", "concurrent copy", "checkpoint replay")


@dataclass(frozen=True)
class RegisteredFunction:
    """A function as the worker reported it: name, raw trigger binding, retry policy."""

    name: str
    trigger: dict[str, Any]
    retry: RetryOptions | None


def app_dir() -> Path:
    """The function app's directory (where `function_app.py` is), found without importing it."""
    spec = importlib.util.find_spec("function_app")
    if spec is None or spec.origin is None:
        raise RuntimeError("function_app.py is not importable (run from the repository root)")
    return Path(spec.origin).resolve().parent


def worker_host() -> WorkerHost:
    """The process's real worker with the app loaded; its environment is the sample settings
    (what indexing reads). The functions' services come from whoever invokes them."""
    directory = app_dir()
    return WorkerHost.start(directory, sample_settings(directory))


@functools.cache
def registered_functions() -> dict[str, RegisteredFunction]:
    """The app's functions from the worker's functions metadata."""
    return {name: RegisteredFunction(name, meta.trigger, meta.retry)
            for name, meta in worker_host().metadata().items()}


def resolve(value: str, settings: dict[str, str]) -> str:
    """A binding expression such as `%ORDERS_QUEUE_NAME%`, resolved from app settings."""
    if value.startswith("%") and value.endswith("%"):
        return settings[value[1:-1]]
    return value


class InvocationRegistry:
    """Simulated invocations by worker invocation id, for code on the worker's pool threads."""

    def __init__(self) -> None:
        self._by_id: dict[str, Invocation] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def running(self, invocation_id: str, inv: Invocation) -> Iterator[None]:
        with self._lock:
            self._by_id[invocation_id] = inv
        try:
            yield
        finally:
            with self._lock:
                self._by_id.pop(invocation_id, None)

    def current(self) -> Invocation | None:
        invocation_id = WorkerHost.current_invocation_id()
        if invocation_id is None:
            return None
        with self._lock:
            return self._by_id.get(invocation_id)


INVOCATIONS = InvocationRegistry()


def _bridge_fault_lookup() -> None:
    """Make `simulator.faults.current()` also find invocations the worker runs on its threads.

    The fault wrappers call `current()` through the faults module, so wrapping
    that one function is enough; the thread-local answer still wins when set.
    """
    original = fault_module.current
    if getattr(original, "worker_bridge", False):
        return

    def current() -> Invocation | None:
        return original() or INVOCATIONS.current()

    current.worker_bridge = True  # type: ignore[attr-defined] - a marker on the function object
    fault_module.current = current


@dataclass
class HostConfig:
    consumers: int = 4
    partitions: int = 4
    max_batch: int = 100
    lock_duration: float = 60.0
    max_delivery_count: int = 10
    duplicate_detection_window: float = 600.0
    chunk: int = 256  # sends released per clock jump
    outages: int = 2
    hub_failovers: int = 0  # times the event hub is recreated / fails over (sequence numbers restart)
    retry_limit: int = 60  # host retries of one batch before it gives up (the app asks for -1)
    lock_expiry_wait: float = 1.0  # real seconds a slow consumer waits for its copy to be taken


@dataclass
class DeliveryStats:
    """What the harness observed about deliveries (never read from the app)."""

    deliveries: Counter[str] = field(default_factory=Counter)  # by function
    duplicates: Counter[str] = field(default_factory=Counter)  # by cause
    outcomes: Counter[str] = field(default_factory=Counter)  # "function: outcome"
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    batches: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    host_retries: int = 0
    gave_up: int = 0
    lock_lost_settlements: int = 0
    settle_errors: int = 0
    errors: list[str] = field(default_factory=list)
    # (function, logical, variant, copy, outcome, detail) per delivery, in order of completion
    trace: list[tuple[str, str, int, int, str, str]] = field(default_factory=list)
    # (virtual time, duplicate cause or "" for a first delivery) per delivery, for the HTML report
    timeline: list[tuple[float, str]] = field(default_factory=list)


class DeliveryLog:
    """Classifies each delivery: first, or a duplicate by cause."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str, int]] = set()
        self._inflight: Counter[tuple[str, str, int]] = Counter()
        self._positions: set[tuple[str, int]] = set()
        self.stats = DeliveryStats()
        self.trace = self.stats.trace

    def start(self, function: str, origin: Origin, *, delivery_count: int = 1,
              position: tuple[str, int] | None = None, host_retry: bool = False) -> str | None:
        key = (function, origin.logical, origin.variant)
        with self._lock:
            self.stats.deliveries[function] += 1
            replay = position is not None and position in self._positions
            if position is not None:
                self._positions.add(position)
            cause = None
            if key in self._seen:
                if self._inflight[key] > 0:
                    cause = "concurrent copy"
                elif delivery_count > 1 or host_retry:
                    cause = "redelivery"
                elif replay:
                    cause = "checkpoint replay"
                elif origin.copy > 0:
                    cause = "producer retry"
                else:
                    cause = "redelivery"
                self.stats.duplicates[cause] += 1
            if self._clock is not None:
                self.stats.timeline.append((self._clock(), cause or ""))
            self._seen.add(key)
            self._inflight[key] += 1
            return cause

    def end(self, function: str, origin: Origin, outcome: str, detail: str = "") -> None:
        key = (function, origin.logical, origin.variant)
        with self._lock:
            self._inflight[key] -= 1
            self.stats.outcomes[f"{function}: {outcome}"] += 1
            self.trace.append((function, origin.logical, origin.variant, origin.copy, outcome, detail))

    def latency(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.stats.latencies[kind].append(seconds)


class HostSettlement:
    """The host's side of one delivery's settlement, called by the gRPC settlement server.

    Settles on the simulated broker; the host may die right before it settles
    (the fault hook); a lost lock makes the call fail, as the real host's does.
    """

    def __init__(self, host: SimulatedHost, delivery: Delivery, inv: Invocation) -> None:
        self.host = host
        self.delivery = delivery
        self.inv = inv
        self.outcome: str | None = None
        self.lock_lost = False

    def __call__(self, call: SettlementCall) -> None:
        self.inv.before_ack()
        if call.lock_token != str(self.delivery.lock_token):
            raise ValueError("settling a message that is not the one this delivery handed over")
        entity = self.delivery.entity
        try:
            with self.host.namespace.lock:
                now = self.host.clock()
                if call.action == "complete":
                    entity.complete(self.delivery.lock_token, now)
                elif call.action == "abandon":
                    entity.abandon(self.delivery.lock_token, now)
                elif call.action == "deadletter":
                    entity.deadletter(self.delivery.lock_token, now, call.reason, call.description)
                else:
                    raise ValueError(f"the simulated host does not {call.action}")
        except MessageLockLostError:
            self.lock_lost = True
            raise
        self.outcome = (call.action if call.action != "deadletter"
                        else f"deadletter ({call.reason})")


def _error_name(message: str | None) -> str:
    """`StoreUnavailableError` from the worker's `StoreUnavailableError: ...`."""
    return (message or "error").split(":", 1)[0]


@dataclass
class _SbWork:
    delivery: Delivery


@dataclass
class _EhWork:
    batch: Batch


class SimulatedHost:
    """Runs the workload through the registered functions with N competing instances, the
    functions running on `services`."""

    def __init__(self, workload: Workload, *, services: Services, settings: dict[str, str],
                 clock: SimClock, plan: FaultPlan, faults: FaultLog,
                 outages: OutageController | None, outage_servers: list[str],
                 config: HostConfig | None = None,
                 progress: Callable[[int], None] | None = None) -> None:
        self.workload = workload
        self.services = services
        self.settings = settings
        self.clock = clock
        self.plan = plan
        self.faults = faults
        self.outages = outages
        self.outage_servers = outage_servers
        self.config = config or HostConfig()
        self.progress = progress
        self.log = DeliveryLog(clock)
        self.rng = random.Random(stable_seed("host", plan.seed))
        self.worker = worker_host()
        _bridge_fault_lookup()
        self.functions = registered_functions()
        self.namespace = ServiceBusNamespace(
            clock, lock_duration=self.config.lock_duration,
            max_delivery_count=self.config.max_delivery_count,
            duplicate_detection_window=self.config.duplicate_detection_window)
        self.entity_function: dict[str, RegisteredFunction] = {}
        self.hub: EventHub | None = None
        self._build_entities()
        assert self.hub is not None
        self.ownership = PartitionOwnership(self.hub, self.config.consumers)
        self.sends = workload.sends()
        self.t0 = clock()
        self._next_send = 0
        self._inflight = 0
        self._live_locks: dict[Any, float] = {}  # lock token -> locked until, of live deliveries
        self._done = False
        self.sent_copies: Counter[str] = Counter()  # accepted / dropped by duplicate detection
        self.accepted: set[tuple[str, int]] = set()  # Service Bus (logical, variant) with a copy in
        self._outage_points = self._plan_outages()
        n = self.config.hub_failovers
        self._failover_points = [int(len(self.sends) * (k + 1) / (n + 1)) for k in range(n)]
        self.wall_seconds = 0.0

    # -- wiring from the app's own trigger bindings -----------------------------------
    def _build_entities(self) -> None:
        topics: dict[str, list[tuple[str, RegisteredFunction]]] = defaultdict(list)
        for fn in self.functions.values():
            trigger = fn.trigger
            if trigger["type"] == "serviceBusTrigger":
                if "queueName" in trigger:
                    queue = resolve(trigger["queueName"], self.settings)
                    self.namespace.create_queue(queue)
                    self.entity_function[queue] = fn
                else:
                    topic = resolve(trigger["topicName"], self.settings)
                    topics[topic].append((resolve(trigger["subscriptionName"], self.settings), fn))
            elif trigger["type"] == "eventHubTrigger":
                self.hub = EventHub(self.clock, name=resolve(trigger["eventHubName"], self.settings),
                                    partitions=self.config.partitions,
                                    consumer_group=resolve(trigger["consumerGroup"], self.settings))
                self.eh_function = fn
        for topic, subscriptions in topics.items():
            entities = self.namespace.create_topic(topic, [name for name, _ in subscriptions])
            for entity, (_, fn) in zip(entities, subscriptions, strict=True):
                self.entity_function[entity.path] = fn

    def _plan_outages(self) -> list[int]:
        if self.outages is None or not self.outage_servers or self.config.outages <= 0:
            return []
        n = self.config.outages
        return [int(len(self.sends) * (k + 1) / (n + 1)) for k in range(n)]

    # -- the producer's side -----------------------------------------------------------
    def _send(self, item: Item, copy: int) -> None:
        origin = Origin(item.logical, copy, item.variant)
        if item.kind == "payment":
            assert self.hub is not None
            self.hub.send(item.body_bytes, properties=dict(item.properties) or None,
                          partition_key=item.partition_key, content_type=item.content_type,
                          origin=origin)
            self.sent_copies["event hub: accepted"] += 1
            return
        sent = SentMessage(item.body_bytes, message_id=item.message_id,
                           correlation_id=f"corr-{item.key}", content_type=item.content_type,
                           application_properties=dict(item.properties) or None)
        accepted = self.namespace.send(item.entity, sent, origin)
        self.sent_copies["service bus: accepted" if accepted
                         else "service bus: dropped by duplicate detection"] += 1
        if accepted:
            self.accepted.add((item.logical, item.variant))

    def _pump(self) -> None:
        """Release every send that is due (call with the namespace lock held)."""
        now = self.clock()
        released = 0
        while self._next_send < len(self.sends) and self.t0 + self.sends[self._next_send][0] <= now:
            if (self._failover_points and self._next_send >= self._failover_points[0]
                    and not self._fail_over()):
                break  # the old hub is not drained yet
            _, copy, item = self.sends[self._next_send]
            self._next_send += 1
            released += 1
            self._send(item, copy)
            if self._outage_points and self._next_send >= self._outage_points[0]:
                self._outage_points.pop(0)
                server = self.outage_servers[len(self._outage_points) % len(self.outage_servers)]
                assert self.outages is not None
                self.outages.start(server)
        if released and self.progress is not None:
            self.progress(released)
        if released:
            self.namespace.changed.notify_all()

    def _fail_over(self) -> bool:
        """Recreate the hub once every event of the current one is processed and checkpointed
        (events still unread when a hub is deleted are the platform's loss, not the app's)."""
        assert self.hub is not None
        if not (self.hub.fully_checkpointed() and self.ownership.idle()):
            return False
        self._failover_points.pop(0)
        self.hub.fail_over()
        self.ownership.restart()
        return True

    def _advance(self) -> bool:
        """Move virtual time when nothing can progress otherwise (namespace lock held)."""
        backlog = self.namespace.available_count() + self.ownership.pending()
        if self._next_send < len(self.sends) and backlog < self.config.chunk // 2:
            index = min(self._next_send + self.config.chunk - 1, len(self.sends) - 1)
            target = self.t0 + self.sends[index][0]
            # Processing takes no virtual time: never jump past a lock a live consumer holds.
            held = min(self._live_locks.values(), default=None)
            if held is not None:
                target = min(target, held - 0.001)
            if target <= self.clock():
                return False
            self.clock.advance_to(target)
            self._pump()
            return True
        if self._next_send >= len(self.sends) and self._inflight == 0 and backlog == 0:
            expiry = self.namespace.next_lock_expiry()
            if expiry is not None:
                self.clock.advance_to(expiry + 0.001)
                self.namespace.expire_locks()
                return True
        return False

    def _finished(self) -> bool:
        return (self._next_send >= len(self.sends) and self._inflight == 0
                and self.namespace.active_count() == 0 and self.ownership.pending() == 0)

    # -- instances -----------------------------------------------------------------------
    def run(self) -> DeliveryStats:
        started = time.perf_counter()
        threads = [threading.Thread(target=self._serve, args=(i,), name=f"instance-{i}",
                                    daemon=True) for i in range(self.config.consumers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.outages is not None:
            self.outages.wait()
        self.wall_seconds = time.perf_counter() - started
        return self.log.stats

    def drain(self) -> DeliveryStats:
        """Run the instances again until every entity is empty: delivers what the
        reconciliation's outbox sweep sent after the run."""
        self._done = False
        return self.run()

    def _serve(self, instance: int) -> None:
        """One instance's thread: every function it invokes runs on the host's services."""
        with use_services(self.services):
            self._instance(instance)

    def _instance(self, instance: int) -> None:
        turn = instance
        try:
            while True:
                work = self._next_work(instance, turn)
                turn += 1
                if work is None:
                    return
                try:
                    if isinstance(work, _SbWork):
                        self._deliver(instance, work.delivery)
                    else:
                        self._process_batch(instance, work.batch)
                finally:
                    with self.namespace.lock:
                        self._inflight -= 1
                        self.namespace.changed.notify_all()
        except BaseException as error:  # a harness bug: stop everyone, report it
            self.log.stats.errors.append(f"instance {instance}: {error!r}")
            with self.namespace.lock:
                self._done = True
                self.namespace.changed.notify_all()
            raise

    def _next_work(self, instance: int, turn: int) -> _SbWork | _EhWork | None:
        entities = self.namespace.entities
        with self.namespace.changed:
            while not self._done:
                self._pump()
                for kind in (("sb", "eh") if turn % 2 == 0 else ("eh", "sb")):
                    if kind == "sb":
                        now = self.clock()
                        for k in range(len(entities)):
                            delivery = entities[(turn + k) % len(entities)].receive(now)
                            if delivery is not None:
                                self._inflight += 1
                                self._live_locks[delivery.lock_token] = delivery.message.locked_until
                                self.namespace.changed.notify_all()
                                return _SbWork(delivery)
                    else:
                        batch = self.ownership.take(instance, self.config.max_batch, start=turn)
                        if batch is not None:
                            self._inflight += 1
                            return _EhWork(batch)
                if self._advance():
                    continue
                if self._finished():
                    self._done = True
                    self.namespace.changed.notify_all()
                    break
                self.namespace.changed.wait(timeout=0.05)
        return None

    # -- Service Bus -------------------------------------------------------------------------
    def _deliver(self, instance: int, delivery: Delivery) -> None:
        fn = self.entity_function[delivery.entity.path]
        origin = delivery.message.origin
        key = (f"sb|{delivery.entity.path}|{origin.logical}|{origin.variant}|{origin.copy}|"
               f"{delivery.delivery_count}")
        fault = self.plan.draw(key, self.plan.service_bus(STYLE.get(fn.name, "atomic")), calls=2)
        inv = Invocation(fn.name, fault, self.faults,
                         lock_expiry=lambda: self._lose_lock(delivery))
        settlement = HostSettlement(self, delivery, inv)
        invocation_id = str(uuid.uuid4())
        self.log.start(fn.name, origin, delivery_count=delivery.delivery_count)
        started = time.perf_counter()
        outcome = "unsettled"
        try:
            sent: SentMessage = delivery.message.sent
            # Found by the registry on the worker's pool threads (sync functions), by the
            # context (`invocation`) in an async function's tasks and threads.
            with INVOCATIONS.running(invocation_id, inv), invocation(inv):
                result = self.worker.invoke_service_bus(
                    fn.name, sent, lock_token=delivery.lock_token,
                    delivery_count=delivery.delivery_count,
                    sequence_number=delivery.message.sequence_number,
                    enqueued_time=datetime.fromtimestamp(delivery.message.enqueued_at, UTC),
                    settle=settlement, invocation_id=invocation_id)
            if inv.dead:
                outcome = "crash"  # no settlement: the lock expires and the broker redelivers
            elif settlement.lock_lost:
                outcome = "lock lost"
                self.log.stats.lock_lost_settlements += 1
            elif not result.ok:
                outcome = f"raised {_error_name(result.exception)}"
                if settlement.outcome is None:
                    self._abandon_after_exception(delivery)
            else:
                outcome = settlement.outcome or "unsettled"
                if settlement.outcome is None:  # returned without settling: the lock runs out
                    self.log.stats.settle_errors += 1
        except SimulatedCrash:
            outcome = "crash"  # the worker died mid-invocation: no response, no settlement
        finally:
            with self.namespace.lock:
                self._live_locks.pop(delivery.lock_token, None)
            self.log.latency("service bus message", time.perf_counter() - started)
            self.log.end(fn.name, origin, outcome,
                         f"delivery {delivery.delivery_count}, fault {fault.kind if fault else None}")

    def _abandon_after_exception(self, delivery: Delivery) -> None:
        """The host abandons a message the function left unsettled by raising."""
        with self.namespace.lock, contextlib.suppress(MessageLockLostError):
            delivery.entity.abandon(delivery.lock_token, self.clock())

    def _lose_lock(self, delivery: Delivery) -> None:
        """The lock expires mid-processing; wait until another consumer holds the copy."""
        message = delivery.message
        with self.namespace.changed:
            self._live_locks.pop(delivery.lock_token, None)
            if not delivery.entity.take_lock_back(delivery.lock_token):
                return
            self.namespace.changed.wait_for(
                lambda: message.delivery_count > delivery.delivery_count or message.state != "active",
                timeout=self.config.lock_expiry_wait)
        time.sleep(self.rng.uniform(0.0, 0.02))

    # -- Event Hubs ---------------------------------------------------------------------------
    def _retry_interval(self, attempt: int) -> float:
        policy = self.eh_function.retry
        return policy.interval(attempt) if policy is not None else 0.0

    def _max_retries(self) -> int:
        policy = self.eh_function.retry
        count = policy.max_retry_count if policy is not None else 0
        return self.config.retry_limit if count < 0 else min(count, self.config.retry_limit)

    def _process_batch(self, instance: int, batch: Batch) -> None:
        assert self.hub is not None
        fn = self.eh_function
        first = batch.events[0]
        key = f"eh|{batch.partition_id}|{first.sequence_number}|{len(batch.events)}|{batch.epoch}"
        fault = self.plan.draw(key, self.plan.event_hubs(), calls=2 + 2 * len(batch.events))
        if fault is not None and fault.kind is FaultKind.REBALANCE and self.config.consumers > 1:
            others = [i for i in range(self.config.consumers) if i != instance]
            self.ownership.move(batch.partition_id, self.rng.choice(others))
            self.faults.fired(FaultKind.REBALANCE)
            with self.namespace.changed:
                self.namespace.changed.notify_all()
        self.log.stats.batches += 1
        self.log.stats.batch_sizes.append(len(batch.events))
        sent = [e.sent for e in batch.events]
        crashed = False
        attempt = 0
        while True:
            attempt += 1
            for event in batch.events:
                self.log.start(fn.name, event.origin, host_retry=attempt > 1,
                               position=(f"{event.partition_id}@{event.incarnation}",
                                         event.sequence_number))
            inv = Invocation(fn.name, fault if attempt == 1 else None, self.faults, batch=True)
            invocation_id = str(uuid.uuid4())
            policy = fn.retry
            started = time.perf_counter()
            outcome = "ok"
            try:
                # The registry finds it on the worker's pool threads (sync functions), the
                # context (`invocation`) in an async function's tasks and threads. The account
                # groups' retry sleeps overlap in virtual time as in real time (summed, they
                # ended a fail-fast outage before the groups had spent their retries).
                with (INVOCATIONS.running(invocation_id, inv), invocation(inv),
                      self.clock.overlapping()):
                    result = self.worker.invoke_event_hub_batch(
                        fn.name, sent, partition_id=batch.partition_id, event_hub=self.hub.name,
                        consumer_group=self.hub.consumer_group, invocation_id=invocation_id,
                        retry_count=attempt - 1,
                        max_retry_count=policy.max_retry_count if policy is not None else 0)
                if inv.dead:
                    crashed, outcome = True, "crash"
                elif not result.ok:
                    outcome = f"raised {_error_name(result.exception)}"
                else:
                    inv.before_ack()  # the host may die before it checkpoints
            except SimulatedCrash:
                crashed, outcome = True, "crash"
            finally:
                elapsed = time.perf_counter() - started
                self.log.latency("event hubs batch", elapsed)
                for event in batch.events:
                    self.log.latency("event hubs event", elapsed / len(batch.events))
                    self.log.end(fn.name, event.origin, outcome)
            if crashed or outcome == "ok":
                break
            if attempt > self._max_retries():
                self.log.stats.gave_up += 1  # the host checkpoints anyway: events may be lost
                break
            self.log.stats.host_retries += 1
            self.clock.advance(self._retry_interval(attempt))
            time.sleep(0.02)
        if crashed:
            self.ownership.finish(batch, checkpoint=False)
            self.ownership.crash(instance, self.rng.choice)
        else:
            self.ownership.finish(batch, checkpoint=True)
        with self.namespace.changed:
            self.namespace.changed.notify_all()
