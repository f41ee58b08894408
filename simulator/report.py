"""The demo's report: what was sent, delivered, absorbed, applied, refused, and how fast."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from simulator.check import valid_line
from simulator.host import CAUSES
from simulator.scenario import ScenarioResult


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _n(value: int | float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def _counter_lines(counter: dict[str, int] | Counter[str], indent: str = "    ") -> list[str]:
    if not counter:
        return [f"{indent}(none)"]
    width = max(len(k) for k in counter)
    return [f"{indent}{k:<{width}}  {_n(v)}" for k, v in sorted(counter.items(), key=lambda kv: -kv[1])]


TIMELINE_BINS = 40
LATENCY_BINS = 24


def _binned(times: list[float], *, origin: float, width: float, bins: int) -> list[int]:
    counts = [0] * bins
    for t in times:
        counts[min(bins - 1, max(0, int((t - origin) / width)))] += 1
    return counts


def timeline(result: ScenarioResult, *, bins: int = TIMELINE_BINS) -> dict[str, Any]:
    """Deliveries, duplicates by cause and faults per slice of virtual time (for the HTML report).

    The axis spans the first to the last delivery or fault: a small run's sends are released at
    once, late in the producer's schedule, so the host's start would leave the chart empty."""
    moments = [t for t, _ in result.stats.timeline] + [t for t, _ in result.fault_times]
    origin = min(moments, default=result.started_at)
    width = max(max(moments, default=origin) - origin, 1e-9) * (1 + 1e-9) / bins
    times = [t for t, _ in result.stats.timeline]
    by_cause = {cause: _binned([t for t, c in result.stats.timeline if c == cause], origin=origin,
                               width=width, bins=bins) for cause in CAUSES}
    kinds = sorted({kind for _, kind in result.fault_times})
    faults = {kind: _binned([t for t, k in result.fault_times if k == kind], origin=origin,
                            width=width, bins=bins) for kind in kinds}
    return {"binSeconds": width, "startSeconds": origin - result.started_at,
            "deliveries": _binned(times, origin=origin, width=width, bins=bins),
            "duplicates": by_cause, "faults": faults}


def latency_histograms(latencies: dict[str, list[float]], *,
                       bins: int = LATENCY_BINS) -> dict[str, dict[str, list[float]]]:
    """Log-spaced latency histograms in ms: spans of 0.1 ms to seconds stay readable."""
    histograms = {}
    for kind, values in latencies.items():
        ms = [max(v * 1000.0, 1e-3) for v in values]
        if not ms:
            continue
        low, high = math.log10(min(ms)), math.log10(max(ms))
        step = max(high - low, 1e-6) / bins
        edges = [10 ** (low + i * step) for i in range(bins + 1)]
        counts = [0] * bins
        for value in ms:
            counts[min(bins - 1, int((math.log10(value) - low) / step))] += 1
        histograms[kind] = {"edges": edges, "counts": counts}
    return histograms


def outcomes_by_function(outcomes: Counter[str]) -> dict[str, dict[str, int]]:
    """`"function: outcome"` counts as {function: {outcome: n}}."""
    table: dict[str, dict[str, int]] = {}
    for label, n in outcomes.items():
        function, _, outcome = label.partition(": ")
        table.setdefault(function, {})[outcome or "?"] = n
    return table


def summary(result: ScenarioResult) -> dict[str, Any]:
    """The report's numbers, as JSON-friendly values."""
    stats, check, workload = result.stats, result.check, result.workload
    duplicates = sum(stats.duplicates.values())
    doubles = sum(check.double_effects.values())
    logical_messages = len(workload.service_bus_items)
    logical_events = len(workload.event_items)
    latency = stats.latencies
    return {
        "backend": result.config.backend, "seed": result.config.seed, "runId": result.config.run_id,
        "messagesSent": logical_messages, "eventsSent": logical_events,
        "copiesSent": result.sent,
        "deliveries": dict(stats.deliveries), "deliveriesTotal": sum(stats.deliveries.values()),
        "duplicatesByCause": {cause: stats.duplicates.get(cause, 0) for cause in CAUSES},
        "duplicatesAbsorbed": max(0, duplicates - doubles),
        "effects": dict(check.effects),
        "doubleEffects": doubles, "lost": sum(check.lost.values()),
        "phantoms": sum(check.phantoms.values()), "outboxPending": check.outbox_pending,
        "hops": check.hops(), "viewMismatches": len(check.view_mismatches),
        "partialEffects": sum(check.partial.values()),
        "balanceMismatches": len(check.balance_mismatches),
        "validNotEffected": sum(check.valid_not_effected.values()),
        "validNotEffectedByReason": dict(check.valid_not_effected),
        "validAlsoRefused": sum(check.valid_also_refused.values()),
        "validAlsoRefusedByReason": dict(check.valid_also_refused),
        "faultExhausted": sum(check.fault_exhausted.values()),
        "outcomeUnknownAllowed": dict(check.outcome_unknown),
        "invalidInput": dict(check.invalid),
        "hostileCases": sum(1 for item in workload.items if item.case),
        "rejectionReasons": dict(check.rejection_reasons),
        "invalidNotRejected": dict(check.invalid_not_rejected),
        "hostExceptions": dict(check.host_exceptions), "stalledBatches": check.stalled_batches,
        "hostRetries": stats.host_retries,
        "outageFailures": result.outage_failures, "outageHeld": result.outage_held,
        "deadLettered": dict(check.dead_lettered), "parked": dict(check.parked),
        "conflicts": dict(check.conflicts), "resentWithSameKey": check.resent_same_key,
        "faultsInjected": result.faults, "outages": result.outages,
        "throughputLogicalPerSecond": (logical_messages + logical_events) / max(result.run_seconds, 1e-9),
        "throughputDeliveriesPerSecond": sum(stats.deliveries.values()) / max(result.run_seconds, 1e-9),
        "latencyMs": {kind: {"p50": percentile(v, 50) * 1000, "p99": percentile(v, 99) * 1000}
                      for kind, v in latency.items()},
        "wallSeconds": result.wall_seconds, "runSeconds": result.run_seconds,
        "virtualSeconds": result.virtual_seconds,
        "ok": result.ok,
        "invariants": [{"name": i.name, "ok": i.ok, "detail": i.detail} for i in check.invariants],
        "timeline": timeline(result),
        "outcomesByFunction": outcomes_by_function(stats.outcomes),
        "latencyHistogramMs": latency_histograms(latency),
    }


def hop_line(hops: dict[str, dict[str, int]]) -> str:
    """Each outbox hop's double / lost / phantom / pending figures, on one line."""
    return "; ".join(f"{hop}: double {_n(h['double'])}, lost {_n(h['lost'])}, phantom "
                     f"{_n(h['phantom'])}, pending {_n(h['pending'])}" for hop, h in hops.items())


def format_report(result: ScenarioResult) -> str:
    s = summary(result)
    return "\n".join([*_traffic(result, s), *_effects(result, s), *_refusals(result, s),
                      *_faults(result), *_speed(result, s), *_verdicts(result)])


def _traffic(result: ScenarioResult, s: dict[str, Any]) -> list[str]:
    """The run's settings, what was sent, delivered, and the duplicates among deliveries."""
    config, stats, workload = result.config, result.stats, result.workload
    kinds = Counter(item.kind for item in workload.items)
    lines = [f"== {config.backend} backend  (seed {config.seed}, run {config.run_id}, "
             f"{config.consumers} consumers, duplicate rate {config.duplicate_rate:g}, "
             f"fault rate {config.fault_rate:g}"
             + (", DEDUP OFF" if config.dedup_off else "")
             + (f", NON-ATOMIC {config.non_atomic}" if config.non_atomic else "")
             + (f", PUBLISH {config.publish.upper()}" if config.publish != "outbox" else "")
             + ") =="]
    lines.append(f"Sent: {_n(s['messagesSent'])} Service Bus messages (orders {_n(kinds['order'])}, "
                 f"order status {_n(kinds['order_status'])}, notifications "
                 f"{_n(kinds['notification'])} x 2 subscriptions) and {_n(s['eventsSent'])} "
                 "payment events")
    copies = sum(len(item.copies) for item in workload.items)
    lines.append(f"  producer-retry copies: {_n(copies)} "
                 f"(dropped by Service Bus duplicate detection: "
                 f"{_n(result.sent.get('service bus: dropped by duplicate detection', 0))})")
    lines.append(f"Deliveries: {_n(s['deliveriesTotal'])}  "
                 + ", ".join(f"{k} {_n(v)}" for k, v in sorted(stats.deliveries.items()))
                 + f"  ({_n(stats.batches)} Event Hubs batches, host retries {_n(stats.host_retries)})")
    total_dup = sum(stats.duplicates.values())
    logical = s["messagesSent"] + kinds["notification"] + s["eventsSent"]
    lines.append(f"Duplicate deliveries absorbed: {_n(s['duplicatesAbsorbed'])} of {_n(total_dup)} "
                 f"({100 * total_dup / max(logical, 1):.1f}% of logical deliveries)")
    for cause in CAUSES:
        lines.append(f"    {cause:<18} {_n(stats.duplicates.get(cause, 0))}")
    return lines


def _effects(result: ScenarioResult, s: dict[str, Any]) -> list[str]:
    """The effects found, the headline counts, and why valid messages were not effected."""
    check = result.check
    lines = ["Effects applied (read from the stores / the notification API):"]
    lines += _counter_lines(check.effects)
    if check.resent_same_key:
        lines.append(f"    re-sent with the same Idempotency-Key (absorbed by the API): "
                     f"{_n(check.resent_same_key)}")
    lines.append(f"DOUBLE EFFECTS: {_n(s['doubleEffects'])}   LOST: {_n(s['lost'])}   "
                 f"VALID NOT EFFECTED: {_n(s['validNotEffected'])}"
                 + (f" (+ {_n(s['validAlsoRefused'])} effected, a copy refused)"
                    if s["validAlsoRefused"] else "") + "   "
                 f"partial effects: {_n(s['partialEffects'])}   balance mismatches: "
                 f"{_n(s['balanceMismatches'])}   PHANTOM: {_n(s['phantoms'])}   "
                 f"PENDING: {_n(s['outboxPending'])}")
    lines.append("Outbox hops: " + hop_line(s["hops"])
                 + f"; balance views differing from their balance: {_n(s['viewMismatches'])}")
    lines.append(valid_line(check, api_honours_key=result.config.api_honours_key))
    for reason, n in sorted({**check.valid_not_effected, **check.valid_also_refused}.items(),
                            key=lambda kv: -kv[1]):
        lines.append(f"    {reason}  {_n(n)}")
    return lines


def _refusals(result: ScenarioResult, s: dict[str, Any]) -> list[str]:
    """Invalid input, exceptions at the host, dead letters, parkings and key conflicts."""
    check = result.check
    invalid = sum(check.invalid.values())
    lines = [f"Invalid input: {_n(invalid)} messages ({_n(s['hostileCases'])} hostile cases), "
             f"rejected with a reason on the first delivery: "
             f"{_n(invalid - check.invalid_failed)}; reasons seen: "
             + (", ".join(f"{k} {_n(v)}" for k, v in sorted(check.rejection_reasons.items(),
                                                            key=lambda kv: -kv[1])) or "none")]
    for problem, n in sorted(check.invalid_not_rejected.items(), key=lambda kv: -kv[1]):
        lines.append(f"    NOT REJECTED: {problem}  {_n(n)}")
    if check.host_exceptions or check.stalled_batches:
        lines.append("Exceptions that reached the host: "
                     + (", ".join(f"{k} {_n(v)}" for k, v in sorted(check.host_exceptions.items()))
                        or "none")
                     + f"; batches retried until the host gave up: {_n(check.stalled_batches)}")
    lines.append("Dead-lettered by reason (broker dead-letter queues):")
    lines += _counter_lines(check.dead_lettered)
    lines.append("Parked by reason (parking table):")
    lines += _counter_lines(check.parked)
    if check.conflicts:
        lines.append("Key conflicts (same id, other content): "
                     + ", ".join(f"{k} {_n(v)}" for k, v in check.conflicts.items()))
    return lines


def _faults(result: ScenarioResult) -> list[str]:
    """The faults injected, and the outages with the store calls they failed or held."""
    lines = [f"Faults injected ({_n(sum(result.faults.values()))}):"]
    lines += _counter_lines(result.faults)
    if result.outages:
        lines.append("Outages: " + ", ".join(f"{server} {mode} {seconds:g} s"
                                            for server, mode, seconds in result.outages)
                     + "; store calls failed by them: "
                     + (", ".join(f"{k} {_n(v)}" for k, v in sorted(result.outage_failures.items()))
                        or "none")
                     + ("; held until the server resumed: "
                        + ", ".join(f"{k} {_n(v)}" for k, v in sorted(result.outage_held.items()))
                        if result.outage_held else ""))
    return lines


def _speed(result: ScenarioResult, s: dict[str, Any]) -> list[str]:
    """Throughput and latencies, and any error of the harness itself."""
    lat, stats = s["latencyMs"], result.stats

    def pair(kind: str) -> str:
        value = lat.get(kind)
        return f"{value['p50']:.1f} / {value['p99']:.1f} ms" if value else "n/a"

    sizes = stats.batch_sizes
    lines = [f"Throughput: {s['throughputLogicalPerSecond']:.0f} logical messages/s, "
             f"{s['throughputDeliveriesPerSecond']:.0f} deliveries/s "
             f"(run {result.run_seconds:.1f} s wall, {result.virtual_seconds / 60:.0f} min "
             f"virtual; checks {result.check_seconds:.1f} s)",
             f"Latency p50 / p99: Service Bus message {pair('service bus message')}; "
             f"Event Hubs batch {pair('event hubs batch')} (mean size "
             f"{sum(sizes) / max(len(sizes), 1):.1f}); per event {pair('event hubs event')}"]
    if stats.errors:
        lines.append("HARNESS ERRORS: " + "; ".join(stats.errors))
    return lines


def _verdicts(result: ScenarioResult) -> list[str]:
    """Every invariant, PASS or FAIL, and examples of what broke one."""
    lines = ["Invariants (checked from the stores):"]
    for inv in result.check.invariants:
        lines.append(f"  [{'PASS' if inv.ok else 'FAIL'}] {inv.name}"
                     + (f" -- {inv.detail}" if inv.detail else ""))
    for what, examples in result.check.examples.items():
        lines.append(f"  e.g. {what}: " + "; ".join(examples))
    return lines
