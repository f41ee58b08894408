"""The order-audit Storage queue, end to end on a real queue: Azurite's queue service.

`python -m demo.queue_run` (and the default `./dev demo`, after the Service Bus and Event
Hubs runs): a producer puts `OrderAccepted` events on the `order-audit` queue, base64
encoded as the Functions trigger expects; a host-like listener
(`local_stack.queue_host.QueueTriggerHost`) receives them with a visibility timeout and
runs the `order_audit` function through the real Python worker, then deletes, releases or
moves each message to `<queue>-poison` as the Functions host does. Every redelivery is
the queue service's own: the same message id, the dequeue count raised, after a real
visibility timeout.

What goes wrong on purpose, per backend (Table Storage on Azurite, the Cosmos server):

* producer retries: some orders are sent twice (two messages, two ids, one order);
* host crashes: for some orders the host dies after the function returned and before
  the delete, so the queue redelivers the message when its visibility runs out;
* a store outage: the dedup store answers 503 for a while; the function raises, the host
  releases the message, the queue redelivers it after `visibilityTimeout`;
* a long store outage, longer than the dequeue window ((maxDequeueCount - 1) x
  visibilityTimeout): valid messages reach their last delivery and the consumer writes
  them to the poison queue (`MaxDequeueCountReached`), new orders, re-sends of orders
  already audited and two copies of one order among them; once the store is back,
  `python -m replay replay --source poison` (the tool's own code) brings them back;
* bad input: malformed events, an order id reused with other content (sent after the
  original was audited), a message that is not base64.

Checked from the stores and the poison queue afterwards: no order counted twice, no valid
order missing, every bad message refused with its reason on its first delivery, every valid
message the long outage poisoned replayed (none left in the poison queue), and the queue
empty. `--delete-first` seeds a bug (the host
deletes each message before the function commits) that the checks must catch.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("table", "cosmos")
CONSUMER = "order_audit"


@dataclass(frozen=True)
class QueueEndpoints:
    """Where the run's servers listen."""

    queue_connection_string: str
    table_connection_string: str
    cosmos_endpoint: str = ""
    cosmos_key: str = ""
    cosmos_verify: bool = False


@dataclass(frozen=True)
class QueueScenarioConfig:
    backend: str
    orders: int = 200
    customers: int = 16
    seed: int = 2024
    duplicate_rate: float = 0.15  # orders the producer sends twice
    invalid: int = 5  # malformed events
    conflicts: int = 3  # order ids reused with other content
    undecodable: int = 1  # not base64: the host poisons them without running the function
    crash_rate: float = 0.05  # orders whose messages crash the host once before the delete
    outage_seconds: float = 2.0  # one store outage, 503 on every dedup store request
    outage_after_calls: int | None = None  # it begins at this store request (default: about
    #                                        halfway, each new order costing two requests)
    long_outage_orders: int = 12  # new orders sent during the long outage (0: no long outage)
    long_outage_resends: int = 4  # re-sends of orders audited before it
    long_outage_copies: int = 2  # of the new orders, sent twice
    replay_poison: bool = True  # False seeds a bug: nobody replays (the checks must catch it)
    receive_visibility: float = 3.0  # the host's invisibility while running (Azure: 10 min)
    visibility_timeout: float = 2.0  # host.json visibilityTimeout: a failed message's delay
    max_dequeue_count: int = 5
    instances: int = 2
    batch_size: int = 4
    delete_first: bool = False  # the seeded bug
    timeout: float = 300.0


# -- the store outage --------------------------------------------------------------------------
def outage_store(inner: Any, *, after_calls: int, seconds: float) -> Any:
    """`inner` (a real store), answering 503 to every request for `seconds` of wall time from
    its `after_calls`-th request on: a fail-fast outage (throttling storm, failover)."""
    class OutageStore:
        """Forwards everything to `inner`; the steps the drivers hand it (`perform`) gated."""

        def __init__(self) -> None:
            self.inner = inner
            self.name = inner.name
            self.calls = 0
            self.failed = 0
            self.forced = False  # down until set back (the long outage)
            self.began: float | None = None
            self._lock = threading.Lock()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def perform(self, step: Any) -> Any:
            from shared._core.exceptions import StoreUnavailableError

            with self._lock:
                self.calls += 1
                if self.began is None and self.calls >= after_calls:
                    self.began = time.monotonic()
                down = self.forced or (self.began is not None
                                       and time.monotonic() - self.began < seconds)
                if down:
                    self.failed += 1
            if down:
                raise StoreUnavailableError("simulated store outage: 503", status_code=503)
            return inner.perform(step)

    return OutageStore()


# -- the workload ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sent:
    """One message the producer put on the queue."""

    kind: str  # order, duplicate, invalid, conflict, undecodable
    message_id: str
    order_id: str | None = None
    expected_reason: str | None = None


@dataclass
class Workload:
    run: str
    orders: dict[str, dict[str, Any]]  # order id -> the OrderAccepted body
    crashes: set[str]  # order ids whose messages crash the host once, after the commit
    duplicates: list[str]
    invalid: list[tuple[bytes, str]]  # (body, the reason it is refused with)
    conflicts: list[dict[str, Any]]
    undecodable: list[str]
    late: list[str] = field(default_factory=list)  # new orders sent during the long outage
    late_copies: list[str] = field(default_factory=list)  # of those, sent a second time
    resends: list[str] = field(default_factory=list)  # audited before it, sent again during it


def workload(config: QueueScenarioConfig) -> Workload:
    rng = random.Random(f"{config.seed}/{config.backend}")
    run = uuid.uuid4().hex[:8]
    customers = [f"{run}-c{n:03d}" for n in range(max(1, config.customers))]
    orders: dict[str, dict[str, Any]] = {}
    for n in range(config.orders):
        order_id = f"{run}-o{n:05d}"
        orders[order_id] = {"type": "OrderAccepted", "orderId": order_id,
                            "customerId": rng.choice(customers),
                            "currency": rng.choice(("EUR", "USD", "GBP")),
                            "total": round(rng.uniform(1, 500), 2),
                            "lineCount": rng.randint(1, 5)}
    ids = sorted(orders)
    duplicates = rng.sample(ids, min(len(ids), round(config.duplicate_rate * len(ids))))
    crash_count = max(1, round(config.crash_rate * len(ids))) if config.crash_rate > 0 else 0
    crashes = set(rng.sample(ids, min(len(ids), crash_count)))
    bad = [(b"{not json", "MalformedJson"),
           (json.dumps({"type": "OrderAccepted", "customerId": "c"}).encode(), "InvalidOrderAccepted"),
           (json.dumps({**orders[ids[0]], "orderId": f"{run}-bad-total", "total": -3}).encode(),
            "InvalidOrderAccepted"),
           (b"[" * 64 + b"]" * 64, "TooDeeplyNested"),
           (json.dumps({**orders[ids[0]], "orderId": f"{run}-bad-lines", "lineCount": 0}).encode(),
            "InvalidOrderAccepted")]
    invalid = [bad[n % len(bad)] for n in range(config.invalid)]
    conflicts = [{**orders[order_id], "total": orders[order_id]["total"] + 1}
                 for order_id in rng.sample(ids, min(len(ids), config.conflicts))]
    undecodable = [f"not base64: {run}-{n}!" for n in range(config.undecodable)]
    # The long outage: drawn last, so the rest of the workload is the same with or without it.
    reused = {body["orderId"] for body in conflicts} | crashes
    resends = rng.sample([i for i in ids if i not in reused],
                         min(len(ids) - len(reused), config.long_outage_resends))
    late: list[str] = []
    for n in range(config.long_outage_orders):
        order_id = f"{run}-late{n:03d}"
        orders[order_id] = {**orders[rng.choice(ids)], "orderId": order_id,
                            "total": round(rng.uniform(1, 500), 2)}
        late.append(order_id)
    copies = rng.sample(late, min(len(late), config.long_outage_copies))
    return Workload(run, orders, crashes, duplicates, invalid, conflicts, undecodable, late,
                    copies, resends)


# -- the report --------------------------------------------------------------------------------
@dataclass
class QueueReport:
    backend: str
    sent: Counter[str] = field(default_factory=Counter)
    host: Counter[str] = field(default_factory=Counter)  # the queue host's counts
    deliveries: int = 0
    redeliveries: int = 0
    crashes: int = 0
    crashed_redelivered: int = 0  # crashed messages the queue delivered again (same id)
    outage_failed_calls: int = 0
    poison_envelopes: Counter[str] = field(default_factory=Counter)  # by reason
    poison_host_copies: int = 0
    poisoned: int = 0  # valid messages the long outage sent to the poison queue
    replayed: Counter[str] = field(default_factory=Counter)  # the replay's results, by status
    duplicates: Counter[str] = field(default_factory=Counter)  # absorbed, by the metric's cause
    # Valid orders' deliveries that returned normally, beyond each order's first: producer
    # re-sends and redeliveries after a crash. Each must have been absorbed as a duplicate.
    duplicates_expected: int = 0
    double_effects: int = 0
    lost: int = 0
    left_on_queue: int = 0
    invalid_not_refused: int = 0
    refused_first: int = 0  # bad messages refused with their reason on their first delivery
    refused_late: int = 0  # refused, but not on the first delivery
    valid_refused: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def violations(self) -> list[str]:
        found = [f"{name} {value}" for name, value in (
            ("double effects", self.double_effects), ("lost", self.lost),
            ("left on the queue", self.left_on_queue),
            ("invalid input not refused", self.invalid_not_refused),
            ("refused after the first delivery", self.refused_late),
            ("valid messages refused", self.valid_refused)) if value]
        if self.crashed_redelivered < self.crashes:
            found.append(f"{self.crashes - self.crashed_redelivered} crashed message(s) not "
                         "redelivered by the queue")
        if self.replayed["replayed"] != self.poisoned:
            found.append(f"{self.poisoned} valid messages poisoned by the long outage, "
                         f"{self.replayed['replayed']} replayed ({dict(self.replayed)})")
        if sum(self.duplicates.values()) != self.duplicates_expected:
            found.append(f"{sum(self.duplicates.values())} duplicates absorbed, "
                         f"{self.duplicates_expected} copies sent or redelivered after a commit")
        return found + self.problems

    @property
    def ok(self) -> bool:
        return not self.violations()

    def summary(self) -> dict[str, Any]:
        return {**{k: v for k, v in dataclasses.asdict(self).items()
                   if k not in ("sent", "host", "poison_envelopes", "duplicates", "replayed")},
                "sent": dict(self.sent), "host": dict(self.host), "replayed": dict(self.replayed),
                "poisonEnvelopes": dict(self.poison_envelopes), "duplicates": dict(self.duplicates),
                "ok": self.ok}

    def format(self) -> str:
        sent = ", ".join(f"{n} {kind}" for kind, n in sorted(self.sent.items()))
        envelopes = ", ".join(f"{n} {reason}" for reason, n in sorted(self.poison_envelopes.items()))
        duplicates = ", ".join(f"{n} {cause}" for cause, n in sorted(self.duplicates.items()))
        lines = [
            f"== Storage queue order_audit on {self.backend} (Azurite queue service, real worker) ==",
            f"sent {sum(self.sent.values())} messages: {sent}",
            f"deliveries {self.deliveries}, of which redeliveries Azurite made {self.redeliveries} "
            f"(same id, dequeue count > 1); invocations {self.host['invocations']}",
            f"host crashes after the commit, before the delete: {self.crashes} "
            f"({self.crashed_redelivered} redelivered by the queue after its visibility timeout)",
            f"store outage: {self.outage_failed_calls} store requests answered 503; released "
            f"(function raised, message came back): {self.host['released']}",
            f"duplicates absorbed: {sum(self.duplicates.values())} of {self.duplicates_expected} "
            f"copies (producer re-sends + redeliveries after a crash; by the metric's cause: "
            f"{duplicates or 'none'})",
            f"long store outage (past the dequeue window): {self.poisoned} valid messages "
            f"poisoned as MaxDequeueCountReached; python -m replay brought back "
            f"{self.replayed['replayed']} (original ids and bodies) and refused "
            f"{self.replayed['refused']} (bad input and reused keys stay until fixed)",
            f"bad messages refused with their reason on their first delivery: {self.refused_first} "
            f"of {self.sent['invalid'] + self.sent['conflict']}",
            f"poison queue at the end: {sum(self.poison_envelopes.values())} envelopes with a reason "
            f"({envelopes or 'none'}), {self.poison_host_copies} host copies (not base64, never run)",
            f"double effects {self.double_effects}, lost {self.lost}, left on the queue "
            f"{self.left_on_queue}, invalid input not refused {self.invalid_not_refused}, refused "
            f"after the first delivery {self.refused_late}, valid messages refused "
            f"{self.valid_refused} ({self.seconds:.0f} s)",
        ]
        for violation in self.violations():
            lines.append(f"FAIL: {violation}")
        return "\n".join(lines)


# -- the run -----------------------------------------------------------------------------------
def app_settings(config: QueueScenarioConfig, endpoints: QueueEndpoints, queue: str) -> Any:
    """The app settings of one run: the sample's, pointed at the run's servers and queue."""
    from functions.settings import Settings
    from local_stack.worker import sample_settings

    env = {**sample_settings(ROOT), "DEDUP_BACKEND": config.backend,
           "TABLE_CONNECTION_STRING": endpoints.table_connection_string,
           "COSMOS_ENDPOINT": endpoints.cosmos_endpoint or "https://127.0.0.1:1/",
           "COSMOS_KEY": endpoints.cosmos_key, "COSMOS_VERIFY_TLS": str(endpoints.cosmos_verify).lower(),
           "COSMOS_DATABASE": "queue-demo", "AzureWebJobsStorage": endpoints.queue_connection_string,
           "ORDER_AUDIT_QUEUE_NAME": queue, "QUEUE_MAX_DEQUEUE_COUNT": str(config.max_dequeue_count),
           "NOTIFICATION_API_URL": "http://127.0.0.1:9/unused"}
    return Settings.from_env(env)


def run_queue_scenario(config: QueueScenarioConfig, endpoints: QueueEndpoints) -> QueueReport:
    """One backend's run; the worker is the process's (started on first use)."""
    from azure.storage.queue import QueueClient, TextBase64EncodePolicy
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from functions.services import build_services, real_stores, use_services
    from local_stack.queue_host import QueueHostOptions, QueueTriggerHost
    from local_stack.worker import WorkerHost, sample_settings
    from shared._core.telemetry import Telemetry

    started = time.perf_counter()
    work = workload(config)
    queue_name = f"audit-{work.run}"
    settings = app_settings(config, endpoints, queue_name)
    real = real_stores(settings)
    after_calls = config.outage_after_calls or max(1, config.orders)
    outage = outage_store(real("dedup"), after_calls=after_calls,
                          seconds=config.outage_seconds if config.outage_seconds > 0 else 0.0)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    services = build_services(settings, stores=lambda role: outage if role == "dedup" else real(role),
                              telemetry=Telemetry(meter_provider=provider))
    connection = endpoints.queue_connection_string
    raw = QueueClient.from_connection_string(connection, queue_name)
    raw_poison = QueueClient.from_connection_string(connection, f"{queue_name}-poison")
    producer = QueueClient.from_connection_string(connection, queue_name,
                                                  message_encode_policy=TextBase64EncodePolicy())
    raw.create_queue()
    raw_poison.create_queue()
    worker = WorkerHost.start(ROOT, sample_settings(ROOT))
    report = QueueReport(config.backend)
    sent: list[Sent] = []

    def send(kind: str, body: bytes | str, *, order_id: str | None = None,
             reason: str | None = None, encoded: bool = True) -> None:
        if encoded:
            text = body.decode("utf-8") if isinstance(body, bytes) else body
            message = producer.send_message(text)
        else:
            message = raw.send_message(body)
        sent.append(Sent(kind, message.id, order_id, reason))
        report.sent[kind] += 1

    crashed: set[str] = set()
    crash_lock = threading.Lock()

    def crash(message: Any) -> bool:
        """The host dies once per message of a chosen order, the first time its function
        returns normally (an earlier delivery may have met the outage)."""
        try:
            order_id = json.loads(message.body).get("orderId")
        except (ValueError, AttributeError):
            return False
        with crash_lock:
            if order_id not in work.crashes or message.message_id in crashed:
                return False
            crashed.add(message.message_id)
            return True

    def host_run() -> list[Any]:
        host = QueueTriggerHost(
            worker, "order_audit", queue=raw, poison=raw_poison, instances=config.instances,
            crash=crash, delete_first=config.delete_first,
            options=QueueHostOptions(max_dequeue_count=config.max_dequeue_count,
                                     visibility_timeout=config.visibility_timeout,
                                     receive_visibility=config.receive_visibility,
                                     batch_size=config.batch_size))
        try:
            host.run_until_drained(timeout=config.timeout)
        except TimeoutError as error:
            report.problems.append(str(error))
        report.host.update({k: v for k, v in host.stats.counts.items()})
        report.deliveries += host.stats.received
        report.redeliveries += host.stats.redeliveries
        deliveries.extend(host.stats.deliveries)
        return list(host.stats.deliveries)

    deliveries: list[Any] = []
    with use_services(services):
        rng = random.Random(f"{config.seed}/{config.backend}/order")
        first: list[tuple[str, bytes | str, str | None, str | None, bool]] = []
        for order_id, body in work.orders.items():
            if order_id not in work.late:
                first.append(("order", json.dumps(body), order_id, None, True))
        for order_id in work.duplicates:
            first.append(("duplicate", json.dumps(work.orders[order_id]), order_id, None, True))
        for body, reason in work.invalid:
            first.append(("invalid", body, None, reason, True))
        for text in work.undecodable:
            first.append(("undecodable", text, None, None, False))
        rng.shuffle(first)
        for kind, body, order_id, reason, encoded in first:
            send(kind, body, order_id=order_id, reason=reason, encoded=encoded)
        host_run()
        # Conflicts after the originals are audited: the first content of an order id wins.
        for body in work.conflicts:
            send("conflict", json.dumps(body), order_id=body["orderId"],
                 reason="IdempotencyKeyConflict")
        host_run()
        poisoned: set[str] = set()
        resubmitted: set[str] = set()
        if work.late:
            # The long outage: every delivery of these fails until the last one poisons them.
            late = [("late", o) for o in work.late] + [("late-duplicate", o)
                                                      for o in (*work.late_copies, *work.resends)]
            rng.shuffle(late)
            outage.forced = True
            for kind, order_id in late:
                send(kind, json.dumps(work.orders[order_id]), order_id=order_id)
            host_run()
            outage.forced = False
            poisoned = replay_poison_queue(report, services, connection, queue_name,
                                           replay=config.replay_poison)
            resubmitted = {d.message_id for d in host_run()}
        report.left_on_queue = int(raw.get_queue_properties().approximate_message_count or 0)
        _check(report, work, sent, deliveries, raw_poison, AuditReader(outage.inner),
               poisoned=poisoned, resubmitted=resubmitted)
    report.outage_failed_calls = int(outage.failed)
    report.duplicates = _duplicates(reader)
    report.seconds = time.perf_counter() - started
    provider.shutdown()
    with contextlib.suppress(Exception):
        raw.delete_queue()
        raw_poison.delete_queue()
    return report


def replay_poison_queue(report: QueueReport, services: Any, connection: str,
                        queue_name: str, *, replay: bool = True) -> set[str]:
    """`python -m replay replay --source poison`, on the run's queue: what the long outage
    poisoned is resubmitted (bad input stays refused); the original ids it poisoned."""
    from replay.poison import QueueRef, StoragePoisonQueues
    from replay.stores import document_lister
    from replay.tool import Filters, ReplayTool
    from shared._flows.parking import ParkingLot

    parked = services.stores["parked"]
    poison = StoragePoisonQueues.connect([QueueRef(CONSUMER, queue_name)],
                                         connection_string=connection)
    tool = ReplayTool(services, ParkingLot(parked, lister=document_lister(parked)), None,
                      operator="demo", clock=time.time, poison=poison)
    try:
        listed = tool.items(Filters(source="poison"))
        valid = {i.key for i in listed if i.reason == "MaxDequeueCountReached" and i.key}
        report.poisoned = sum(1 for i in listed if i.reason == "MaxDequeueCountReached")
        if replay:
            report.replayed.update(r.status for r in tool.replay(filters=Filters(source="poison")))
    finally:
        poison.close()
    return valid


class AuditReader:
    """The audit trail as stored, read from the real store (never through the outage)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def _read(self, customer_id: str, document_id: str) -> dict[str, Any] | None:
        from domain.order_audit import audit_partition

        document = self.store.read_document(audit_partition(customer_id), document_id)
        return None if document is None else dict(document.body)

    def summary(self, customer_id: str) -> dict[str, Any] | None:
        from domain.order_audit import SUMMARY_DOCUMENT

        return self._read(customer_id, SUMMARY_DOCUMENT)

    def entry(self, customer_id: str, order_id: str) -> dict[str, Any] | None:
        from domain.order_audit import entry_id

        return self._read(customer_id, entry_id(order_id))


VALID_KINDS = ("order", "duplicate", "late", "late-duplicate")


def _check(report: QueueReport, work: Workload, sent: list[Sent], deliveries: list[Any],
           poison: Any, trail: AuditReader, *, poisoned: AbstractSet[str] = frozenset(),
           resubmitted: AbstractSet[str] = frozenset()) -> None:
    from local_stack.queue_host import drain_poison

    # Crashes: each crashed message must come back (same id, a higher dequeue count).
    by_id: dict[str, list[Any]] = {}
    for delivery in deliveries:
        by_id.setdefault(delivery.message_id, []).append(delivery)
    crashed = [d for d in deliveries if d.outcome == "crashed-before-delete"]
    report.crashes = len(crashed)
    report.crashed_redelivered = sum(
        1 for crash in crashed
        if any(d.dequeue_count > crash.dequeue_count for d in by_id[crash.message_id]))
    # A poisoned message's deliveries never committed; its resubmission's (a new id) count.
    valid = {m.message_id for m in sent if m.kind in VALID_KINDS} - poisoned | resubmitted
    returned = sum(1 for d in deliveries if d.message_id in valid
                   and d.outcome in ("deleted", "crashed-before-delete"))
    report.duplicates_expected = returned - len(work.orders)
    # The poison queue: envelopes (the consumer's, with a reason) and host copies.
    envelopes: dict[str, list[dict[str, Any]]] = {}
    for text in drain_poison(poison):
        envelope = _envelope(text)
        if envelope is None:
            report.poison_host_copies += 1
            continue
        report.poison_envelopes[str(envelope.get("reason"))] += 1
        envelopes.setdefault(str(envelope.get("messageId")), []).append(envelope)
    for message in sent:
        found = envelopes.get(message.message_id, [])
        if message.kind in ("invalid", "conflict"):
            if not any(e.get("reason") == message.expected_reason for e in found):
                report.invalid_not_refused += 1
                report.problems.append(f"{message.kind} {message.message_id} not refused with "
                                       f"{message.expected_reason}: {found}")
            elif min(int(e.get("dequeueCount", 0)) for e in found) != 1:
                report.refused_late += 1
            else:
                report.refused_first += 1
        elif message.kind in VALID_KINDS and found:
            report.valid_refused += 1
            report.problems.append(f"valid {message.order_id} refused: {found[0].get('reason')}")
    undecodable = sum(1 for m in sent if m.kind == "undecodable")
    if report.poison_host_copies < undecodable:
        report.problems.append(f"{undecodable} undecodable message(s), "
                               f"{report.poison_host_copies} host copies in the poison queue")
    # The effects: each order's entry, each customer's count and total, exactly once.
    expected: dict[str, list[dict[str, Any]]] = {}
    for body in work.orders.values():
        expected.setdefault(body["customerId"], []).append(body)
    for customer, bodies in expected.items():
        for body in bodies:
            stored = trail.entry(customer, body["orderId"])
            if stored is None:
                report.lost += 1
            elif stored.get("totalCents") != round(body["total"] * 100):
                report.problems.append(f"entry {body['orderId']} holds {stored.get('totalCents')}")
        summary = trail.summary(customer) or {"orders": 0, "totalCents": 0}
        counted, wanted = int(summary["orders"]), len(bodies)
        report.double_effects += max(0, counted - wanted)
        if counted < wanted:
            report.problems.append(f"{customer}: {counted} orders counted, {wanted} audited")
        total = sum(round(b["total"] * 100) for b in bodies)
        if counted == wanted and int(summary["totalCents"]) != total:
            report.problems.append(f"{customer}: total {summary['totalCents']} != {total}")


def _envelope(text: str) -> dict[str, Any] | None:
    """A poison message as the consumer wrote it (base64 JSON with a reason), or None for the
    host's own copy of a message."""
    try:
        data = json.loads(base64.b64decode(text, validate=True))
    except ValueError:
        return None
    return data if isinstance(data, dict) and "reason" in data and "messageId" in data else None


def _duplicates(reader: Any) -> Counter[str]:
    """Duplicates the dedup flow absorbed, by cause (redelivery or producer_retry)."""
    found: Counter[str] = Counter()
    data = reader.get_metrics_data()
    for resource in (data.resource_metrics if data else []):
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "dedup.messages":
                    continue
                for point in metric.data.data_points:
                    attributes = dict(point.attributes)
                    if attributes.get("consumer") == CONSUMER and attributes.get("outcome") == "duplicate":
                        found[str(attributes.get("cause", "unknown"))] += int(point.value)
    return found


# -- servers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def servers(backends: Sequence[str]) -> Iterator[QueueEndpoints]:
    """Azurite (queue and table services) and, for cosmos, the Cosmos server, on free ports."""
    from local_stack import AZURITE_ACCOUNT, AZURITE_KEY, COSMOS_LOCAL_KEY, free_port
    from local_stack.servers import (
        azurite_queues,
        azurite_tables,
        cosmos_server,
        queue_connection_string,
    )

    queues, tables = azurite_queues(free_port()), azurite_tables(free_port())
    cosmos = cosmos_server(free_port()) if "cosmos" in backends else None
    with contextlib.ExitStack() as stack:
        for server in (queues, tables, cosmos):
            if server is not None:
                server.start()
                stack.callback(server.stop)
        yield QueueEndpoints(
            queue_connection_string=queue_connection_string(queues.port),
            table_connection_string=(
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                f"AccountKey={AZURITE_KEY};TableEndpoint=http://127.0.0.1:{tables.port}/"
                f"{AZURITE_ACCOUNT};"),
            cosmos_endpoint=f"https://127.0.0.1:{cosmos.port}/" if cosmos else "",
            cosmos_key=COSMOS_LOCAL_KEY if cosmos else "")


@contextlib.contextmanager
def _logs_to(path: str | None) -> Iterator[None]:
    """The app logs each refusal at ERROR and each retry at WARNING: into a file for the run,
    not into the report (the root logger's handlers are put back afterwards)."""
    import logging
    import warnings

    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
    logging.getLogger("azure").setLevel(logging.WARNING)
    if path is None:
        yield
        return
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    for old in saved:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for old in saved:
            root.addHandler(old)
        root.setLevel(level)


def run_demo(backends: Sequence[str], *, seed: int = 2024, log_path: str | None = None,
             **options: Any) -> tuple[str, dict[str, Any], bool]:
    """Every backend's run, one after the other: (report text, numbers, ok). The app's logs
    go to `log_path` when given."""
    reports: list[QueueReport] = []
    with _logs_to(log_path), servers(backends) as endpoints:
        for backend in backends:
            reports.append(run_queue_scenario(
                QueueScenarioConfig(backend=backend, seed=seed, **options), endpoints))
    text = "\n\n".join(report.format() for report in reports)
    ok = all(report.ok for report in reports)
    text += "\nQUEUE RESULT: " + ("all invariants hold" if ok else "INVARIANT BROKEN (see FAIL above)")
    return text, {r.backend: r.summary() for r in reports}, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m demo.queue_run",
        description="The order-audit Storage queue end to end on Azurite's queue service, through "
                    "the real worker, with producer retries, host crashes and a store outage.")
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--orders", type=int, default=QueueScenarioConfig.orders)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--crash-rate", type=float, default=QueueScenarioConfig.crash_rate)
    parser.add_argument("--duplicate-rate", type=float, default=QueueScenarioConfig.duplicate_rate)
    parser.add_argument("--outage-seconds", type=float, default=QueueScenarioConfig.outage_seconds)
    parser.add_argument("--delete-first", action="store_true",
                        help="counter-proof: the host deletes each message before the function "
                             "commits; the checks must report lost orders")
    parser.add_argument("--json", help="write the numbers to this JSON file")
    parser.add_argument("--log", default=None, help="write the app's logs to this file")
    args = parser.parse_args(argv)
    backends = list(BACKENDS) if args.backend == "both" else [args.backend]
    text, numbers, ok = run_demo(backends, seed=args.seed, orders=args.orders,
                                 crash_rate=args.crash_rate, duplicate_rate=args.duplicate_rate,
                                 outage_seconds=args.outage_seconds, delete_first=args.delete_first,
                                 log_path=args.log)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"ok": ok, "backends": numbers}, indent=2), "utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
