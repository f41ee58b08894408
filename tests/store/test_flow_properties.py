"""A stateful property test of the dedup flow: copies, crashes, leases, expiry, replays.

A Hypothesis state machine plays several consumer instances ("workers", two
with a completed-key cache, one without) delivering copies of a few messages
through `Idempotency.run` (two-phase; also split into the claim / effect /
complete-or-release steps a worker goes through) and `Idempotency.run_atomic`
(the marker plus a credit to an account document under its etag). A reference
model predicts every outcome, and after every step the invariants below are
checked against what the handlers did and what the store holds.

What the library promises, and so what is asserted:

* Within one retention epoch of a key the effect runs at most once, plus at
  most once more per takeover of a claim whose effect may have run without
  being recorded: its holder crashed after the effect, raised
  EffectUncertainError after it, or was still running when its lease ran
  out. Two-phase takeover is at-least-once by design; the model counts these
  exposures and allows nothing else. An epoch ends when the record expires:
  the TTL outlives the broker's redelivery window (checked by
  `IdempotencyConfig(window=...)`), so a copy after expiry is a new message.
* A holder that lost its lease is told (LeaseLostError from `complete`,
  LEASE_LOST from `run`, with the stored record's result) and never
  overwrites the taker's record.
* A completed key answers every later copy with its first result.
* A copy with the same key and different content is a conflict and never
  runs the effect.
* Live leases are exclusive: no two workers hold the same key unexpired.
* The atomic path credits the account once per marker lifetime, never for a
  duplicate, a conflict, or a commit that never happened.

Concurrency is deterministic. Each store request is atomic at the server, so
two copies interleave at request boundaries: the store is wrapped so that
copy B's whole step runs just before copy A's n-th request, and the
outcomes must then be those of some sequential order of A's phases and B.
The same machine runs on the in-memory store (many examples), on Azurite and
on the Cosmos server (few), and against a seeded check-then-act claim that
it must catch.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from shared import DedupKey, Idempotency, IdempotencyConfig, OutcomeStatus, request_hash
from shared._core.codec import record_fields
from shared._core.config import RedeliveryWindow
from shared._core.exceptions import EffectUncertainError, LeaseLostError, RecordExistsError
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import Document, IdempotencyStore, WriteOp
from shared._flows.cache import CompletedKeyCache
from shared.testing import InMemoryIdempotencyStore

LEASE = timedelta(seconds=54)
TTL = timedelta(days=2)
WINDOW = RedeliveryWindow()  # 10 deliveries x 5 min lock renewal + 1 day margin < TTL
# Clock moves: a second, just short of and just past the lease, just short of and past the TTL
# (short-of then a second lands exactly on the boundary, where a lease or record has run out).
CLOCK_STEPS = (1.0, LEASE.total_seconds() - 1, LEASE.total_seconds() + 1,
               TTL.total_seconds() - 1, TTL.total_seconds() + 1)
WORKERS = ("w0", "w1", "w2")
CACHED_WORKERS = ("w0", "w1")
UNCACHED_WORKER = "w2"
MESSAGES = ("pay/m0", "pay/m1", "audit/m0")  # consumer/message id: two consumers share m0
CREDITS = {"a0": 1, "a1": 1_000, "a2": 1_000_000}  # the balance counts each key's credits
VARIANTS = (0, 1)  # two contents per key: a copy with the other one is a conflict
VARIANT = st.sampled_from((0, 0, 0, 1))  # mostly the same content: conflicts, but not mostly
ACCOUNT = "account"
GRANTED = (OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER)
RACING_KINDS = ("claim", "deliver", "fail")
DELIVERY_KINDS = ("deliver", "fail", "uncertain", "uncertain_after_effect")
TWO_EFFECTS = "no key has two effects"
NO_ORDER = "no sequential order"

Observation = tuple[Any, ...]
Notes = dict[int, Observation]
ModelStep = Callable[["Model", Notes, float], None]


class Clock:
    """The flow's clock, moved by the machine: leases and TTLs run out without sleeping."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class ProcessDied(BaseException):
    """The worker process dies inside the business logic: nothing after that point runs."""


class DownstreamFailed(Exception):
    """A handler failed before its effect happened, so the flow may release the claim."""


# -- the store, with a seam for interleaving ----------------------------------------------
class Scheduled(IdempotencyStore):
    """Forwards every request to a store; can run another copy's step before the n-th one.

    Requests are atomic at the server, so running copy B's whole step just
    before copy A's n-th request is how two concurrent copies interleave
    (B contiguous, in any gap of A), deterministically.
    """

    def __init__(self, inner: IdempotencyStore) -> None:
        self.inner = inner
        self.name = inner.name
        self._action: Callable[[], None] | None = None
        self._at = 0
        self._ticks = 0
        self._ran_at: int | None = None

    def preempt(self, at: int, action: Callable[[], None]) -> None:
        """Run `action` just before the `at`-th request from now."""
        self._action, self._at, self._ticks, self._ran_at = action, at, 0, None

    def settle(self) -> int | None:
        """Disarm; the request number the action ran before, or None if it has not run."""
        self._action = None
        return self._ran_at

    def tick(self) -> None:
        """A request boundary: the armed action runs here when its turn has come."""
        if self._action is None:
            return
        self._ticks += 1
        if self._ticks == self._at:
            action, self._action, self._ran_at = self._action, None, self._ticks
            action()

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        self.tick()
        return self.inner.get_record(partition, record_id)

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        self.tick()
        return self.inner.put_record_if_absent(record)

    def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        self.tick()
        return self.inner.replace_record_if_unchanged(record)

    def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        self.tick()
        self.inner.delete_record_if_unchanged(record)

    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        self.tick()
        return self.inner.iter_records(in_progress_before=in_progress_before,
                                       expired_before=expired_before)

    def read_document(self, partition: str, document_id: str) -> Document | None:
        self.tick()
        return self.inner.read_document(partition, document_id)

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        self.tick()
        return self.inner.write_documents(partition, operations)

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        self.tick()
        return self.inner.commit(marker, operations, marker_body=marker_body, written=written)


class CheckThenActStore(InMemoryIdempotencyStore):
    """Seeded bug: "create if absent" as a read and then a blind write, two requests apart."""

    def __init__(self) -> None:
        super().__init__()
        self.between_requests: Callable[[], None] = lambda: None

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        if self.get_record(record.partition_key, record.id) is not None:
            raise RecordExistsError(record.id)
        self.between_requests()
        etag = self._etag()
        with self._lock:
            self._rows[(record.partition_key, record.id)] = (record_fields(record), etag)
        return record.evolve(etag=etag)


def check_then_act_store() -> Scheduled:
    """The seeded bug behind the scheduling seam; the gap between its requests is a boundary."""
    inner = CheckThenActStore()
    outer = Scheduled(inner)
    inner.between_requests = outer.tick
    return outer


# -- the reference model -----------------------------------------------------------------
@dataclass
class ModelRecord:
    """What the store should hold for a key (a two-phase record or an atomic marker)."""

    state: RecordState
    digest: str
    expires_at: float
    attempts: int = 1
    result: Any = None
    holder: int | None = None  # the claim holding it while in progress
    lease_until: float | None = None


@dataclass
class ModelClaim:
    """A granted two-phase claim and what became of its holder."""

    message: str
    epoch: int
    alive: bool = True
    effect_done: bool = False
    fate: str = "holding"


@dataclass
class Model:
    """The library's promises, executable: predicts outcomes and the records they leave."""

    lease: float
    ttl: float
    records: dict[str, ModelRecord] = field(default_factory=dict)
    epochs: Counter[str] = field(default_factory=Counter)
    claims: dict[int, ModelClaim] = field(default_factory=dict)
    exposures: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    first_results: dict[tuple[str, int], Any] = field(default_factory=dict)
    markers: dict[str, ModelRecord] = field(default_factory=dict)
    credits: Counter[str] = field(default_factory=Counter)

    def claim(self, cid: int, message: str, digest: str, now: float,
              takeover: bool) -> Observation:
        record = self.records.get(message)
        if record is None or record.expires_at <= now:
            if record is not None:
                self.epochs[message] += 1  # expired: a copy now is a new message
            return self._grant(cid, message, digest, now, 1, OutcomeStatus.PROCESSED)
        if record.digest != digest:
            return (OutcomeStatus.CONFLICT, record.result)
        if record.state is RecordState.COMPLETED:
            return (OutcomeStatus.DUPLICATE, record.result)
        assert record.lease_until is not None and record.holder is not None
        if record.lease_until > now:
            return (OutcomeStatus.IN_PROGRESS, None)
        if not takeover:
            return (OutcomeStatus.STALE, None)
        previous = self.claims[record.holder]
        if previous.alive:
            self.exposures[(message, previous.epoch, "holder still running after its lease")] += 1
        elif previous.effect_done:
            self.exposures[(message, previous.epoch, f"holder {previous.fate} after the effect")] += 1
        return self._grant(cid, message, digest, now, record.attempts + 1, OutcomeStatus.TAKEN_OVER)

    def _grant(self, cid: int, message: str, digest: str, now: float, attempts: int,
               status: OutcomeStatus) -> Observation:
        self.records[message] = ModelRecord(RecordState.IN_PROGRESS, digest, now + self.ttl,
                                            attempts, holder=cid, lease_until=now + self.lease)
        self.claims[cid] = ModelClaim(message, self.epochs[message])
        return (status, None)

    def effect(self, cid: int) -> None:
        self.claims[cid].effect_done = True

    def abandon(self, cid: int, fate: str) -> None:
        """The holder stops without completing or releasing: the record stays in progress."""
        self.claims[cid].alive = False
        self.claims[cid].fate = fate

    def complete(self, cid: int, result: Any) -> tuple[bool, Any]:
        """(accepted, stored result): refused when the claim is no longer the record's."""
        claim = self.claims[cid]
        claim.alive = False
        record = self.records.get(claim.message)
        if record is None or record.holder != cid:
            claim.fate = "lost its lease"
            return False, record.result if record is not None else None
        claim.fate = "completed"
        record.state, record.result, record.holder, record.lease_until = (
            RecordState.COMPLETED, result, None, None)
        assert (claim.message, claim.epoch) not in self.first_results
        self.first_results[(claim.message, claim.epoch)] = result
        return True, result

    def release(self, cid: int) -> None:
        claim = self.claims[cid]
        self.abandon(cid, "failed")
        record = self.records.get(claim.message)
        if record is not None and record.holder == cid:
            del self.records[claim.message]

    def exposed(self, message: str, epoch: int) -> int:
        return sum(count for (m, e, _), count in self.exposures.items() if (m, e) == (message, epoch))

    def credit(self, message: str, digest: str, result: Any, now: float) -> Observation:
        marker = self.markers.get(message)
        if marker is None or marker.expires_at <= now:
            attempts = marker.attempts + 1 if marker is not None else 1
            self.markers[message] = ModelRecord(RecordState.COMPLETED, digest, now + self.ttl,
                                                attempts, result=result)
            self.credits[message] += 1
            return (OutcomeStatus.PROCESSED, result)
        if marker.digest != digest:
            return (OutcomeStatus.CONFLICT, marker.result)
        return (OutcomeStatus.DUPLICATE, marker.result)


# -- operations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Copy:
    """One copy of a two-phase message delivered to a worker, and what its handler does."""

    op: int
    worker: str
    message: str
    variant: int
    kind: str  # claim | deliver | fail | uncertain | uncertain_after_effect
    takeover: bool = True

    @property
    def token(self) -> str:
        return f"t{self.op}"


@dataclass(frozen=True)
class Handle:
    """A claim a worker holds between its steps."""

    cid: int
    worker: str
    message: str
    held: IdempotencyRecord

    @property
    def token(self) -> str:
        return f"t{self.cid}"

    def __repr__(self) -> str:
        return f"Handle(claim={self.cid}, {self.worker}, {self.message})"


@dataclass(frozen=True)
class Finish:
    """The holder completes its claim with its result."""

    op: int
    handle: Handle


@dataclass(frozen=True)
class Abort:
    """The holder's handler failed before the effect: it releases the claim."""

    op: int
    handle: Handle


@dataclass(frozen=True)
class Credit:
    """One copy of an atomic message: credit the account once, with the marker."""

    op: int
    worker: str
    message: str
    variant: int
    crash: bool = False

    @property
    def token(self) -> str:
        return f"t{self.op}"


Op = Copy | Finish | Abort | Credit


def digest_of(message: str, variant: int) -> str:
    return request_hash({"message": message, "variant": variant})


class FlowMachine(RuleBasedStateMachine):
    """Copies of a few messages, several workers, one store; see the module docstring."""

    store_factory: ClassVar[staticmethod[[], Scheduled]]  # set per store by flow_machine
    check_every_key: ClassVar[bool] = True  # False: only the keys the last step touched
    examples: ClassVar[int] = 0
    first_failure: ClassVar[int | None] = None  # the example in which a check first failed

    claimed = Bundle("claimed")  # holders that have not run their effect
    affected = Bundle("affected")  # holders that ran the effect and have not completed

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.clock = Clock()
        self.store = type(self).store_factory()
        config = IdempotencyConfig(ttl=TTL, lease=LEASE, window=WINDOW, clock=self.clock)
        self.flows = {worker: Idempotency(self.store, config=config, cache=(
            CompletedKeyCache(clock=self.clock) if worker in CACHED_WORKERS else None))
            for worker in WORKERS}
        namespace = f"e{type(self).examples}"  # the server runs share one table/container
        self.keys = {message: DedupKey(message.split("/")[0], f"{namespace}-{message.split('/')[1]}")
                     for message in MESSAGES}
        self.credit_keys = {message: DedupKey("credit", f"{namespace}-{message}")
                            for message in CREDITS}
        self.partition = f"acct-{namespace}"
        self.store.inner.write_documents(self.partition,
                                         [WriteOp("create", ACCOUNT, {"balance": 0})])
        self.model = Model(LEASE.total_seconds(), TTL.total_seconds())
        self.next_op = 0
        self.effects: list[tuple[str, int]] = []  # (message, claim id) per effect that ran
        self.conflicted: set[int] = set()  # copies answered CONFLICT
        self.handles: dict[int, Handle] = {}  # claims held between steps
        self.granted: dict[int, IdempotencyRecord] = {}  # claims granted in the current step
        self.touched: set[str] = set()
        self.observed: Notes = {}  # what the last step's copies saw

    # -- helpers ---------------------------------------------------------------------
    def _check(self, condition: bool, message: str) -> None:
        if not condition:
            machine = type(self)
            if machine.first_failure is None:
                machine.first_failure = machine.examples
            raise AssertionError(message)

    def _op(self) -> int:
        self.next_op += 1
        return self.next_op

    def _execute(self, op: Op, *, during_handler: Callable[[], None] | None = None) -> Observation:
        if isinstance(op, Copy):
            return self._deliver(op, during_handler)
        if isinstance(op, Finish):
            self.touched.add(op.handle.message)
            try:
                done = self.flows[op.handle.worker].complete(op.handle.held, op.handle.token)
            except LeaseLostError as error:
                stored = error.record
                return (OutcomeStatus.LEASE_LOST,
                        stored.result if isinstance(stored, IdempotencyRecord) else None)
            return ("completed", done.result)
        if isinstance(op, Abort):
            self.touched.add(op.handle.message)
            self.flows[op.handle.worker].release(op.handle.held)
            return ("released",)
        return self._credit(op)

    def _deliver(self, op: Copy, during_handler: Callable[[], None] | None) -> Observation:
        flow, key = self.flows[op.worker], self.keys[op.message]
        digest = digest_of(op.message, op.variant)
        self.touched.add(op.message)
        if op.kind == "claim":
            outcome, held = flow.claim(key, digest, takeover_stale=op.takeover)
            if held is not None:
                self.granted[op.op] = held
            return (outcome.status, outcome.result)

        def handler() -> str:
            if op.kind == "fail":
                raise DownstreamFailed(op.token)
            if op.kind in ("deliver", "uncertain_after_effect"):
                self.effects.append((op.message, op.op))
            if during_handler is not None:
                during_handler()
            if op.kind.startswith("uncertain"):
                raise EffectUncertainError("the downstream timed out after the request was sent")
            return op.token

        try:
            outcome = flow.run(key, digest, handler, takeover_stale=op.takeover,
                               context={"worker": op.worker})
        except DownstreamFailed:
            return ("raised",)
        except EffectUncertainError as error:
            kept = error.record
            self._check(isinstance(kept, IdempotencyRecord) and kept.state is RecordState.IN_PROGRESS,
                        f"EffectUncertainError must carry the claim it keeps, got {kept!r}")
            return ("uncertain",)
        return (outcome.status, outcome.result)

    def _credit(self, op: Credit) -> Observation:
        amount = CREDITS[op.message]
        self.touched.add(op.message)

        def build(tx: Any) -> str:
            account = tx.read(ACCOUNT)
            tx.replace(ACCOUNT, {"balance": account.body["balance"] + amount}, etag=account.etag)
            tx.create(f"receipt-{op.token}", {"message": op.message})
            if op.crash:
                raise ProcessDied(op.token)  # the commit never happens
            return op.token

        try:
            outcome = self.flows[op.worker].run_atomic(
                self.credit_keys[op.message], digest_of(op.message, op.variant), build,
                partition=self.partition, context={"worker": op.worker})
        except ProcessDied:
            return ("crashed",)
        return (outcome.status, outcome.result)

    def _phases(self, op: Op) -> list[ModelStep]:
        """The op's atomic steps in the model: where another copy's step can fall between."""
        if isinstance(op, Finish):
            def finish(model: Model, notes: Notes, now: float) -> None:
                accepted, stored = model.complete(op.handle.cid, op.handle.token)
                notes[op.op] = ("completed", stored) if accepted else (OutcomeStatus.LEASE_LOST,
                                                                       stored)
            return [finish]
        if isinstance(op, Abort):
            def abort(model: Model, notes: Notes, now: float) -> None:
                model.release(op.handle.cid)
                notes[op.op] = ("released",)
            return [abort]
        if isinstance(op, Credit):
            def credit(model: Model, notes: Notes, now: float) -> None:
                notes[op.op] = ("crashed",) if op.crash else model.credit(
                    op.message, digest_of(op.message, op.variant), op.token, now)
            return [credit]
        return self._copy_phases(op)

    def _copy_phases(self, op: Copy) -> list[ModelStep]:
        digest = digest_of(op.message, op.variant)

        def claim(model: Model, notes: Notes, now: float) -> None:
            notes[op.op] = model.claim(op.op, op.message, digest, now, op.takeover)
            if notes[op.op][0] not in GRANTED:
                return
            if op.kind in ("deliver", "uncertain_after_effect"):
                model.effect(op.op)
            if op.kind.startswith("uncertain"):
                model.abandon(op.op, "raised EffectUncertainError")
                notes[op.op] = ("uncertain",)

        def finish(model: Model, notes: Notes, now: float) -> None:
            status = notes[op.op][0]
            if status not in GRANTED:
                return
            if op.kind == "fail":
                model.release(op.op)
                notes[op.op] = ("raised",)
                return
            accepted, stored = model.complete(op.op, op.token)
            notes[op.op] = (status, op.token) if accepted else (OutcomeStatus.LEASE_LOST, stored)

        return [claim, finish] if op.kind in ("deliver", "fail") else [claim]

    def _adopt(self, orders: Sequence[Sequence[tuple[ModelStep, float]]], observed: Notes,
               what: str) -> None:
        """Keep the model of the first sequential order that explains what was observed."""
        tried = []
        for order in orders:  # one order: no copy needed (a mismatch ends the example anyway)
            model, notes = (self.model if len(orders) == 1 else copy.deepcopy(self.model)), {}
            for phase, now in order:
                phase(model, notes, now)
            predicted = {op: notes[op] for op in observed}
            if predicted == observed:
                self.model, self.observed = model, observed
                self._record(observed)
                return
            tried.append(predicted)
        self._check(False, f"{what}: observed {observed}; {NO_ORDER} of the copies gives that "
                           f"(the model predicts one of {tried})")

    def _record(self, observed: Notes) -> None:
        for op, seen in observed.items():
            event(f"outcome: {seen[0]}")
            if seen[0] is OutcomeStatus.CONFLICT:
                self.conflicted.add(op)
        for (_, _, kind), _count in self.model.exposures.items():
            event(f"exposure: {kind}")

    def _handles_from(self, ops: Sequence[Op]) -> list[Handle]:
        handles = []
        for op in ops:
            if isinstance(op, Copy) and op.op in self.granted:
                handle = Handle(op.op, op.worker, op.message, self.granted.pop(op.op))
                self.handles[handle.cid] = handle
                handles.append(handle)
        return handles

    def _solo(self, op: Op) -> list[Handle]:
        self.touched.clear()
        now = self.clock.now
        observed = {op.op: self._execute(op)}
        self._adopt([[(phase, now) for phase in self._phases(op)]], observed, f"{op}")
        self._check_receipts([op])
        return self._handles_from([op])

    def _race(self, first: Op, second: Op, at: int) -> list[Handle]:
        """`second` runs whole just before `first`'s `at`-th store request (or after it)."""
        self.touched.clear()
        now, effects_before = self.clock.now, len(self.effects)
        observed: Notes = {}
        self.store.preempt(at, lambda: observed.__setitem__(second.op, self._execute(second)))
        observed[first.op] = self._execute(first)
        ran_at = self.store.settle()
        if ran_at is None:
            observed[second.op] = self._execute(second)
        ours = Counter(message for message, _ in self.effects[effects_before:])
        for message, count in ours.items():  # the clock stood still: no takeover can excuse it
            self._check(count <= 1, f"{TWO_EFFECTS}: {count} racing copies of {message} all ran "
                                    f"the effect ({first} and {second}, observed {observed})")
        a, b = self._phases(first), self._phases(second)
        positions = ([0] if ran_at == 1 else [len(a)] if ran_at is None
                     else range(len(a) + 1))
        orders = [[(phase, now) for phase in [*a[:p], *b, *a[p:]]] for p in positions]
        self._adopt(orders, observed, f"{second} ran before request {ran_at} of {first}")
        self._check_receipts([first, second])
        return self._handles_from([first, second])

    def _drop(self, handle: Handle) -> None:
        del self.handles[handle.cid]

    def _check_receipts(self, ops: Sequence[Op]) -> None:
        """A credit committed its receipt exactly when it was processed (never on a conflict)."""
        for op in ops:
            if isinstance(op, Credit):
                receipt = self.store.inner.read_document(self.partition, f"receipt-{op.token}")
                processed = self.model.markers.get(op.message) is not None and \
                    self.model.markers[op.message].result == op.token
                self._check((receipt is not None) == processed,
                            f"{op}: receipt {'missing' if processed else 'written'} although the "
                            f"copy was {'processed' if processed else 'not processed'}")

    def _live_completed(self) -> list[str]:
        now = self.clock.now
        return sorted(message for message, record in self.model.records.items()
                      if record.state is RecordState.COMPLETED and record.expires_at > now)

    def _live_markers(self) -> list[str]:
        now = self.clock.now
        return sorted(message for message, marker in self.model.markers.items()
                      if marker.expires_at > now)

    # -- two-phase: one copy, step by step ---------------------------------------------
    @rule(target=claimed, worker=st.sampled_from(WORKERS), message=st.sampled_from(MESSAGES),
          variant=VARIANT, takeover=st.booleans())
    def claim(self, worker: str, message: str, variant: int, takeover: bool) -> Any:
        return multiple(*self._solo(Copy(self._op(), worker, message, variant, "claim", takeover)))

    @rule(target=affected, worker=st.sampled_from(WORKERS), message=st.sampled_from(MESSAGES),
          variant=VARIANT, takeover=st.booleans())
    def claim_and_run_the_effect(self, worker: str, message: str, variant: int,
                                 takeover: bool) -> Any:
        handles = self._solo(Copy(self._op(), worker, message, variant, "claim", takeover))
        for handle in handles:
            self.effects.append((handle.message, handle.cid))
            self.model.effect(handle.cid)
        return multiple(*handles)

    @rule(target=affected, handle=consumes(claimed),
          then=st.sampled_from(("run the effect", "run the effect", "fail and release", "crash")))
    def after_the_claim(self, handle: Handle, then: str) -> Any:
        """The holder runs its effect, or its handler fails (release), or its process dies."""
        if then == "run the effect":
            self.effects.append((handle.message, handle.cid))
            self.model.effect(handle.cid)
            return handle
        self._drop(handle)
        if then == "crash":
            self.model.abandon(handle.cid, "crashed")
        else:
            self._solo(Abort(self._op(), handle))
        return multiple()

    @rule(handle=consumes(affected), then=st.sampled_from(("complete", "complete", "crash")))
    def after_the_effect(self, handle: Handle, then: str) -> None:
        """The holder completes with its result, or dies before it could."""
        self._drop(handle)
        if then == "crash":
            self.model.abandon(handle.cid, "crashed")
        else:
            self._solo(Finish(self._op(), handle))

    # -- two-phase: whole deliveries ---------------------------------------------------
    @rule(worker=st.sampled_from(WORKERS), message=st.sampled_from(MESSAGES),
          variant=VARIANT, kind=st.sampled_from(DELIVERY_KINDS),
          takeover=st.booleans())
    def deliver(self, worker: str, message: str, variant: int, kind: str, takeover: bool) -> None:
        self._solo(Copy(self._op(), worker, message, variant, kind, takeover))

    @precondition(lambda self: bool(self._live_completed()))
    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def replay_a_completed_key(self, data: st.DataObject, worker: str) -> None:
        message = data.draw(st.sampled_from(self._live_completed()), label="message")
        record = self.model.records[message]
        variant = next(v for v in VARIANTS if digest_of(message, v) == record.digest)
        first = self.model.first_results[(message, self.model.epochs[message])]
        op = Copy(self._op(), worker, message, variant, "deliver")
        self._solo(op)
        self._check(not any(cid == op.op for _, cid in self.effects),
                    f"a replay of completed {message} ran the effect again")
        self._check(self.observed[op.op] == (OutcomeStatus.DUPLICATE, first),
                    f"a replay of completed {message} answered {self.observed[op.op]}, not its "
                    f"first result {first!r}")

    @rule(step=st.sampled_from(CLOCK_STEPS))
    def advance_the_clock(self, step: float) -> None:
        self.clock.now += step

    # -- two-phase: concurrent copies --------------------------------------------------
    @rule(target=claimed, a=st.sampled_from(WORKERS), b=st.sampled_from(WORKERS),
          message=st.sampled_from(MESSAGES), va=VARIANT,
          vb=VARIANT, a_kind=st.sampled_from(RACING_KINDS),
          b_kind=st.sampled_from(RACING_KINDS), at=st.integers(1, 4))
    def race_two_copies(self, a: str, b: str, message: str, va: int, vb: int, a_kind: str,
                        b_kind: str, at: int) -> Any:
        first = Copy(self._op(), a, message, va, a_kind)
        second = Copy(self._op(), b, message, vb, b_kind)
        return multiple(*self._race(first, second, at))

    @rule(target=claimed, handle=consumes(affected), a=st.sampled_from(WORKERS),
          variant=VARIANT, a_kind=st.sampled_from(RACING_KINDS),
          at=st.integers(1, 4))
    def race_a_copy_with_a_completion(self, handle: Handle, a: str, variant: int, a_kind: str,
                                      at: int) -> Any:
        self._drop(handle)
        first = Copy(self._op(), a, handle.message, variant, a_kind)
        return multiple(*self._race(first, Finish(self._op(), handle), at))

    @rule(target=claimed, handle=consumes(claimed), a=st.sampled_from(WORKERS),
          variant=VARIANT, a_kind=st.sampled_from(RACING_KINDS),
          at=st.integers(1, 4))
    def race_a_copy_with_a_release(self, handle: Handle, a: str, variant: int, a_kind: str,
                                   at: int) -> Any:
        self._drop(handle)
        first = Copy(self._op(), a, handle.message, variant, a_kind)
        return multiple(*self._race(first, Abort(self._op(), handle), at))

    @rule(target=claimed, a=st.sampled_from(WORKERS), b=st.sampled_from(WORKERS),
          message=st.sampled_from(MESSAGES), va=VARIANT,
          vb=VARIANT, b_kind=st.sampled_from(RACING_KINDS))
    def stall_past_the_lease(self, a: str, b: str, message: str, va: int, vb: int,
                             b_kind: str) -> Any:
        """A's handler runs the effect, then stalls past its lease while B delivers a copy."""
        self.touched.clear()
        first = Copy(self._op(), a, message, va, "deliver")
        second = Copy(self._op(), b, message, vb, b_kind)
        before = self.clock.now
        observed: Notes = {}

        def stall() -> None:
            self.clock.now += LEASE.total_seconds() + 1
            observed[second.op] = self._execute(second)

        observed[first.op] = self._execute(first, during_handler=stall)
        if second.op not in observed:  # A was not granted the key, so it never stalled
            stall()
        after = self.clock.now
        claim_phase, finish_phase = self._phases(first)
        order = [(claim_phase, before), *((phase, after) for phase in self._phases(second)),
                 (finish_phase, after)]
        self._adopt([order], observed, f"{second} while {first} stalled past its lease")
        return multiple(*self._handles_from([first, second]))

    # -- atomic ------------------------------------------------------------------------
    @rule(worker=st.sampled_from(WORKERS), message=st.sampled_from(tuple(CREDITS)),
          variant=VARIANT)
    def credit(self, worker: str, message: str, variant: int) -> None:
        self._solo(Credit(self._op(), worker, message, variant))

    @rule(message=st.sampled_from(tuple(CREDITS)), variant=VARIANT)
    def crash_before_the_commit(self, message: str, variant: int) -> None:
        """The worker dies after building the writes: the commit never happens. (The worker
        without a cache, so the build always runs; a cache hit would answer first.)"""
        self._solo(Credit(self._op(), UNCACHED_WORKER, message, variant, crash=True))

    @precondition(lambda self: bool(self._live_markers()))
    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def replay_a_credit(self, data: st.DataObject, worker: str) -> None:
        message = data.draw(st.sampled_from(self._live_markers()), label="message")
        marker = self.model.markers[message]
        variant = next(v for v in VARIANTS if digest_of(message, v) == marker.digest)
        before = self.model.credits[message]
        self._solo(Credit(self._op(), worker, message, variant))
        self._check(self.model.credits[message] == before,
                    f"a replay of credited {message} was credited again")

    @rule(a=st.sampled_from(WORKERS), b=st.sampled_from(WORKERS),
          first_message=st.sampled_from(tuple(CREDITS)),
          second_message=st.sampled_from(tuple(CREDITS)), va=VARIANT,
          vb=VARIANT, at=st.integers(1, 5))
    def race_two_credits(self, a: str, b: str, first_message: str, second_message: str,
                         va: int, vb: int, at: int) -> None:
        first = Credit(self._op(), a, first_message, va)
        second = Credit(self._op(), b, second_message, vb)
        self._race(first, second, at)

    # -- invariants --------------------------------------------------------------------
    def _to_check(self, messages: Sequence[str]) -> list[str]:
        if type(self).check_every_key:
            return list(messages)
        return [message for message in messages if message in self.touched]

    @invariant()
    def no_key_has_two_effects(self) -> None:
        per_epoch: Counter[tuple[str, int]] = Counter()
        for message, cid in self.effects:
            claim = self.model.claims.get(cid)
            self._check(claim is not None, f"the effect of copy {cid} ran although the store "
                                           f"never granted it {message}")
            assert claim is not None
            per_epoch[(message, claim.epoch)] += 1
        for (message, epoch), count in per_epoch.items():
            excused = self.model.exposed(message, epoch)
            self._check(count <= 1 + excused,
                        f"{TWO_EFFECTS}: {message} ran its effect {count} times in retention "
                        f"epoch {epoch}, with {excused} takeover(s) of a claim whose effect may "
                        "have run")

    @invariant()
    def completed_keys_keep_their_first_result(self) -> None:
        """The stored record is the model's (state, content, result, lease, expiry, attempts)."""
        now = self.clock.now
        for message in self._to_check(MESSAGES):
            key = self.keys[message]
            self._compare(message, self.store.inner.get_record(key.encoded, key.encoded),
                          self.model.records.get(message), now)
            record = self.model.records.get(message)
            if record is not None and record.state is RecordState.COMPLETED:
                first = self.model.first_results[(message, self.model.epochs[message])]
                self._check(record.result == first, f"{message} completed with {record.result!r}, "
                                                    f"its first result was {first!r}")

    def _compare(self, message: str, stored: IdempotencyRecord | None,
                 expected: ModelRecord | None, now: float) -> None:
        if expected is None:
            self._check(stored is None, f"{message}: the store holds {stored} where the model "
                                        "has no record")
            return
        if expected.expires_at <= now:
            return  # expired: the store may keep it or drop it (Cosmos TTL)
        self._check(stored is not None, f"{message}: record missing, the model has {expected}")
        assert stored is not None
        seen = (stored.state, stored.request_hash, stored.result, stored.attempts)
        wanted = (expected.state, expected.digest, expected.result, expected.attempts)
        self._check(seen == wanted, f"{message}: stored (state, hash, result, attempts) {seen}, "
                                    f"the model has {wanted}")
        for name, got, want in (("lease", stored.lease_expires_at, expected.lease_until),
                                ("expiry", stored.expires_at, expected.expires_at)):
            self._check((got is None) == (want is None) and (
                got is None or want is None or math.isclose(got, want, abs_tol=1e-3)),
                f"{message}: stored {name} {got}, the model has {want}")

    @invariant()
    def conflicts_never_run_the_effect(self) -> None:
        ran = {cid for _, cid in self.effects} & self.conflicted
        self._check(not ran, f"copies {sorted(ran)} were told CONFLICT but ran the effect")

    @invariant()
    def live_leases_are_exclusive(self) -> None:
        now = self.clock.now
        live = Counter(handle.message for handle in self.handles.values()
                       if handle.held.lease_expires_at is not None
                       and handle.held.lease_expires_at > now)
        for message, count in live.items():
            self._check(count <= 1, f"{count} workers hold {message} under a live lease")

    @invariant()
    def the_account_is_credited_once_per_marker_lifetime(self) -> None:
        now = self.clock.now
        for message in self._to_check(tuple(CREDITS)):
            key = self.credit_keys[message]
            self._compare(message, self.store.inner.get_record(self.partition, key.encoded),
                          self.model.markers.get(message), now)
        if type(self).check_every_key or self.touched & set(CREDITS):
            account = self.store.inner.read_document(self.partition, ACCOUNT)
            assert account is not None
            balance = account.body["balance"]
            counted = {message: balance // amount % 1000 for message, amount in CREDITS.items()}
            allowed = {message: self.model.credits[message] for message in CREDITS}
            self._check(counted == allowed, f"the account was credited {counted} times; the "
                                            f"marker lifetimes allow {allowed}")


def flow_machine(store_factory: Callable[[], Scheduled], *,
                 check_every_key: bool = True) -> type[FlowMachine]:
    """A FlowMachine on its own store, with its own example counters."""
    return type("FlowMachineOn" + store_factory.__name__.title().replace("_", ""), (FlowMachine,), {
        "store_factory": staticmethod(store_factory), "check_every_key": check_every_key,
        "examples": 0, "first_failure": None})


def memory_store() -> Scheduled:
    return Scheduled(InMemoryIdempotencyStore())


# Steps run the flow against a store (and servers): slow steps are the flow's time, not the
# generator's, so the too-slow health check and the per-example deadline do not apply.
MEMORY_RUN = settings(max_examples=100, stateful_step_count=50, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])
SERVER_RUN = settings(MEMORY_RUN, max_examples=15, stateful_step_count=20)
# The seeded-bug run: the memory budget, a fixed seed, and no shrinking (it would take a minute
# to shrink to the two racing claims; run without `phases` to see the minimal example).
SEEDED_RUN = settings(MEMORY_RUN, derandomize=True, database=None, report_multiple_bugs=False,
                      phases=(Phase.explicit, Phase.reuse, Phase.generate))


def test_the_flow_keeps_its_promises_on_the_in_memory_store() -> None:
    run_state_machine_as_test(flow_machine(memory_store), settings=MEMORY_RUN)


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_the_flow_keeps_its_promises_on_the_real_servers(make_store: Callable[..., IdempotencyStore],
                                                        backend: str) -> None:
    store = make_store(backend)

    def server_store() -> Scheduled:
        return Scheduled(store)

    run_state_machine_as_test(flow_machine(server_store, check_every_key=False),
                              settings=SERVER_RUN)


def test_the_machine_catches_a_check_then_act_claim() -> None:
    """Same machine, budget and seed on both stores: the correct one passes; the claim that
    reads and then writes blindly lets two racing copies both hold a key, and is caught."""
    control = flow_machine(memory_store)
    run_state_machine_as_test(control, settings=SEEDED_RUN)
    seeded = flow_machine(check_then_act_store)
    with pytest.raises(AssertionError, match=f"{TWO_EFFECTS}|{NO_ORDER}|live lease"):
        run_state_machine_as_test(seeded, settings=SEEDED_RUN)
    assert seeded.first_failure is not None
    assert seeded.first_failure <= MEMORY_RUN.max_examples
    print(f"check-then-act claim caught in example {seeded.first_failure} of "
          f"{MEMORY_RUN.max_examples} (the correct store passed {control.examples})")
