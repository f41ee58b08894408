"""The runner: each consumer's checks over one run's evidence, then the invariants that
hold across consumers (no double effect, nothing partial, nothing lost, every valid
message effected, every key conflict refused), stated on what the checks tallied."""

from __future__ import annotations

from collections.abc import Callable

from simulator.check import (
    balance_changes,
    host,
    invalid_input,
    notifications,
    order_status,
    orders,
    outbox,
    payments,
)
from simulator.check.evidence import Evidence, gather
from simulator.check.result import CheckResult, Invariant, valid_detail
from simulator.check.stores import Stores
from simulator.workload import Item

Check = Callable[[Evidence, CheckResult], list[Invariant]]

#: Every consumer's (and hop's) checks, in report order: adding a consumer's checks is one
#: module with a `check(evidence, result)` and its entry here.
CHECKS: tuple[Check, ...] = (orders.check, order_status.check, payments.check,
                             notifications.check, outbox.check, balance_changes.check,
                             invalid_input.check, host.check)


def run_checks(evidence: Evidence, *, check_in_progress: bool = True) -> CheckResult:
    """Every check over `evidence` (built by `gather`); in-progress records only when asked
    (after maintenance reconciled)."""
    result = CheckResult()
    for letter in evidence.dead_letters or []:
        result.dead_lettered[f"{letter.consumer}: {letter.reason or '(no reason)'}"] += 1
    for row in evidence.parked:
        result.parked[f"{row.get('consumer')}: {row.get('reason') or '(no reason)'}"] += 1
    own = [invariant for check in CHECKS for invariant in check(evidence, result)]
    if check_in_progress:
        own += host.check_in_progress(evidence, result)
    result.invariants = shared_invariants(result) + own
    return result


def shared_invariants(result: CheckResult) -> list[Invariant]:
    """The invariants every consumer's tallies add up to."""
    doubles = sum(result.double_effects.values())
    lost = sum(result.lost.values())
    partial = sum(result.partial.values())
    unhandled = result.conflicts.get("not dead-lettered or parked", 0)
    not_effected = sum(result.valid_not_effected.values())
    also_refused = sum(result.valid_also_refused.values())
    return [
        Invariant("exactly one effect per message (no double effects)", doubles == 0,
                  f"{doubles} double effects {dict(result.double_effects)}" if doubles else ""),
        Invariant("effects complete (no partial effects)", partial == 0,
                  f"{partial} {dict(result.partial)}" if partial else ""),
        Invariant("nothing lost (effected, dead-lettered or parked with a reason)", lost == 0,
                  f"{lost} lost {dict(result.lost)}" if lost else ""),
        Invariant("every valid message effected (none dead-lettered or parked instead)",
                  not_effected == 0 and also_refused == 0, valid_detail(result)),
        Invariant("every key conflict dead-lettered or parked", unhandled == 0,
                  f"{unhandled} conflicts neither dead-lettered nor parked" if unhandled else ""),
    ]


class Checker:
    """The workload's items, the run's stores and what the harness saw -> the checks' result."""

    def __init__(self, items: list[Item], stores: Stores, *, run_id: str, hub: str,
                 evidence: Evidence | None = None) -> None:
        self.items = items
        self.stores = stores
        self.run_id = run_id
        self.hub = hub
        self.evidence = evidence or Evidence()

    def run(self, *, check_in_progress: bool = True) -> CheckResult:
        evidence = gather(self.items, self.stores, run_id=self.run_id, hub=self.hub,
                          seen=self.evidence)
        return run_checks(evidence, check_in_progress=check_in_progress)
