"""Invariant checker: reads the stores and says whether every message had exactly one effect.

Effects are counted from what the stores hold (order documents and lines,
ledger markers and account balances, order-status documents, parked
entries) and, in the simulator, from what the fake notification API and the
simulated broker's dead-letter queues saw: never from counters kept by the
code under test.

Invariants:

* exactly one effect per logical message: one order document (with all its
  lines), one ledger marker per payment with every account balance equal to
  the sum of its applied events, one accepted notification per subscription
  (distinct Idempotency-Keys when the API honours them, raw calls when not);
* nothing lost: every message is effected, dead-lettered or parked, with a reason;
* every valid message effected: valid = not invalid input and not a key
  conflict; a valid message that is not effected, or whose copy was
  dead-lettered or parked although it was effected, fails the run whatever the
  reason (MaxDeliveryCountExceeded, StaleInProgress, ProcessingFailed,
  Transient, UnexpectedError, ...). Two exceptions: `OutcomeUnknown`, below,
  and an effected message whose redundant copy the broker dead-lettered after
  every delivery of that copy drew a fault from the harness (listed apart:
  the fault injector, not the app, ran out the delivery count);
* invalid input rejected with a reason on its first delivery: dead-lettered or
  parked with a reason that says what is wrong with the input (any reason that
  `is_operational` does not flag), once per copy sent, and no delivery of it
  before the rejection that raised, abandoned or left it unsettled (host
  crashes and lock losses the harness injected excepted);
* no exception reached the host other than a transient store failure, and no
  Event Hubs batch retried until the host gave up (in production its partition
  would stall: the retry policy is unbounded);
* every key conflict (same id, other content) is dead-lettered or parked;
* no dedup record left in progress (after reconciliation).

`OutcomeUnknown` is the notifications' honest "the call may or may not have
landed" when the API does not honour Idempotency-Key and a timeout hid the
answer: re-sending could notify twice, so a person decides. With such an API
(`Evidence.api_honours_key` false) those parkings are allowed and listed apart
(with whether the API's log shows the call landed); with an API that honours
the key the app can always re-send safely, so an `OutcomeUnknown` counts as
not effected like any other reason.

Also a command for real deployments (Docker emulators or Azure), after the
producer CLI sent a workload:

    python -m simulator.check --sent sent.json     # app settings from the environment
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shared import IdempotencyStore, request_hash, same_request
from shared.stores import CosmosIdempotencyStore, TableIdempotencyStore
from simulator.faults import ApiCall, innermost
from simulator.workload import Item, load_ledger

CONFLICT = "IdempotencyKeyConflict"
CHANNELS = ("notify", "audit")
OUTCOME_UNKNOWN = "OutcomeUnknown"
# The consumers (function names) that receive each kind of message.
CONSUMERS = {"order": ("orders",), "order_status": ("order_status",), "notification": CHANNELS,
             "payment": ("payments",)}

# Dead-letter / parking reasons that say something went wrong in processing (a failure, a
# timeout, a lost race), not what is wrong with the input: never a rejection of bad input.
OPERATIONAL_REASONS = frozenset({
    "MaxDeliveryCountExceeded", "TTLExpiredException", "StaleInProgress", "ProcessingFailed",
    OUTCOME_UNKNOWN, "Transient", "UnexpectedError", "InProgress", "LeaseLost", "StoreRejected",
    "StoreUnavailable"})
_OPERATIONAL_MARKERS = ("Transient", "Unavailable", "Timeout", "TimedOut", "Throttl", "Unexpected",
                        "Stale", "InProgress", "LockLost", "LeaseLost", "MaxDeliveryCount",
                        "Failed", "Exception", "Error")
# Exceptions that may reach the host: a store or API failure worth retrying (the Event Hubs
# function raises them so the retry policy re-runs the batch).
_TRANSIENT_MARKERS = ("Unavailable", "Timeout", "TimedOut", "Throttl", "Transient", "Retry",
                      "Exhausted", "LeaseLost", "NotSent")


def is_operational(reason: str | None) -> bool:
    """True for a reason that is no rejection of the input (empty, or a processing failure)."""
    return not reason or reason in OPERATIONAL_REASONS or any(
        marker in reason for marker in _OPERATIONAL_MARKERS)


def is_transient_error(name: str) -> bool:
    """True for an exception name that a retry can fix (may reach the host)."""
    return any(marker in name for marker in _TRANSIENT_MARKERS)


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered copy, as the (simulated) broker holds it."""

    consumer: str
    logical: str
    variant: int
    reason: str
    description: str = ""
    delivery_count: int = 0  # the delivery that dead-lettered it (0: not known)
    copy: int | None = None  # which producer copy (simulator only)


@dataclass
class Evidence:
    """What the harness saw outside the stores; None where it cannot see (real brokers)."""

    dead_letters: list[DeadLetter] | None = None
    api_calls: list[ApiCall] | None = None
    api_honours_key: bool = True
    # Service Bus messages (logical, variant) of which the broker accepted no copy: its
    # duplicate detection dropped them (same MessageId inside the window), so no consumer saw them.
    broker_dropped: set[tuple[str, int]] = field(default_factory=set)
    # The host's view (simulator only; None with real brokers): delivery outcomes by
    # (function, logical, variant), e.g. "deadletter (MalformedJson)", "crash", "raised X";
    # and Event Hubs batches the host retried until it gave up.
    outcomes: dict[tuple[str, str, int], Counter[str]] | None = None
    stalled_batches: int | None = None
    # Service Bus deliveries per (function, logical, variant, copy): (deliveries, deliveries
    # for which the harness drew a fault). All of them faulted = the broker's max delivery
    # count was run out by the fault injector, not by a decision of the app.
    faulted_deliveries: dict[tuple[str, str, int, int], tuple[int, int]] | None = None
    # What orders published went through the (simulated) broker to notify and audit, so each
    # committed order's OrderAccepted must show in `api_calls` (False: a test's own dispatcher).
    outbox_delivered: bool = False
    outbox_orders: dict[str, str] = field(default_factory=dict)  # message id -> order id


@dataclass
class Stores:
    """The stores to read, by role (the app's wiring; see functions.services)."""

    orders: IdempotencyStore
    order_status: IdempotencyStore
    ledger: IdempotencyStore
    notifications: IdempotencyStore
    parked: IdempotencyStore
    records: dict[str, IdempotencyStore] = field(default_factory=dict)  # for the in-progress check


@dataclass
class Invariant:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class CheckResult:
    logical: Counter[str] = field(default_factory=Counter)  # logical messages by kind
    effects: Counter[str] = field(default_factory=Counter)  # effects found, by kind
    double_effects: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)
    partial: Counter[str] = field(default_factory=Counter)
    balance_mismatches: list[dict[str, Any]] = field(default_factory=list)
    dead_lettered: Counter[str] = field(default_factory=Counter)  # "consumer: reason"
    parked: Counter[str] = field(default_factory=Counter)  # "consumer: reason"
    conflicts: Counter[str] = field(default_factory=Counter)  # handled / not handled
    not_effected_but_handled: Counter[str] = field(default_factory=Counter)  # "kind: reason"
    # Valid messages (not invalid input, not a key conflict): "kind: why" per logical message
    # (per subscription for notifications).
    valid_not_effected: Counter[str] = field(default_factory=Counter)
    valid_also_refused: Counter[str] = field(default_factory=Counter)  # effected, yet a copy refused
    # Effected, and a copy dead-lettered by the broker after every one of its deliveries drew an
    # injected fault (crashes, lost locks, ...): listed, not counted.
    fault_exhausted: Counter[str] = field(default_factory=Counter)
    outcome_unknown: Counter[str] = field(default_factory=Counter)  # allowed: landed / not landed
    # Invalid input: the rejection reasons seen; and "kind: problem" where it was not rejected
    # with a reason on its first delivery.
    invalid: Counter[str] = field(default_factory=Counter)  # invalid messages by kind
    rejection_reasons: Counter[str] = field(default_factory=Counter)
    invalid_not_rejected: Counter[str] = field(default_factory=Counter)
    invalid_failed: int = 0  # invalid messages with a problem at one consumer or more
    host_exceptions: Counter[str] = field(default_factory=Counter)  # "function: Name" per delivery
    stalled_batches: int = 0
    resent_same_key: int = 0
    accounts_checked: int = 0
    in_progress: int = 0
    phantoms: Counter[str] = field(default_factory=Counter)  # published for no committed effect
    outbox_pending: int = 0  # markers still carrying outgoing messages after reconciliation
    unverified: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    invariants: list[Invariant] = field(default_factory=list)

    def example(self, what: str, text: str) -> None:
        if len(self.examples[what]) < 5:
            self.examples[what].append(text)

    @property
    def ok(self) -> bool:
        return all(inv.ok for inv in self.invariants)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "logical": dict(self.logical), "effects": dict(self.effects),
            "doubleEffects": dict(self.double_effects), "lost": dict(self.lost),
            "partialEffects": dict(self.partial), "balanceMismatches": self.balance_mismatches[:20],
            "deadLettered": dict(self.dead_lettered), "parked": dict(self.parked),
            "conflicts": dict(self.conflicts), "resentWithSameKey": self.resent_same_key,
            "validNotEffected": dict(self.valid_not_effected),
            "validAlsoRefused": dict(self.valid_also_refused),
            "faultExhausted": dict(self.fault_exhausted),
            "outcomeUnknownAllowed": dict(self.outcome_unknown),
            "invalidInput": dict(self.invalid), "rejectionReasons": dict(self.rejection_reasons),
            "invalidNotRejected": dict(self.invalid_not_rejected),
            "hostExceptions": dict(self.host_exceptions), "stalledBatches": self.stalled_batches,
            "inProgress": self.in_progress, "unverified": dict(self.unverified),
            "phantoms": dict(self.phantoms), "outboxPending": self.outbox_pending,
            "accountsChecked": self.accounts_checked,
            "examples": dict(self.examples),
            "invariants": [{"name": i.name, "ok": i.ok, "detail": i.detail} for i in self.invariants],
        }


# -- reading stores ----------------------------------------------------------------------
def _successor(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def scan(store: IdempotencyStore, partition_prefix: str | None = None) -> list[dict[str, Any]]:
    """Every entity/document of a store (whose partition starts with a prefix), flattened.

    Each row gets `_id` and `_partition` besides its own properties.
    """
    inner = innermost(store)
    rows = []
    if isinstance(inner, TableIdempotencyStore):
        if partition_prefix:
            entities = inner.client.query_entities(
                "PartitionKey ge @lo and PartitionKey lt @hi",
                parameters={"lo": partition_prefix, "hi": _successor(partition_prefix)})
        else:
            entities = inner.client.list_entities()
        for entity in entities:
            rows.append({**dict(entity), "_id": entity["RowKey"], "_partition": entity["PartitionKey"]})
        return rows
    if isinstance(inner, CosmosIdempotencyStore):
        container = inner.container
        field_name = container.read()["partitionKey"]["paths"][0].lstrip("/")
        if partition_prefix:
            items = container.query_items(
                f"SELECT * FROM c WHERE STARTSWITH(c.{field_name}, @p)",  # noqa: S608 - path from metadata
                parameters=[{"name": "@p", "value": partition_prefix}],
                enable_cross_partition_query=True)
        else:
            items = container.query_items("SELECT * FROM c", enable_cross_partition_query=True)
        for item in items:
            rows.append({**item, "_id": item["id"], "_partition": item.get(field_name)})
        return rows
    raise TypeError(f"cannot scan a {type(inner).__name__}")


def _identity(store: IdempotencyStore) -> str:
    inner = innermost(store)
    if isinstance(inner, TableIdempotencyStore):
        return f"table:{inner.client.url}:{inner.client.table_name}"
    if isinstance(inner, CosmosIdempotencyStore):
        return f"cosmos:{inner.container.container_link}"
    return f"{type(inner).__name__}:{id(inner)}"


def _is_record(row: dict[str, Any]) -> bool:
    return "idemState" in row and "idemKey" in row


# -- the checks ---------------------------------------------------------------------------
def _group(items: Iterable[Item], kind: str) -> dict[str, list[Item]]:
    groups: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        if item.kind == kind:
            groups[item.key].append(item)
    return groups


def _order_total(body: dict[str, Any]) -> float:
    return round(sum(line["quantity"] * line["unitPrice"] for line in body["lines"]), 2)


class Checker:
    def __init__(self, items: list[Item], stores: Stores, *, run_id: str, hub: str,
                 evidence: Evidence | None = None) -> None:
        self.items = items
        self.stores = stores
        self.run_id = run_id
        self.hub = hub
        self.evidence = evidence or Evidence()
        self.result = CheckResult()
        self._dead: dict[tuple[str, str, int], list[DeadLetter]] = defaultdict(list)
        for letter in self.evidence.dead_letters or []:
            self._dead[(letter.consumer, letter.logical, letter.variant)].append(letter)
            self.result.dead_lettered[f"{letter.consumer}: {letter.reason or '(no reason)'}"] += 1
        self._parked_rows = [row for row in scan(stores.parked)
                             if run_id in str(row.get("entryId", "")) + str(row.get("payload", ""))]
        self._parked_by_sha: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._parked_by_entry: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for row in self._parked_rows:
            self.result.parked[f"{row.get('consumer')}: {row.get('reason') or '(no reason)'}"] += 1
            self._parked_by_sha[str(row.get("payloadSha256"))].append(row)
            self._parked_by_entry[(str(row.get("consumer")), str(row.get("entryId")))].append(row)

    # -- evidence helpers -------------------------------------------------------------------
    def _dead_letters(self, consumer: str, item: Item) -> list[DeadLetter]:
        return self._dead.get((consumer, item.logical, item.variant), [])

    def _parked_of(self, item: Item) -> list[dict[str, Any]]:
        """Parked entries of a payment event (any copy): matched by the body's hash."""
        return self._parked_by_sha.get(item.body_sha256, [])

    def _handled(self, consumer: str, item: Item, parked: list[dict[str, Any]]) -> str | None:
        """The reason a not-effected message was handled with (dead-letter or parking), or None."""
        for letter in self._dead_letters(consumer, item):
            if letter.reason:
                return f"dead-lettered: {letter.reason}"
        for row in parked:
            if row.get("reason"):
                return f"parked: {row['reason']}"
        for row in self._journal_of(consumer, item):  # dead-lettered, then discarded or replayed
            if row.get("reason"):
                return f"dead-lettered: {row['reason']}"
        return None

    def _journal_of(self, consumer: str, item: Item) -> list[dict[str, Any]]:
        """The replay tool's journal of a dead-lettered copy it completed (replayed or
        discarded): `deadletter/<entity>/<sequence>` entries in the parked table, by body."""
        return [row for row in self._parked_by_sha.get(item.body_sha256, [])
                if str(row.get("entryId", "")).startswith("deadletter/")
                and str(row.get("consumer")) in (consumer, item.entity.split("/")[-1])]

    def _not_effected(self, kind: str, consumer: str, item: Item, parked: list[dict[str, Any]],
                      what: str) -> None:
        if (item.logical, item.variant) in self.evidence.broker_dropped:
            self.result.not_effected_but_handled[f"{kind}: dropped by broker duplicate detection"] += 1
            return
        reason = self._handled(consumer, item, parked)
        if reason is not None:
            self.result.not_effected_but_handled[f"{kind}: {reason}"] += 1
            return
        if self.evidence.dead_letters is None and kind != "payment" and item.expect != "effect":
            # Meant to be dead-lettered, but the dead-letter queues were not read.
            self.result.unverified[kind] += 1
            self.result.example("unverified", what)
            return
        self.result.lost[kind] += 1
        self.result.example("lost", what + ("" if self.evidence.dead_letters is not None
                                            else " (dead-letter queues not read)"))

    def _refusals(self, consumer: str, item: Item, parked: list[dict[str, Any]]) -> list[str]:
        """Every reason a copy of `item` was dead-lettered or parked with at `consumer`."""
        return ([f"dead-lettered: {letter.reason or '(no reason)'}"
                 for letter in self._dead_letters(consumer, item)]
                + [f"parked: {row.get('reason') or '(no reason)'}" for row in parked])

    def _allowed_unknown(self, refusal: str) -> bool:
        """An OutcomeUnknown parking, allowed only when the API ignores Idempotency-Key."""
        return refusal.endswith(f": {OUTCOME_UNKNOWN}") and not self.evidence.api_honours_key

    def _valid_not_effected(self, kind: str, consumer: str, variants: list[Item],
                            parked: Callable[[Item], list[dict[str, Any]]], what: str) -> None:
        """A valid logical message with no effect: why (the first refusal, or lost)."""
        refusals = [r for v in variants for r in self._refusals(consumer, v, parked(v))]
        if refusals and all(self._allowed_unknown(r) for r in refusals):
            self.result.outcome_unknown["parked OutcomeUnknown, no effect found"] += 1
            return
        why = next((r for r in refusals if not self._allowed_unknown(r)),
                   "no effect, not dead-lettered, not parked")
        self.result.valid_not_effected[f"{kind}: {why}"] += 1
        self.result.example("valid not effected", f"{what} ({why})")

    def _exhausted_by_faults(self, letter: DeadLetter) -> bool:
        """A copy the broker dead-lettered after every delivery of it drew an injected fault."""
        faulted = self.evidence.faulted_deliveries
        if faulted is None or letter.copy is None or letter.reason != "MaxDeliveryCountExceeded":
            return False
        deliveries, with_fault = faulted.get((letter.consumer, letter.logical, letter.variant,
                                              letter.copy), (0, 0))
        return deliveries > 0 and with_fault == deliveries

    def _valid_effected(self, kind: str, consumer: str, item: Item, parked: list[dict[str, Any]],
                        what: str) -> None:
        """A valid message that was effected: no copy of it may have been refused meanwhile
        (except a copy whose every delivery the harness sabotaged: listed apart)."""
        exhausted = [d for d in self._dead_letters(consumer, item) if self._exhausted_by_faults(d)]
        if exhausted:
            self.result.fault_exhausted[f"{kind}: dead-lettered: MaxDeliveryCountExceeded"] += 1
            self.result.example("effected, a copy dead-lettered after every delivery faulted",
                                f"{what} (copy {exhausted[0].copy}, "
                                f"{exhausted[0].delivery_count} deliveries)")
        refusals = [f"dead-lettered: {d.reason or '(no reason)'}"
                    for d in self._dead_letters(consumer, item) if d not in exhausted]
        # A parking an operator replayed afterwards (python -m replay) is resolved: the effect
        # it was refused is the one counted, once.
        refusals += [f"parked: {row.get('reason') or '(no reason)'}" for row in parked
                     if row.get("resolution") != "replayed"]
        if any(self._allowed_unknown(r) for r in refusals):
            self.result.outcome_unknown["parked OutcomeUnknown, the effect landed"] += 1
        others = [r for r in refusals if not self._allowed_unknown(r)]
        if others:
            self.result.valid_also_refused[f"{kind}: {others[0]}"] += 1
            self.result.example("valid effected but also refused", f"{what} ({others[0]})")

    def _conflict(self, consumer: str, item: Item, parked: list[dict[str, Any]]) -> None:
        """A variant that was not applied: it must have been refused with a reason."""
        if (item.logical, item.variant) in self.evidence.broker_dropped:
            # Same MessageId inside the window: Service Bus dropped it silently at send time.
            self.result.conflicts["dropped by broker duplicate detection (never delivered)"] += 1
            return
        reason = self._handled(consumer, item, parked)
        if reason is None and self.evidence.dead_letters is None and item.kind != "payment":
            self.result.unverified["conflict"] += 1  # the dead-letter queues were not read
            return
        if reason is None:
            self.result.conflicts["not dead-lettered or parked"] += 1
            self.result.example("conflict not handled", f"{consumer} {item.key} variant {item.variant}")
        elif CONFLICT in reason:
            self.result.conflicts[reason.split(":")[0]] += 1
        else:
            self.result.conflicts[f"refused for another reason ({reason})"] += 1

    # -- orders --------------------------------------------------------------------------------
    def check_orders(self) -> None:
        rows = scan(self.stores.orders, self.run_id)
        orders: dict[str, list[dict[str, Any]]] = defaultdict(list)
        lines: Counter[str] = Counter()
        for row in rows:
            if row.get("kind") == "order":
                orders[str(row.get("idemKey") or row.get("orderId"))].append(row)
            elif row.get("kind") == "line":
                lines[str(row.get("orderId"))] += 1
        for key, variants in _group(self.items, "order").items():
            self.result.logical["order"] += 1
            stored = orders.get(key, [])
            valid = [v for v in variants if not v.expect.startswith("deadletter:")]
            if not valid:  # malformed input: must not be effected, must be dead-lettered
                if stored:
                    self.result.double_effects["order (invalid input effected)"] += 1
                for variant in variants:
                    self._not_effected("order", "orders", variant, [], f"order {key}")
                continue
            if len(stored) > 1:
                self.result.double_effects["order"] += len(stored) - 1
                self.result.example("double effect", f"order {key}: {len(stored)} order documents")
            if not stored:
                if lines[key]:  # lines written without their order document
                    self.result.partial["order lines without their order"] += 1
                    self.result.example("partial", f"order {key}: {lines[key]} lines, no order")
                for variant in valid:
                    self._not_effected("order", "orders", variant, [], f"order {key}")
                self._valid_not_effected("order", "orders", valid, lambda _: [], f"order {key}")
                continue
            self.result.effects["order"] += 1
            document = stored[0]
            applied = None
            for variant in valid:
                body = variant.json_body()
                if (abs(float(document.get("total", -1)) - _order_total(body)) < 0.005
                        and int(document.get("lineCount", -1)) == len(body["lines"])):
                    applied = variant
            expected_lines = int(document.get("lineCount", 0)) * len(stored)
            order_id = str(document.get("orderId"))
            if lines[order_id] < expected_lines:
                self.result.partial["order lines missing"] += 1
                self.result.example("partial", f"order {key}: {lines[order_id]}/{expected_lines} lines")
            elif lines[order_id] > expected_lines:
                self.result.double_effects["order line"] += lines[order_id] - expected_lines
            if applied is None:
                self.result.partial["order content matches no message sent"] += 1
            else:
                self._valid_effected("order", "orders", applied, [], f"order {key}")
            for variant in valid:
                if variant is not applied:
                    self._conflict("orders", variant, [])

    # -- order status ------------------------------------------------------------------------
    def check_order_status(self) -> None:
        rows = scan(self.stores.order_status, self.run_id)
        stored = {str(row.get("orderId")): row for row in rows}
        by_order: dict[str, list[Item]] = defaultdict(list)
        for item in self.items:
            if item.kind != "order_status":
                continue
            if item.invalid:  # hostile input: its own order id, which must stay unwritten
                self.result.logical["order_status"] += 1
                if item.key in stored:
                    self.result.double_effects["order status (invalid input effected)"] += 1
                    self.result.example("double effect", f"status {item.key}: invalid input applied")
                self._not_effected("order_status", "order_status", item, [], f"status {item.key}")
                continue
            by_order[item.json_body()["orderId"]].append(item)
        for order_id, events in by_order.items():
            self.result.logical["order_status"] += len(events)
            version = int(stored[order_id]["version"]) if order_id in stored else 0
            for event in events:
                what = f"status {event.key}: stored version {version}"
                if version >= event.json_body()["version"]:
                    self.result.effects["order_status"] += 1
                    self._valid_effected("order_status", "order_status", event, [], what)
                else:
                    self._not_effected("order_status", "order_status", event, [], what)
                    self._valid_not_effected("order_status", "order_status", [event],
                                             lambda _: [], what)

    # -- payments -----------------------------------------------------------------------------
    def check_payments(self) -> None:
        rows = scan(self.stores.ledger, self.run_id)
        markers: dict[str, list[dict[str, Any]]] = defaultdict(list)
        balances: dict[str, int] = {}
        for row in rows:
            if _is_record(row) and row.get("idemConsumer") == "payments":
                markers[str(row["idemKey"])].append(row)
            elif row.get("kind") == "account":
                balances[str(row.get("accountId"))] = int(row.get("balanceCents", 0))
        expected: Counter[str] = Counter()
        for key, variants in _group(self.items, "payment").items():
            self.result.logical["payment"] += 1
            found = markers.get(key, [])
            valid = [v for v in variants if not v.expect.startswith("park:")]
            if not valid:
                if found:
                    self.result.double_effects["payment (invalid event applied)"] += 1
                for variant in variants:
                    self._not_effected("payment", "payments", variant,
                                       self._parked_by_sha.get(variant.body_sha256, []),
                                       f"payment {key}")
                continue
            if len(found) > 1:
                self.result.double_effects["payment"] += len(found) - 1
                self.result.example("double effect", f"payment {key}: {len(found)} ledger markers")
            if not found:
                for variant in valid:
                    self._not_effected("payment", "payments", variant,
                                       self._parked_by_sha.get(variant.body_sha256, []),
                                       f"payment {key}")
                self._valid_not_effected("payment", "payments", valid, self._parked_of,
                                         f"payment {key}")
                continue
            self.result.effects["payment"] += 1
            applied = None
            for variant in valid:
                content = _payment_content(variant)
                if content is not None and same_request(found[0].get("idemRequestHash"),
                                                         request_hash(content)):
                    applied = variant
            if applied is None:
                self.result.partial["payment content matches no event sent"] += 1
                continue
            self._valid_effected("payment", "payments", applied, self._parked_of(applied),
                                 f"payment {key}")
            content = _payment_content(applied)
            assert content is not None
            sign = 1 if content["type"] == "payment.credit" else -1
            expected[content["accountId"]] += sign * content["amountCents"] * len(found)
            for variant in valid:
                if variant is not applied:
                    self._conflict("payments", variant, self._parked_by_sha.get(variant.body_sha256, []))
        for account in sorted(set(expected) | set(balances)):
            if balances.get(account, 0) != expected.get(account, 0):
                self.result.balance_mismatches.append(
                    {"account": account, "balanceCents": balances.get(account, 0),
                     "sumOfAppliedEventsCents": expected.get(account, 0)})
        self.result.accounts_checked = len(set(expected) | set(balances))

    # -- notifications -------------------------------------------------------------------------
    def check_notifications(self) -> None:
        notifications = _group(self.items, "notification")
        calls = self.evidence.api_calls
        if calls is None:
            self._notifications_from_records(notifications)
            return
        per: dict[tuple[str, str], list[ApiCall]] = defaultdict(list)
        for call in calls:
            per[(call.channel, call.notification_id)].append(call)
        for key, variants in notifications.items():
            item = variants[0]
            if item.invalid:  # hostile input: no call may carry its id
                self._invalid_notification(key, item, sum(len(per.get((c, key), []))
                                                          for c in CHANNELS))
                continue
            for channel in CHANNELS:
                self.result.logical[f"notification ({channel})"] += 1
                seen = per.get((channel, key), [])
                keys = {c.key for c in seen}
                effects = sum(1 for c in seen if c.new_effect)
                self.result.resent_same_key += len(seen) - len(keys)
                if effects > 1:
                    self.result.double_effects[f"notification ({channel})"] += effects - 1
                    self.result.example("double effect",
                                        f"{channel} {key}: {effects} notifications accepted "
                                        f"({len(keys)} distinct keys, {len(seen)} calls)")
                parked = self._parked_by_entry.get((channel, key), [])
                if effects >= 1:
                    self.result.effects[f"notification ({channel})"] += 1
                    self._valid_effected("notification", channel, item, parked, f"{channel} {key}")
                else:
                    self._not_effected("notification", channel, item, parked, f"{channel} {key}")
                    self._valid_not_effected("notification", channel, [item],
                                             lambda _, p=parked: p, f"{channel} {key}")

    def _notifications_from_records(self, notifications: dict[str, list[Item]]) -> None:
        """Without the API's log (a real deployment): the dedup records say what was sent."""
        records: dict[str, dict[str, dict[str, Any]]] = {}
        for channel in CHANNELS:
            rows = scan(self.stores.notifications, f"{channel}|{self.run_id}")
            records[channel] = {str(r["idemKey"]): r for r in rows if _is_record(r)}
        for key, variants in notifications.items():
            item = variants[0]
            if item.invalid:
                self._invalid_notification(key, item, sum(key in records[c] for c in CHANNELS))
                continue
            for channel in CHANNELS:
                self.result.logical[f"notification ({channel})"] += 1
                record = records[channel].get(key)
                parked = self._parked_by_entry.get((channel, key), [])
                what = f"{channel} {key}"
                if (record is not None and record.get("idemState") == "completed"
                        and not (isinstance(record.get("idemResult"), str)
                                 and "parked" in record["idemResult"])):
                    self.result.effects[f"notification ({channel}, recorded)"] += 1
                    self._valid_effected("notification", channel, item, parked, what)
                else:
                    self._not_effected("notification", channel, item, parked, what)
                    self._valid_not_effected("notification", channel, [item],
                                             lambda _, p=parked: p, what)

    def _invalid_notification(self, key: str, item: Item, effects: int) -> None:
        """Hostile input on the topic: never sent; rejected on each subscription."""
        self.result.logical["notification (invalid input)"] += 1
        if effects:
            self.result.double_effects["notification (invalid input effected)"] += 1
            self.result.example("double effect", f"notification {key}: invalid input sent")
        for channel in CHANNELS:
            self._not_effected("notification", channel, item,
                               self._parked_by_entry.get((channel, key), []), f"{channel} {key}")

    # -- invalid input -------------------------------------------------------------------------
    def check_invalid_input(self) -> None:
        """Each invalid message: rejected with a reason on its first delivery, once per copy."""
        outcomes = self.evidence.outcomes
        for item in self.items:
            if not item.invalid:
                continue
            self.result.invalid[item.kind] += 1
            label = f"{item.kind} {item.case or item.expect.split(':', 1)[1]}"
            if (item.logical, item.variant) in self.evidence.broker_dropped:
                continue  # never delivered
            failed = False
            for consumer in CONSUMERS[item.kind]:
                letters = self._dead_letters(consumer, item)
                parked = (self._parked_of(item) if item.kind == "payment"
                          else self._parked_by_entry.get((consumer, item.key), []))
                reasons = [letter.reason for letter in letters] + [str(row.get("reason") or "")
                                                                   for row in parked]
                if not reasons and self.evidence.dead_letters is None and item.kind != "payment":
                    continue  # the dead-letter queues were not read: listed as unverified
                problem = None
                operational = [r or "(no reason)" for r in reasons if is_operational(r)]
                if not reasons:
                    problem = "not rejected"
                elif operational:
                    problem = f"refused as {operational[0]}, not as invalid input"
                elif item.kind == "payment" and len(parked) != 1 + len(item.copies):
                    problem = f"parked {len(parked)} times for {1 + len(item.copies)} copies sent"
                elif outcomes is not None and item.kind != "payment":
                    seen = outcomes.get((consumer, item.logical, item.variant), Counter())
                    before = sorted(o for o in seen if not o.startswith("deadletter")
                                    and o not in ("crash", "lock lost"))
                    if before:  # crashes and lost locks are the harness's faults, not the app's
                        problem = f"delivered again after: {', '.join(before)}"
                elif any(letter.delivery_count > 1 for letter in letters):
                    problem = ("dead-lettered at delivery "
                               f"{max(letter.delivery_count for letter in letters)}")
                for reason in reasons:
                    if not is_operational(reason):
                        self.result.rejection_reasons[reason] += 1
                if problem is not None:
                    failed = True
                    self.result.invalid_not_rejected[f"{label}: {problem}"] += 1
                    self.result.example("invalid input not rejected on its first delivery",
                                        f"{consumer} {item.key}: {label}: {problem}")
            self.result.invalid_failed += failed

    def check_host(self) -> None:
        """Exceptions that reached the host, and batches retried until the host gave up."""
        for (function, _, _), seen in (self.evidence.outcomes or {}).items():
            for outcome, n in seen.items():
                if outcome.startswith("raised "):
                    self.result.host_exceptions[f"{function}: {outcome[7:]}"] += n
        self.result.stalled_batches = self.evidence.stalled_batches or 0

    # -- records ----------------------------------------------------------------------------------
    # -- the outbox: what orders published, delivered downstream ------------------------------
    def check_outbox(self) -> None:
        """Every committed order's OrderAccepted effected once per subscription with the
        committed content; none for an order that did not commit (a phantom); and no order
        still carrying pending messages after reconciliation."""
        calls = self.evidence.api_calls
        committed: dict[str, str] = {}
        for row in scan(self.stores.orders, self.run_id):
            if row.get("kind") != "order":
                continue
            order_id = str(row.get("orderId"))
            committed[order_id] = json.dumps([round(float(row.get("total") or 0), 2),
                                              row.get("lineCount")])
            if int(row.get("outboxChunks") or 0) > 0:
                self.result.outbox_pending += 1
                self.result.example("pending", f"order {order_id} still carries its messages")
        if calls is None or not self.evidence.outbox_delivered:
            return
        per: dict[tuple[str, str], list[ApiCall]] = defaultdict(list)
        for call in calls:
            if call.notification_id.startswith("OrderAccepted:"):
                per[(call.channel, call.notification_id.split(":", 1)[1])].append(call)
        for (channel, order_id), seen in per.items():
            wrong = [c for c in seen if c.new_effect and committed.get(order_id) != c.content]
            if wrong:
                self.result.phantoms[f"OrderAccepted ({channel})"] += len(wrong)
                why = "no committed order" if order_id not in committed else "other content"
                self.result.example("phantom", f"{channel} OrderAccepted {order_id}: {why}")
        refused: dict[tuple[str, str], list[DeadLetter]] = defaultdict(list)
        for letter in self.evidence.dead_letters or []:
            if letter.logical.startswith("outbox:"):
                order = self.evidence.outbox_orders.get(letter.logical.split(":", 1)[1])
                if order is not None:
                    refused[(letter.consumer, order)].append(letter)
        for order_id, content in committed.items():
            for channel in CHANNELS:
                self.result.logical[f"OrderAccepted ({channel})"] += 1
                effects = sum(1 for c in per.get((channel, order_id), [])
                              if c.new_effect and c.content == content)
                if effects == 0:
                    letters = refused.get((channel, order_id))
                    if letters:  # refused with a reason: not lost, but a valid message not effected
                        reason = letters[0].reason
                        self.result.valid_not_effected[f"OrderAccepted: dead-lettered {reason}"] += 1
                        self.result.example("valid not effected",
                                            f"{channel} OrderAccepted {order_id} ({reason})")
                        continue
                    self.result.lost[f"OrderAccepted ({channel})"] += 1
                    self.result.example("lost", f"{channel} OrderAccepted {order_id}: never effected")
                elif effects > 1:
                    self.result.double_effects[f"OrderAccepted ({channel})"] += effects - 1
                    self.result.example("double effect",
                                        f"{channel} OrderAccepted {order_id}: {effects} notifications")
                else:
                    self.result.effects[f"OrderAccepted ({channel})"] += 1

    def check_in_progress(self) -> None:
        scanned: set[str] = set()
        for name, store in self.stores.records.items():
            identity = _identity(store)
            if identity in scanned:  # e.g. dedup and notifications share one table
                continue
            scanned.add(identity)
            for row in scan(store):
                if (_is_record(row) and row.get("idemState") == "in_progress"
                        and self.run_id in str(row.get("idemKey"))):
                    self.result.in_progress += 1
                    self.result.example("in progress", f"{name}: {row['idemConsumer']} {row['idemKey']}")

    def run(self, *, check_in_progress: bool = True) -> CheckResult:
        self.check_orders()
        self.check_order_status()
        self.check_payments()
        self.check_notifications()
        self.check_outbox()
        self.check_invalid_input()
        self.check_host()
        if check_in_progress:
            self.check_in_progress()
        result = self.result
        doubles = sum(result.double_effects.values())
        lost = sum(result.lost.values())
        partial = sum(result.partial.values())
        unhandled = result.conflicts.get("not dead-lettered or parked", 0)
        not_effected = sum(result.valid_not_effected.values())
        also_refused = sum(result.valid_also_refused.values())
        not_rejected = sum(result.invalid_not_rejected.values())
        escaped = {k: n for k, n in result.host_exceptions.items()
                   if not is_transient_error(k.split(": ", 1)[1])}
        result.invariants = [
            Invariant("exactly one effect per message (no double effects)", doubles == 0,
                      f"{doubles} double effects {dict(result.double_effects)}" if doubles else ""),
            Invariant("each account balance == sum of its applied events",
                      not result.balance_mismatches,
                      f"{len(result.balance_mismatches)} of {result.accounts_checked} accounts differ"
                      if result.balance_mismatches else f"{result.accounts_checked} accounts"),
            Invariant("effects complete (no partial effects)", partial == 0,
                      f"{partial} {dict(result.partial)}" if partial else ""),
            Invariant("nothing lost (effected, dead-lettered or parked with a reason)", lost == 0,
                      f"{lost} lost {dict(result.lost)}" if lost else ""),
            Invariant("every valid message effected (none dead-lettered or parked instead)",
                      not_effected == 0 and also_refused == 0, valid_detail(result)),
            Invariant("invalid input rejected with a reason on its first delivery",
                      not_rejected == 0,
                      f"{not_rejected} not rejected {dict(result.invalid_not_rejected)}"
                      if not_rejected else f"{sum(result.rejection_reasons.values())} rejections"),
            Invariant("every key conflict dead-lettered or parked", unhandled == 0,
                      f"{unhandled} conflicts neither dead-lettered nor parked" if unhandled else ""),
            Invariant("no message published for an effect that did not commit (no phantoms)",
                      not result.phantoms,
                      f"{sum(result.phantoms.values())} phantoms {dict(result.phantoms)}"
                      if result.phantoms else ""),
            Invariant("no outgoing message left pending after reconciliation",
                      result.outbox_pending == 0,
                      f"{result.outbox_pending} orders still pending" if result.outbox_pending else ""),
        ]
        if self.evidence.outcomes is not None:
            result.invariants.append(Invariant(
                "no exception reached the host but transient failures; no partition stalled",
                not escaped and result.stalled_batches == 0,
                "; ".join(part for part in (
                    f"exceptions {escaped}" if escaped else "",
                    f"{result.stalled_batches} batches retried until the host gave up"
                    if result.stalled_batches else "") if part)))
        if check_in_progress:
            result.invariants.append(Invariant(
                "no record left in progress after reconciliation", result.in_progress == 0,
                f"{result.in_progress} records in progress" if result.in_progress else ""))
        return result


def valid_line(result: CheckResult, *, api_honours_key: bool = True) -> str:
    """The report line: valid messages not effected, and how OutcomeUnknown was counted."""
    not_effected = sum(result.valid_not_effected.values())
    also = sum(result.valid_also_refused.values())
    unknown = sum(result.outcome_unknown.values())
    line = f"valid messages not effected: {not_effected}"
    if also:
        line += f"; effected but also dead-lettered/parked: {also}"
    exhausted = sum(result.fault_exhausted.values())
    if exhausted:
        line += (f"; not counted: {exhausted} effected whose redundant copy the broker "
                 "dead-lettered after every delivery of it drew an injected fault")
    if api_honours_key:
        line += " (OutcomeUnknown counted as not effected: the API honours Idempotency-Key)"
    else:
        line += (f" (not counted: {unknown} OutcomeUnknown parkings, effect unknown and routed to a "
                 "person because the API ignores Idempotency-Key"
                 + (f": {dict(result.outcome_unknown)}" if unknown else "") + ")")
    return line


def valid_detail(result: CheckResult) -> str:
    parts = []
    if result.valid_not_effected:
        parts.append(f"{sum(result.valid_not_effected.values())} not effected "
                     f"{dict(result.valid_not_effected)}")
    if result.valid_also_refused:
        parts.append(f"{sum(result.valid_also_refused.values())} effected but also refused "
                     f"{dict(result.valid_also_refused)}")
    return "; ".join(parts)


def _payment_content(item: Item) -> dict[str, Any] | None:
    """What the app hashes for a payment (type, account, amount), from what was sent."""
    body = item.json_body()
    if not isinstance(body, dict):
        return None
    if item.properties.get("ce_type"):
        event_type, data = item.properties["ce_type"], body
    else:
        event_type, data = body.get("type"), body.get("data")
    if not isinstance(data, dict):
        return None
    return {"type": event_type, "accountId": data.get("accountId"),
            "amountCents": data.get("amountCents")}


# -- command line (real deployments) -------------------------------------------------------
def stores_from_settings(env: dict[str, str] | None = None) -> tuple[Stores, str]:
    """The app's stores, built from its settings exactly as the app builds them."""
    from functions.services import build_services
    from functions.settings import Settings

    settings = Settings.from_env(env if env is not None else dict(os.environ))
    services = build_services(settings)
    return stores_of(services.stores), settings.payments_hub


def stores_of(stores: dict[str, IdempotencyStore]) -> Stores:
    """Roles of the app's stores (names as in `functions.settings.STORE_ROLES`)."""
    records = {name: stores[name] for name in ("dedup", "ledger", "notifications", "orders")}
    return Stores(orders=stores["orders"], order_status=stores["order-status"],
                  ledger=stores["ledger"], notifications=stores["notifications"],
                  parked=stores["parked"], records=records)


SERVICE_BUS_CONSUMERS = (("orders", None, "orders"), ("order-status", None, "order_status"),
                         ("notifications", "notify", "notify"), ("notifications", "audit", "audit"))


def read_dead_letters(client: Any, items: list[Item], *,
                      entities: Iterable[tuple[str, str | None, str]] = SERVICE_BUS_CONSUMERS,
                      max_messages: int = 100_000) -> list[DeadLetter]:
    """Peek every dead-letter queue (nothing is removed) and match its messages to the ledger.

    `entities` are (queue or topic, subscription or None, consumer function name).
    """
    from azure.servicebus import ServiceBusSubQueue

    by_body: dict[tuple[str | None, bytes], Item] = {
        (item.message_id, item.body_bytes): item for item in items if item.kind != "payment"}
    letters = []
    for entity, subscription, consumer in entities:
        if subscription is None:
            receiver = client.get_queue_receiver(entity, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        else:
            receiver = client.get_subscription_receiver(entity, subscription,
                                                        sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        with receiver:
            sequence, seen = 0, 0
            while seen < max_messages:
                batch = receiver.peek_messages(max_message_count=250, sequence_number=sequence)
                if not batch:
                    break
                for message in batch:
                    seen += 1
                    sequence = max(sequence, int(message.sequence_number) + 1)
                    body = b"".join(bytes(part) for part in message.body)
                    message_id = None if message.message_id is None else str(message.message_id)
                    item = by_body.get((message_id, body))
                    if item is not None:
                        letters.append(DeadLetter(consumer, item.logical, item.variant,
                                                  str(message.dead_letter_reason or ""),
                                                  str(message.dead_letter_error_description or ""),
                                                  int(getattr(message, "delivery_count", 0) or 0)))
    return letters


def format_result(result: CheckResult, *, api_honours_key: bool = True) -> str:
    lines = ["Invariants (read from the stores):"]
    for inv in result.invariants:
        lines.append(f"  [{'PASS' if inv.ok else 'FAIL'}] {inv.name}"
                     + (f": {inv.detail}" if inv.detail else ""))
    lines.append(f"  logical messages: {dict(result.logical)}")
    lines.append(f"  effects found:    {dict(result.effects)}")
    lines.append("  " + valid_line(result, api_honours_key=api_honours_key))
    lines.append(f"  invalid input rejected, by reason: {dict(result.rejection_reasons)}")
    if result.unverified:
        lines.append("  meant to be dead-lettered, not verified (pass --servicebus-connection to "
                     f"read the dead-letter queues): {dict(result.unverified)}")
    for what, examples in result.examples.items():
        lines.append(f"  e.g. {what}: " + "; ".join(examples))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.check",
        description="Read the app's stores and check the invariants for a workload the producer "
                    "CLI sent (app settings such as DEDUP_BACKEND, COSMOS_ENDPOINT, "
                    "TABLE_CONNECTION_STRING come from the environment).")
    parser.add_argument("--sent", required=True, help="the ledger written by `python -m producer`")
    parser.add_argument("--json", help="also write the result as JSON to this file")
    parser.add_argument("--in-progress", action="store_true",
                        help="fail on records still in progress (run after maintenance reconciled)")
    parser.add_argument("--servicebus-connection",
                        default=os.environ.get("SERVICEBUS_CONNECTION_STRING"),
                        help="read (peek) the dead-letter queues with this connection string")
    parser.add_argument("--servicebus-namespace",
                        help="read the dead-letter queues of this namespace (DefaultAzureCredential)")
    args = parser.parse_args(argv)
    with open(args.sent, encoding="utf-8") as handle:
        meta, items = load_ledger(json.load(handle))
    stores, hub = stores_from_settings()
    evidence = Evidence(api_honours_key=os.environ.get(
        "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY", "true").strip().lower() not in ("false", "0", "no"))
    if args.servicebus_connection or args.servicebus_namespace:
        from azure.servicebus import ServiceBusClient

        if args.servicebus_connection:
            client = ServiceBusClient.from_connection_string(args.servicebus_connection)
        else:
            from azure.identity import DefaultAzureCredential

            client = ServiceBusClient(args.servicebus_namespace, DefaultAzureCredential())
        names = meta.get("entities", {})
        entities = ((names.get("ordersQueue", "orders"), None, "orders"),
                    (names.get("statusQueue", "order-status"), None, "order_status"),
                    (names.get("topic", "notifications"), "notify", "notify"),
                    (names.get("topic", "notifications"), "audit", "audit"))
        with client:
            evidence.dead_letters = read_dead_letters(client, items, entities=entities)
    result = Checker(items, stores, run_id=meta["runId"], hub=meta.get("hub", hub),
                     evidence=evidence).run(check_in_progress=args.in_progress)
    print(format_result(result, api_honours_key=evidence.api_honours_key))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result.to_json(), handle, indent=2)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
