"""Faults injected at every boundary of the flow, without touching production code.

The app's stores come from the store factory the simulator hands to
`build_services` (its seam for this): each store is a `FaultyStore` that forwards to
the real one and, for the function invocation running on the current thread,
may crash, fail or stall at a chosen call. The notification API is wrapped
the same way (`FaultySender`). What a fault does follows a real failure:

* a **crash** (`SimulatedCrash`) is the worker process dying: from then on
  every store call, API call, settlement and checkpoint of that invocation
  fails without effect, and no cleanup code reaches the store (a dead process
  releases nothing). The simulated host then settles nothing (Service Bus:
  the lock runs out) or checkpoints nothing (Event Hubs: the next owner
  replays);
* a **transient store error** is `StoreUnavailableError` (throttled / 503)
  before the request reaches the server; a **timeout** is the same error
  *after* the request was applied (the client never saw the answer);
* **lock expiry mid-processing** takes the Service Bus lock back and waits
  until another consumer has the redelivered copy, then lets the first one
  finish: two consumers work on one message at once;
* a **store outage** stops the server process for a stretch of wall time
  (SIGSTOP, data kept; the SDK times out), or makes the wrapped stores fail
  fast (503) for a stretch of the simulation's virtual time (the mode for
  servers the harness did not start, and for sustained fail-fast outages).

Two outage modes model the two ways a store goes away. **pause**: requests
hang until the client times out (a stalled server, a network partition); its
clock is the wall clock, because the SDK's timeouts are. **fail-fast**: every
request fails at once with 503 (throttling storms, a failover); its clock is
the simulation's, the same clock that spaces redeliveries, lock expiries and
the host's retry backoff, so a 20 s outage lasts as long, relative to them,
as it would in production.

Harness-only variants prove the checks can fail: `DedupOffStore` (every
claim looks new), `NonAtomicStore` (marker and effect in separate steps) and
`FaultyStore(transient_as_permanent=True)` (a store client that reports a
transient failure as a permanent rejection, so the app refuses valid messages),
`OutboxBypassStore` (the commit's messages published before it, or right after it
without the outbox) and `MarkFirstDispatch` (an Event Hubs batch's mark moved
before its dispatch).
"""

from __future__ import annotations

import contextvars
import enum
import hashlib
import json
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from domain.notifications import HttpResponse, NotificationRetryError
from shared._core.exceptions import (
    IdempotencyError,
    RecordExistsError,
    StoreRequestError,
    StoreUnavailableError,
)
from shared._core.keys import store_safe_id
from shared._core.records import IdempotencyRecord
from shared._core.store import (
    Document,
    GetRecord,
    IdempotencyStore,
    ReadDocument,
    RecordDispatched,
    StepStore,
    StoreStep,
    WriteOp,
)


class SimulatedCrash(BaseException):
    """The worker process died here. A BaseException, so `except Exception` cannot swallow it."""


class FaultKind(enum.StrEnum):
    CRASH_BEFORE_CLAIM = "crash before the claim"
    CRASH_AFTER_CLAIM = "crash after the claim/commit, before the effect or return"
    CRASH_AFTER_EFFECT = "crash after the effect, before completion"
    CRASH_MID_BATCH = "crash in the middle of a batch"
    CRASH_BEFORE_ACK = "crash after commit, before ack/checkpoint"
    CRASH_BETWEEN_STEPS = "crash between marker and effect (non-atomic variant)"
    TRANSIENT = "transient store error (throttled/503)"
    TIMEOUT = "store timeout after the write was applied"
    LOCK_EXPIRY = "lock expired mid-processing"
    SENDER_ERROR = "notification API answered 503"
    SENDER_TIMEOUT = "notification API timed out after accepting"
    REBALANCE = "partition rebalance mid-batch"
    OUTAGE = "store outage (server paused)"
    CRASH_BEFORE_DISPATCH = "crash after commit, before dispatch"
    CRASH_MID_DISPATCH = "crash after some of the outgoing messages were sent"
    DISPATCH_TIMEOUT = "send timed out after the broker accepted it"
    BROKER_OUTAGE = "broker outage during dispatch"


#: Every way a dispatch after the commit can fail: the outbox's fault kinds.
OUTBOX_FAULTS = (FaultKind.CRASH_BEFORE_DISPATCH, FaultKind.CRASH_MID_DISPATCH,
                 FaultKind.DISPATCH_TIMEOUT, FaultKind.BROKER_OUTAGE)


def stable_seed(*parts: object) -> int:
    """A seed from values, identical in every process (unlike `hash()`)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at: int = 1  # the call (or write) number at which it fires


class FaultLog:
    """Counts faults that actually fired (a planned fault fires only if its call is reached)."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._counts: Counter[FaultKind] = Counter()
        self._lock = threading.Lock()
        self._clock = clock
        self.times: list[tuple[float, str]] = []  # (virtual time, kind) when a clock is given

    def fired(self, kind: FaultKind) -> None:
        with self._lock:
            self._counts[kind] += 1
            if self._clock is not None:
                self.times.append((self._clock(), kind.value))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {kind.value: n for kind, n in sorted(self._counts.items()) if n}

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


class FaultPlan:
    """Seeded choice of at most one fault per invocation, by kind and weight."""

    def __init__(self, seed: int, *, fault_rate: float, duplicate_rate: float,
                 non_atomic: bool = False) -> None:
        self.seed = seed
        self.fault_rate = max(0.0, fault_rate)
        self.duplicate_rate = max(0.0, duplicate_rate)
        self.non_atomic = non_atomic

    def _table(self, faults: Sequence[FaultKind], duplicates: Sequence[tuple[FaultKind, float]],
               *, fault_rate: float | None = None) -> list[tuple[FaultKind, float]]:
        rate = self.fault_rate if fault_rate is None else fault_rate
        table = [(kind, self.duplicate_rate * share) for kind, share in duplicates]
        if self.non_atomic:  # the counter-proof's point: crash between the two writes
            table.append((FaultKind.CRASH_BETWEEN_STEPS, rate))
        table += [(kind, rate / len(faults)) for kind in faults]
        return table

    def service_bus(self, style: str) -> list[tuple[FaultKind, float]]:
        """Weights for one Service Bus delivery; `style` is two_phase, atomic or natural."""
        faults = [FaultKind.CRASH_BEFORE_CLAIM, FaultKind.CRASH_AFTER_CLAIM, FaultKind.TRANSIENT,
                  FaultKind.TIMEOUT]
        if style == "two_phase":
            faults += [FaultKind.CRASH_AFTER_EFFECT, FaultKind.SENDER_ERROR,
                       FaultKind.SENDER_TIMEOUT]
        if style == "outbox":  # a commit that sends: every way the dispatch can fail
            faults += OUTBOX_FAULTS
        # Redelivery (a lost ack) and concurrent copies (a lost lock) are duplicate sources.
        return self._table(faults, [(FaultKind.CRASH_BEFORE_ACK, 0.15),
                                    (FaultKind.LOCK_EXPIRY, 0.15)])

    def event_hubs(self) -> list[tuple[FaultKind, float]]:
        """Weights for one Event Hubs batch (many store calls: three times the per-call rate;
        the outbox's kinds on top, at the same rate per kind)."""
        faults = [FaultKind.CRASH_BEFORE_CLAIM, FaultKind.CRASH_MID_BATCH, FaultKind.TRANSIENT,
                  FaultKind.TIMEOUT]
        # The batch's one dispatch (after every group committed, before the mark moves) can
        # fail in every way an orders dispatch can, each kind as likely as a store fault.
        faults += OUTBOX_FAULTS
        # Checkpoint replays: a crash before the checkpoint, or a rebalance mid-batch.
        return self._table(faults, [(FaultKind.CRASH_BEFORE_ACK, 0.15),
                                    (FaultKind.REBALANCE, 0.15)],
                           fault_rate=min(0.3, self.fault_rate * 3) * 2)

    def draw(self, key: str, table: list[tuple[FaultKind, float]], *, calls: int = 2
             ) -> Fault | None:
        """The fault for invocation `key` (deterministic for a seed), or None."""
        rng = random.Random(stable_seed(self.seed, key))
        roll, total = rng.random(), 0.0
        for kind, probability in table:
            total += probability
            if roll < total:
                return Fault(kind, at=rng.randint(1, max(1, calls)))
        return None


@dataclass
class Invocation:
    """One function invocation on the current thread, with the fault planned for it."""

    name: str
    fault: Fault | None
    log: FaultLog
    lock_expiry: Callable[[], None] | None = None
    batch: bool = False  # an Event Hubs batch (else one Service Bus message)
    held: list[Any] = field(default_factory=list)  # messages a counter-proof holds back
    dead: bool = False
    calls: int = 0
    writes: int = 0
    fired: bool = False

    def planned(self, *kinds: FaultKind) -> bool:
        return self.fault is not None and not self.fired and self.fault.kind in kinds

    def fire(self) -> None:
        self.fired = True
        assert self.fault is not None
        self.log.fired(self.fault.kind)

    def crash(self) -> SimulatedCrash:
        self.dead = True
        return SimulatedCrash(f"{self.name}: {self.fault.kind if self.fault else 'crash'}")

    def check_alive(self) -> None:
        if self.dead:
            raise SimulatedCrash(f"{self.name}: the process is gone")

    def before_ack(self) -> None:
        """Called by the host just before it settles or checkpoints."""
        self.check_alive()
        if self.planned(FaultKind.CRASH_BEFORE_ACK):
            self.fire()
            raise self.crash()

    def between_steps(self) -> None:
        """Called by the non-atomic variant between its two writes."""
        self.check_alive()
        if self.planned(FaultKind.CRASH_BETWEEN_STEPS):
            self.fire()
            raise self.crash()


_current = threading.local()
#: The invocation in this context: follows an `async def` function into its tasks and
#: `asyncio.to_thread` calls (the worker runs it on a coroutine scheduled from the caller's
#: context), where the thread-local answer is not set.
_current_in_context: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
    "simulated_invocation", default=None)


def current() -> Invocation | None:
    return getattr(_current, "invocation", None) or _current_in_context.get()


class invocation:
    """`with invocation(inv):` makes `inv` the current thread's (and context's) invocation."""

    def __init__(self, value: Invocation) -> None:
        self.value = value
        self._token: contextvars.Token[Invocation | None] | None = None

    def __enter__(self) -> Invocation:
        _current.invocation = self.value
        self._token = _current_in_context.set(self.value)
        return self.value

    def __exit__(self, *exc: object) -> None:
        _current.invocation = None
        if self._token is not None:
            _current_in_context.reset(self._token)


# -- outages ---------------------------------------------------------------------------
OUTAGE_MODES = ("auto", "pause", "fail-fast")


class OutageController:
    """Store outages for a stretch: pause a server process, or fail the wrapped stores.

    `mode`: `auto` pauses a server the harness started and otherwise fails the
    wrapped stores for `duration` wall seconds (the chaos runs' short outages);
    `pause` insists on pausing the process; `fail-fast` fails every call to the
    server's stores at once with 503 for `duration` seconds of `clock` (the
    simulation's virtual clock). `meets`: the n-th outage asked for starts at the
    next store call of `meets[n % len(meets)]` instead of at once, so each is sure
    to meet its consumer (a paused store otherwise holds every thread in other calls,
    and the simulated producer waits while events pile up behind a held batch).
    """

    def __init__(self, log: FaultLog, *, processes: dict[str, int] | None = None,
                 duration: float = 2.5, mode: str = "auto",
                 clock: Callable[[], float] | None = None, meets: tuple[str, ...] = ()) -> None:
        if mode not in OUTAGE_MODES:
            raise ValueError(f"unknown outage mode {mode!r}; one of {OUTAGE_MODES}")
        self.log = log
        self.processes = processes or {}  # server name -> pid of a server the harness started
        self.duration = duration
        self.mode = mode
        self.clock = clock
        self.meets = meets
        self._asked = 0  # outages asked for so far
        self._armed: list[tuple[str, str]] = []  # (server, function): outages waiting for a call
        self._until: dict[str, tuple[Callable[[], float], float]] = {}  # fail fast until
        self._paused_until: dict[str, float] = {}  # monotonic
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.history: list[tuple[str, str, float]] = []
        # Store calls an outage hit, "server: function" -> calls: failed (refused or timed
        # out), or held (made while the server was paused, answered once it was resumed).
        self.failed_calls: Counter[str] = Counter()
        self.held_calls: Counter[str] = Counter()

    def blocked(self, server: str) -> bool:
        """True while a fail-fast (proxy) outage of `server` lasts."""
        entry = self._until.get(server)
        return entry is not None and entry[0]() < entry[1]

    def active(self, server: str) -> bool:
        """True while any outage of `server` lasts (fail-fast or paused)."""
        paused = self._paused_until.get(server)
        return self.blocked(server) or (paused is not None and time.monotonic() < paused)

    def record_failure(self, server: str, function: str) -> None:
        with self._lock:
            self.failed_calls[f"{server}: {function}"] += 1

    def record_held(self, server: str, function: str) -> None:
        with self._lock:
            self.held_calls[f"{server}: {function}"] += 1

    @staticmethod
    def _alive(pid: int | None) -> bool:
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def start(self, server: str) -> None:
        if self.meets:
            with self._lock:
                self._armed.append((server, self.meets[self._asked % len(self.meets)]))
                self._asked += 1
            return
        self._begin(server)

    def on_call(self, server: str, function: str) -> None:
        """A store call of `function` on `server` is about to be made: an outage armed for it
        begins, unless one of `server` still lasts (outages of a server do not overlap)."""
        if (server, function) not in self._armed:
            return
        with self._lock:
            if (server, function) not in self._armed or self.active(server):
                return
            self._armed.remove((server, function))
        self._begin(server)

    def _begin(self, server: str) -> None:
        self.log.fired(FaultKind.OUTAGE)
        pid = self.processes.get(server)
        if self.mode == "fail-fast":
            mode = "fail-fast"
        elif self._alive(pid):
            mode = "pause"
        elif self.mode == "pause":
            raise RuntimeError(f"cannot pause {server}: the harness did not start it")
        else:
            mode = "proxy"
        with self._lock:
            self.history.append((server, mode, self.duration))
        if mode != "pause":
            clock = self.clock if mode == "fail-fast" and self.clock is not None else time.monotonic
            self._until[server] = (clock, clock() + self.duration)
            return
        assert pid is not None  # _alive
        # SIGSTOP the server's process group now (it keeps its data): the next call is held.
        group = os.getpgid(pid)
        self._paused_until[server] = time.monotonic() + self.duration
        os.killpg(group, signal.SIGSTOP)
        thread = threading.Thread(target=self._resume, args=(group,), daemon=True,
                                  name=f"outage-{server}")
        self._threads.append(thread)
        thread.start()

    def _resume(self, group: int) -> None:
        """SIGCONT the paused process group after the stretch."""
        try:
            time.sleep(self.duration)
        finally:
            os.killpg(group, signal.SIGCONT)

    def wait(self) -> None:
        for thread in self._threads:
            thread.join()


# -- store wrappers ---------------------------------------------------------------------
class _Forwarding(IdempotencyStore):
    """Forwards the store interface (and anything else) to `inner`."""

    def __init__(self, inner: IdempotencyStore) -> None:
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return self.inner.get_record(partition, record_id)

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self.inner.put_record_if_absent(record)

    def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self.inner.replace_record_if_unchanged(record)

    def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        self.inner.delete_record_if_unchanged(record)

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        return self.inner.commit(marker, operations, marker_body=marker_body, written=written)

    def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        return self.inner.record_dispatched(marker)

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        return self.inner.iter_pending(since_before=since_before)

    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        return self.inner.iter_records(in_progress_before=in_progress_before,
                                       expired_before=expired_before)

    def purge_expired(self, now: float) -> int:
        return self.inner.purge_expired(now)

    def read_document(self, partition: str, document_id: str) -> Document | None:
        return self.inner.read_document(partition, document_id)

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        return self.inner.write_documents(partition, operations)

    def close(self) -> None:
        self.inner.close()


def innermost(store: IdempotencyStore) -> IdempotencyStore:
    while isinstance(store, _Forwarding):
        store = store.inner
    return store


class FaultyStore(StepStore, _Forwarding):
    """Injects the current invocation's fault at the chosen store step: `perform`, what the
    drivers call, and the record and document operations (its steps, by name)."""

    def __init__(self, inner: IdempotencyStore, *, label: str, server: str,
                 outages: OutageController | None = None,
                 transient_as_permanent: bool = False) -> None:
        super().__init__(inner)
        self.label = label
        self.server = server
        self.outages = outages
        # Counter-proof: a 429/503 (fault or outage) surfaces as a permanent rejection (400).
        self.transient_as_permanent = transient_as_permanent

    def _unavailable(self, message: str, status: int) -> IdempotencyError:
        if self.transient_as_permanent:
            return StoreRequestError(f"{message}, misread as a permanent rejection", status_code=400)
        return StoreUnavailableError(message, status_code=status)

    def _run(self, action: Callable[[], Any], *, write: bool) -> Any:
        inv = current()
        if inv is None:  # maintenance, checks: no faults
            return action()
        inv.check_alive()
        inv.calls += 1
        if inv.planned(FaultKind.CRASH_BEFORE_CLAIM) and inv.calls == 1:
            inv.fire()
            raise inv.crash()
        # planned() is true only when a fault is set
        if inv.planned(FaultKind.TRANSIENT) and inv.calls >= inv.fault.at:  # type: ignore[union-attr]
            inv.fire()
            status = random.Random(inv.calls).choice((429, 503))
            raise self._unavailable(f"simulated {status} from {self.label}", status)
        # planned() is true only when a fault is set
        if inv.planned(FaultKind.LOCK_EXPIRY) and inv.calls >= inv.fault.at:  # type: ignore[union-attr]
            inv.fire()
            if inv.lock_expiry is not None:
                inv.lock_expiry()
        outages = self.outages
        if outages is not None:
            outages.on_call(self.server, inv.name)
        during = outages is not None and outages.active(self.server)
        if outages is not None and outages.blocked(self.server):
            outages.record_failure(self.server, inv.name)
            raise self._unavailable(f"simulated outage of {self.server}", 503)
        try:
            result = action()
        except StoreUnavailableError:
            if during:  # a call made while the server was paused: it timed out
                assert outages is not None
                outages.record_failure(self.server, inv.name)
            raise
        if during:
            assert outages is not None
            outages.record_held(self.server, inv.name)
        if write:
            inv.writes += 1
            at = inv.fault.at if inv.fault else 0
            if inv.planned(FaultKind.TIMEOUT) and inv.writes >= at:
                inv.fire()
                raise StoreUnavailableError(f"simulated timeout from {self.label} (write applied)")
            if inv.planned(FaultKind.CRASH_AFTER_CLAIM) and inv.writes >= 1:
                inv.fire()
                raise inv.crash()
            if inv.planned(FaultKind.CRASH_MID_BATCH) and inv.writes >= at:
                inv.fire()
                raise inv.crash()
        return result

    def perform(self, step: StoreStep) -> Any:
        """Every request a flow makes, faulted (clearing a marker's outbox is not: the outbox
        proofs fault the dispatch itself)."""
        if isinstance(step, RecordDispatched):
            return self.inner.perform(step)
        return self._run(lambda: self.inner.perform(step),
                         write=not isinstance(step, (GetRecord, ReadDocument)))


HWM_PREFIX = store_safe_id("hwm|")  # partitions of the Event Hubs high-water marks


class DedupOffStore(_Forwarding):
    """Harness flag `dedup off`: every claim and commit looks like a first delivery.

    Each record gets a fresh id (as a consumer without a stable key would
    write), new documents likewise, and the Event Hubs high-water mark is
    never found. Production code is unchanged; only what the store answers is.
    """

    @staticmethod
    def _suffix() -> str:
        return "~" + uuid.uuid4().hex[:12]

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self.inner.put_record_if_absent(record.evolve(record_id=record.id + self._suffix()))

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        suffix = self._suffix()  # nothing goes to `written`: the documents it writes are new
        fresh = marker.evolve(record_id=marker.id + suffix, etag=None)
        ops = [replace(op, id=op.id + suffix) if op.kind == "create" else op for op in operations]
        return self.inner.commit(fresh, ops, marker_body=marker_body)

    def read_document(self, partition: str, document_id: str) -> Document | None:
        if partition.startswith(HWM_PREFIX):
            return None
        return self.inner.read_document(partition, document_id)

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        if partition.startswith(HWM_PREFIX):
            operations = [replace(op, kind="upsert", etag=None) for op in operations]
        return self.inner.write_documents(partition, operations)


class NonAtomicStore(_Forwarding):
    """Harness flag `non-atomic`: the marker and the effect are written in two steps.

    `effect-first` is the classic naive consumer: look the key up, apply the
    effect, then record the key (a crash in between reprocesses: double
    effect). `marker-first` records the key, then applies the effect (a crash
    in between loses the effect).
    """

    def __init__(self, inner: IdempotencyStore, mode: str = "effect-first") -> None:
        super().__init__(inner)
        if mode not in ("effect-first", "marker-first"):
            raise ValueError(f"unknown non-atomic mode {mode!r}")
        self.mode = mode

    @staticmethod
    def _between_steps() -> None:
        inv = current()
        if inv is not None:
            inv.between_steps()

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        partition = marker.partition_key  # nothing goes to `written`: not one transaction
        if self.mode == "marker-first":
            committed = self.inner.commit(marker, [], marker_body=marker_body)
            self._between_steps()
            if operations:
                self.inner.write_documents(partition, operations)
            return committed
        if marker.etag is None and self.inner.get_record(partition, marker.id) is not None:
            raise RecordExistsError(marker.id)  # the lookup step
        if operations:
            self.inner.write_documents(partition, operations)
        self._between_steps()
        return self.inner.commit(marker, [], marker_body=marker_body)


# -- the notification API side --------------------------------------------------------
@dataclass
class ApiCall:
    channel: str
    key: str
    notification_id: str
    new_effect: bool  # False: the API recognised the Idempotency-Key and replayed its answer
    content: str = ""  # for an order's OrderAccepted: the order content it announces


def notification_id(body: dict[str, Any]) -> str:
    """What the checker names a notification by: the workload's id, or the order an
    `OrderAccepted` (published by `orders` through its outbox) announces."""
    if body.get("type") == "OrderAccepted":
        return f"OrderAccepted:{body.get('orderId')}"
    return str(body.get("notificationId"))


def announced(body: dict[str, Any]) -> str:
    if body.get("type") != "OrderAccepted":
        return ""
    return json.dumps([round(float(body.get("total") or 0), 2), body.get("lineCount")])


@dataclass
class FakeNotificationApi:
    """The third-party API: records every call; honours Idempotency-Key when told to.

    `calls` are what the checker reads; `requests` keep each raw (url, body, headers) for
    tests; `status` forces an answer (a test's outage or rejection).
    """

    honours_key: bool = True
    status: int | None = None
    calls: list[ApiCall] = field(default_factory=list)
    requests: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    _seen: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, url: str, data: bytes, headers: dict[str, str]) -> HttpResponse:
        body = json.loads(data)
        key = headers.get("Idempotency-Key", "")
        with self._lock:
            self.requests.append((url, body, dict(headers)))
            if self.status is not None:
                return HttpResponse(self.status, "{}")
            repeat = self.honours_key and key in self._seen
            self._seen.add(key)
            self.calls.append(ApiCall(str(body.get("channel")), key, notification_id(body),
                                      not repeat, announced(body)))
        return HttpResponse(200 if repeat else 202, "{}")

    def keys(self) -> list[str]:
        """The Idempotency-Key of every request, in order."""
        return [headers["Idempotency-Key"] for _, _, headers in self.requests]


class SimulatedDispatcher:
    """The outbox's dispatcher for the simulation: sends into the simulated broker (so what
    `orders` publishes reaches notify and audit with the broker's at-least-once behaviour and
    its duplicate detection), with the current invocation's dispatch faults.

    `namespace` is set once the host has built the broker's entities. `publish_first` is the
    counter-proof of publishing before the commit: it is called by `PublishBeforeCommitStore`.
    """

    def __init__(self) -> None:
        self.namespace: Any = None
        self.sent: Counter[str] = Counter()  # message id -> sends the broker took or dropped
        self.orders: dict[str, str] = {}  # message id -> the order an OrderAccepted announces
        self.bodies: dict[str, tuple[str, bytes]] = {}  # message id -> (destination, body)
        self._lock = threading.Lock()

    def _send(self, message: Any) -> None:
        from simulator.host_inputs import SentMessage
        from simulator.servicebus import Origin

        sent = SentMessage(message.body, message_id=message.message_id,
                           correlation_id=message.correlation_id, content_type=message.content_type,
                           application_properties=dict(message.properties) or None)
        try:
            body = json.loads(message.body)
        except ValueError:
            body = None
        with self._lock:
            self.sent[message.message_id] += 1
            self.bodies.setdefault(message.message_id, (message.destination, message.body))
            if isinstance(body, dict) and body.get("type") == "OrderAccepted":
                self.orders[message.message_id] = str(body.get("orderId"))
        self.namespace.send(message.destination, sent, Origin(f"outbox:{message.message_id}"))

    def dispatch(self, messages: Sequence[Any]) -> None:
        from shared._core.exceptions import DispatchUnavailableError

        inv = current()
        if inv is not None:
            inv.check_alive()
            if inv.planned(FaultKind.CRASH_BEFORE_DISPATCH):
                inv.fire()
                raise inv.crash()
            if inv.planned(FaultKind.BROKER_OUTAGE):
                inv.fire()
                raise DispatchUnavailableError("simulated: the broker is unreachable")
        for n, message in enumerate(messages):
            self._send(message)
            if (inv is not None and inv.planned(FaultKind.CRASH_MID_DISPATCH)
                    and n + 1 >= (len(messages) + 1) // 2):
                inv.fire()  # some (with one message: all) sent, nothing recorded
                raise inv.crash()
        if inv is not None and inv.planned(FaultKind.DISPATCH_TIMEOUT):
            inv.fire()
            raise DispatchUnavailableError("simulated: the send timed out after the broker took it")

    def close(self) -> None:
        pass


class OutboxBypassStore(_Forwarding):
    """Counter-proofs of the outbox: the commit's messages are published without it.

    `before-commit`: published before the transaction (as a handler that sends and then
    writes does), each send a new message (no outbox, no id to derive): a commit that then
    fails, or a copy that turns out a duplicate, has published anyway. `after-commit`:
    published right after the commit, not recorded with it: a crash between the two loses
    them, and the redelivery, a duplicate, has nothing to send.

    A marker of an Event Hubs batch (its messages carry their event's position) keeps them
    in the store as the checker's record of what committed, hidden from the app: the commit
    answers, and a read returns, the marker without them, so the batch never dispatches
    them and no sweep ever sees them.
    """

    def __init__(self, inner: IdempotencyStore, mode: str, dispatcher: Any) -> None:
        super().__init__(inner)
        if mode not in ("before-commit", "after-commit"):
            raise ValueError(f"unknown outbox bypass {mode!r}")
        self.mode = mode
        self.dispatcher = dispatcher

    @staticmethod
    def _hidden(record: IdempotencyRecord) -> IdempotencyRecord:
        if record.outbox_position is None:
            return record
        return record.evolve(outbox=(), outbox_position=None)

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        messages = marker.outbox
        if marker.outbox_position is None:
            marker = marker.evolve(outbox=())
        if messages and self.mode == "before-commit":
            self.dispatcher.dispatch([replace(m, message_id=str(uuid.uuid4())) for m in messages])
        committed = self.inner.commit(marker, operations, marker_body=marker_body, written=written)
        if messages and self.mode == "after-commit":
            self.dispatcher.dispatch(messages)
        return self._hidden(committed)

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        record = self.inner.get_record(partition, record_id)
        return None if record is None else self._hidden(record)


class MarkFirstDispatch:
    """Counter-proof of the Event Hubs outbox: the partition's mark moves before the batch's
    messages are sent. `dispatch` holds what an Event Hubs invocation dispatches; the mark's
    write, through `store(...)`, sends it right after it succeeded: a crash in between (a
    dispatch fault) loses it, since the replay finds its events under the mark. Everything
    else is dispatched at once."""

    def __init__(self, dispatcher: Any) -> None:
        self.inner = dispatcher

    def dispatch(self, messages: Sequence[Any]) -> None:
        inv = current()
        if inv is None or not inv.batch:
            self.inner.dispatch(messages)
            return
        inv.held.extend(messages)

    def marked(self) -> None:
        """The current invocation's mark was written: send what it held."""
        inv = current()
        if inv is not None and inv.held:
            held, inv.held = list(inv.held), []
            self.inner.dispatch(held)

    def store(self, inner: IdempotencyStore) -> IdempotencyStore:
        return _MarkThenDispatch(inner, self)

    def close(self) -> None:
        self.inner.close()


class _MarkThenDispatch(_Forwarding):
    """The mark's store for `MarkFirstDispatch`: after a mark is written, the held messages go."""

    def __init__(self, inner: IdempotencyStore, proof: MarkFirstDispatch) -> None:
        super().__init__(inner)
        self.proof = proof

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        written = self.inner.write_documents(partition, operations)
        if partition.startswith(HWM_PREFIX):
            self.proof.marked()
        return written


class FaultySender:
    """Wraps the API call with the current invocation's sender faults."""

    def __init__(self, api: Callable[[str, bytes, dict[str, str]], HttpResponse]) -> None:
        self.api = api

    def __call__(self, url: str, data: bytes, headers: dict[str, str]) -> HttpResponse:
        inv = current()
        if inv is None:
            return self.api(url, data, headers)
        inv.check_alive()
        if inv.planned(FaultKind.SENDER_ERROR):
            inv.fire()
            return HttpResponse(503, '{"title": "simulated: try again"}')
        response = self.api(url, data, headers)
        if inv.planned(FaultKind.SENDER_TIMEOUT):
            inv.fire()
            raise NotificationRetryError("simulated: timed out waiting for the API's answer")
        if inv.planned(FaultKind.CRASH_AFTER_EFFECT):
            inv.fire()
            raise inv.crash()
        return response
