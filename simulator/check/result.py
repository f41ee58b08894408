"""What the checks found: counts by kind and reason, examples, and the invariants."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

#: The outbox hops, each by the kind of message it carries (the prefix of its tallies' keys).
HOPS = {"orders -> notify/audit": "OrderAccepted", "payments -> balance_projection": "BalanceChanged"}


def _prefixed(counter: Counter[str], kind: str) -> int:
    return sum(n for key, n in counter.items() if key.startswith(kind))


@dataclass
class Invariant:
    """One invariant: PASS or FAIL, with what was found."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class CheckResult:
    """The tallies every check adds to (by kind, by reason) and the invariants stated on them."""

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
    # Committed messages still pending after reconciliation, by message kind (a marker still
    # carrying them; an Event Hubs marker: its event above the partition's mark).
    pending: Counter[str] = field(default_factory=Counter)
    view_mismatches: list[dict[str, Any]] = field(default_factory=list)  # balance views
    views_checked: int = 0
    unverified: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    invariants: list[Invariant] = field(default_factory=list)

    @property
    def outbox_pending(self) -> int:
        """Committed messages still pending after reconciliation, every hop."""
        return sum(self.pending.values())

    def hops(self) -> dict[str, dict[str, int]]:
        """Each outbox hop's figures: double effects, lost, phantoms, pending downstream."""
        return {hop: {"double": _prefixed(self.double_effects, kind),
                      "lost": _prefixed(self.lost, kind),
                      "phantom": _prefixed(self.phantoms, kind),
                      "pending": _prefixed(self.pending, kind),
                      "effected": _prefixed(self.effects, kind)}
                for hop, kind in HOPS.items()}

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
            "pending": dict(self.pending), "hops": self.hops(),
            "viewMismatches": self.view_mismatches[:20], "viewsChecked": self.views_checked,
            "accountsChecked": self.accounts_checked,
            "examples": dict(self.examples),
            "invariants": [{"name": i.name, "ok": i.ok, "detail": i.detail} for i in self.invariants],
        }


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
