"""The rulings every consumer's check shares: a message effected, not effected, or a
key conflict, and whether each copy's refusal was allowed."""

from __future__ import annotations

from collections.abc import Callable

from simulator.check.evidence import CONFLICT, Evidence
from simulator.check.result import CheckResult
from simulator.check.stores import Row
from simulator.workload import Item


class Verdicts:
    """Rules on one run's messages, writing what it finds into `result`."""

    def __init__(self, evidence: Evidence, result: CheckResult) -> None:
        self.evidence = evidence
        self.result = result

    def not_effected(self, kind: str, consumer: str, item: Item, parked: list[Row],
                     what: str) -> None:
        """No effect: handled with a reason (dead-lettered, parked, dropped by the broker),
        not verified (the dead-letter queues were not read), or lost."""
        evidence, result = self.evidence, self.result
        if evidence.dropped(item):
            result.not_effected_but_handled[f"{kind}: dropped by broker duplicate detection"] += 1
            return
        reason = evidence.handled(consumer, item, parked)
        if reason is not None:
            result.not_effected_but_handled[f"{kind}: {reason}"] += 1
            return
        if evidence.dead_letters is None and kind != "payment" and item.expect != "effect":
            # Meant to be dead-lettered, but the dead-letter queues were not read.
            result.unverified[kind] += 1
            result.example("unverified", what)
            return
        result.lost[kind] += 1
        result.example("lost", what + ("" if evidence.dead_letters is not None
                                       else " (dead-letter queues not read)"))

    def valid_not_effected(self, kind: str, consumer: str, variants: list[Item],
                           parked: Callable[[Item], list[Row]], what: str) -> None:
        """A valid logical message with no effect: why (the first refusal, or lost)."""
        evidence = self.evidence
        refusals = [r for v in variants for r in evidence.refusals(consumer, v, parked(v))]
        if refusals and all(evidence.allowed_unknown(r) for r in refusals):
            self.result.outcome_unknown["parked OutcomeUnknown, no effect found"] += 1
            return
        why = next((r for r in refusals if not evidence.allowed_unknown(r)),
                   "no effect, not dead-lettered, not parked")
        self.result.valid_not_effected[f"{kind}: {why}"] += 1
        self.result.example("valid not effected", f"{what} ({why})")

    def valid_effected(self, kind: str, consumer: str, item: Item, parked: list[Row],
                       what: str) -> None:
        """A valid message that was effected: no copy of it may have been refused meanwhile
        (except a copy whose every delivery the harness sabotaged: listed apart)."""
        evidence, result = self.evidence, self.result
        letters = evidence.letters(consumer, item)
        exhausted = [d for d in letters if evidence.exhausted_by_faults(d)]
        if exhausted:
            result.fault_exhausted[f"{kind}: dead-lettered: MaxDeliveryCountExceeded"] += 1
            result.example("effected, a copy dead-lettered after every delivery faulted",
                           f"{what} (copy {exhausted[0].copy}, "
                           f"{exhausted[0].delivery_count} deliveries)")
        refusals = [f"dead-lettered: {d.reason or '(no reason)'}"
                    for d in letters if d not in exhausted]
        # A parking an operator replayed afterwards (python -m replay) is resolved: the effect
        # it was refused is the one counted, once.
        refusals += [f"parked: {row.get('reason') or '(no reason)'}" for row in parked
                     if row.get("resolution") != "replayed"]
        if any(evidence.allowed_unknown(r) for r in refusals):
            result.outcome_unknown["parked OutcomeUnknown, the effect landed"] += 1
        others = [r for r in refusals if not evidence.allowed_unknown(r)]
        if others:
            result.valid_also_refused[f"{kind}: {others[0]}"] += 1
            result.example("valid effected but also refused", f"{what} ({others[0]})")

    def conflict(self, consumer: str, item: Item, parked: list[Row]) -> None:
        """A variant that was not applied: it must have been refused with a reason."""
        evidence, result = self.evidence, self.result
        if evidence.dropped(item):
            # Same MessageId inside the window: Service Bus dropped it silently at send time.
            result.conflicts["dropped by broker duplicate detection (never delivered)"] += 1
            return
        reason = evidence.handled(consumer, item, parked)
        if reason is None and evidence.dead_letters is None and item.kind != "payment":
            result.unverified["conflict"] += 1  # the dead-letter queues were not read
            return
        if reason is None:
            result.conflicts["not dead-lettered or parked"] += 1
            result.example("conflict not handled", f"{consumer} {item.key} variant {item.variant}")
        elif CONFLICT in reason:
            result.conflicts[reason.split(":")[0]] += 1
        else:
            result.conflicts[f"refused for another reason ({reason})"] += 1
