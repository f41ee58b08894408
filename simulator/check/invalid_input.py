"""Invalid input, at every consumer that receives it: rejected with a reason that says
what is wrong with the input (any reason `is_operational` does not flag), once per copy
sent, and no delivery of it before the rejection that raised, abandoned or left it
unsettled (host crashes and lock losses the harness injected excepted)."""

from __future__ import annotations

from collections import Counter

from simulator.check.evidence import CONSUMERS, Evidence, is_operational
from simulator.check.result import CheckResult, Invariant
from simulator.workload import Item


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    for item in evidence.items:
        if not item.invalid:
            continue
        result.invalid[item.kind] += 1
        if evidence.dropped(item):
            continue  # never delivered
        failed = False
        for consumer in CONSUMERS[item.kind]:
            failed = _rejected(evidence, result, consumer, item) or failed
        result.invalid_failed += failed
    not_rejected = sum(result.invalid_not_rejected.values())
    return [Invariant("invalid input rejected with a reason on its first delivery",
                      not_rejected == 0,
                      f"{not_rejected} not rejected {dict(result.invalid_not_rejected)}"
                      if not_rejected else f"{sum(result.rejection_reasons.values())} rejections")]


def _rejected(evidence: Evidence, result: CheckResult, consumer: str, item: Item) -> bool:
    """Rule on one invalid message at one consumer; True when it was not properly rejected."""
    letters = evidence.letters(consumer, item)
    parked = (evidence.parked_of(item) if item.kind == "payment"
              else evidence.parked_entry(consumer, item.key))
    reasons = [letter.reason for letter in letters] + [str(row.get("reason") or "")
                                                       for row in parked]
    if not reasons and evidence.dead_letters is None and item.kind != "payment":
        return False  # the dead-letter queues were not read: listed as unverified
    problem = None
    operational = [r or "(no reason)" for r in reasons if is_operational(r)]
    if not reasons:
        problem = "not rejected"
    elif operational:
        problem = f"refused as {operational[0]}, not as invalid input"
    elif item.kind == "payment" and len(parked) != 1 + len(item.copies):
        problem = f"parked {len(parked)} times for {1 + len(item.copies)} copies sent"
    elif evidence.outcomes is not None and item.kind != "payment":
        seen = evidence.outcomes.get((consumer, item.logical, item.variant), Counter())
        before = sorted(o for o in seen if not o.startswith("deadletter")
                        and o not in ("crash", "lock lost"))
        if before:  # crashes and lost locks are the harness's faults, not the app's
            problem = f"delivered again after: {', '.join(before)}"
    elif any(letter.delivery_count > 1 for letter in letters):
        problem = f"dead-lettered at delivery {max(letter.delivery_count for letter in letters)}"
    for reason in reasons:
        if not is_operational(reason):
            result.rejection_reasons[reason] += 1
    if problem is None:
        return False
    label = f"{item.kind} {item.case or item.expect.split(':', 1)[1]}"
    result.invalid_not_rejected[f"{label}: {problem}"] += 1
    result.example("invalid input not rejected on its first delivery",
                   f"{consumer} {item.key}: {label}: {problem}")
    return True

