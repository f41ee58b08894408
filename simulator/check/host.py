"""The host and the records: no exception reached the host but a transient store failure,
no Event Hubs batch retried until the host gave up (in production its partition would
stall: the retry policy is unbounded), and no dedup record left in progress after
reconciliation."""

from __future__ import annotations

from shared._core.records import RecordState
from simulator.check.evidence import Evidence, is_transient_error
from simulator.check.result import CheckResult, Invariant
from simulator.check.stores import marker_of, store_identity


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    """Exceptions that reached the host, and batches retried until the host gave up."""
    for (function, _, _), seen in (evidence.outcomes or {}).items():
        for outcome, n in seen.items():
            if outcome.startswith("raised "):
                result.host_exceptions[f"{function}: {outcome[7:]}"] += n
    result.stalled_batches = evidence.stalled_batches or 0
    if evidence.outcomes is None:  # a real deployment: the host's log is not read
        return []
    escaped = {k: n for k, n in result.host_exceptions.items()
               if not is_transient_error(k.split(": ", 1)[1])}
    return [Invariant(
        "no exception reached the host but transient failures; no partition stalled",
        not escaped and result.stalled_batches == 0,
        "; ".join(part for part in (
            f"exceptions {escaped}" if escaped else "",
            f"{result.stalled_batches} batches retried until the host gave up"
            if result.stalled_batches else "") if part))]


def check_in_progress(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    """Dedup records of this run still in progress (run after maintenance reconciled)."""
    scanned: set[str] = set()
    for name, store in evidence.store.records.items():
        identity = store_identity(store)
        if identity in scanned:  # e.g. dedup and notifications share one table
            continue
        scanned.add(identity)
        for row in evidence.rows(store, partition=""):
            marker = marker_of(row)
            if (marker is not None and marker.state is RecordState.IN_PROGRESS
                    and evidence.run_id in marker.key.key):
                result.in_progress += 1
                result.example("in progress", f"{name}: {marker.key.consumer} {marker.key.key}")
    return [Invariant("no record left in progress after reconciliation", result.in_progress == 0,
                      f"{result.in_progress} records in progress" if result.in_progress else "")]
