"""Figures, targets (issues 12 and 20) and the markdown / JSON outputs of a latency-mode run."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.latency import LatencyResult, LatencyRun
from benchmarks.latency_variants import APP, COLD_APP, LIMIT, PER_EVENT, REMEMBERED, SYNC_APP
from benchmarks.report import aligned, machine

TARGET_RTT_MS = 5.0


@dataclass
class LatencyRow:
    rtt_ms: float
    added_ms: float  # measured through the relay (point reads), this backend, mean of before/after
    accounts: int
    backend: str
    name: str
    label: str
    events: int
    events_per_second: float
    requests_per_event: float
    cpu_ms_per_event: float
    replay_events: int
    replay_requests: int
    replay_retried: int  # of those, sent again after a transport failure
    vs_limit: float  # events/s over the no-dedup grouped limit's, same scenario
    vs_per_event: float  # events/s over the per-event dedup path's, same scenario
    vs_remembered: float  # events/s over the no-dedup remembered-etags variant's, same scenario
    cpu_vs_remembered: float  # client CPU per event over that variant's
    balances_ok: bool
    meta_requests: int
    retried_calls: int


def _ratio(value: float, base: LatencyResult | None) -> float:
    if base is None or not base.seconds:
        return math.nan
    return value / base.events_per_second


def _cpu_ratio(result: LatencyResult, base: LatencyResult | None) -> float:
    if base is None or not base.cpu_seconds or not result.events or not base.events:
        return math.nan
    return (result.cpu_seconds / result.events) / (base.cpu_seconds / base.events)


def rows(run: LatencyRun) -> list[LatencyRow]:
    out = []
    for r in run.results:
        out.append(LatencyRow(
            rtt_ms=r.rtt_ms, added_ms=run.added_ms(r.rtt_ms, r.backend), accounts=r.accounts,
            backend=r.backend, name=r.name, label=r.label, events=r.events,
            events_per_second=r.events_per_second,
            requests_per_event=r.requests / r.events if r.events else math.nan,
            cpu_ms_per_event=r.cpu_seconds * 1000 / r.events if r.events else math.nan,
            replay_events=r.replay_events, replay_requests=r.replay_requests,
            replay_retried=r.replay_retried,
            vs_limit=_ratio(r.events_per_second, run.result(r.rtt_ms, r.accounts, r.backend, LIMIT)),
            vs_per_event=_ratio(r.events_per_second,
                                run.result(r.rtt_ms, r.accounts, r.backend, PER_EVENT)),
            vs_remembered=_ratio(r.events_per_second, remembered := run.result(
                r.rtt_ms, r.accounts, r.backend, REMEMBERED)),
            cpu_vs_remembered=_cpu_ratio(r, remembered),
            balances_ok=r.balances_checked > 0 and r.balance_mismatches == 0,
            meta_requests=r.meta_requests, retried_calls=r.retried_calls))
    return out


def app_shape(run: LatencyRun) -> str:
    """What the app's batches cost, in store requests, read from the counts (not assumed).

    Per event: 1 mark read + 2 per event + 1 mark write. Grouped: one
    transaction per account (the markers + the balance) + 1 mark write, plus a
    read of the mark and of each balance the instance did not write last (at
    most 2 + 2 per account; more when a group exceeds 99 events and is split).
    Requests sent again after a transport failure are counted, and taken out here.
    """
    shapes = set()
    for r in run.results:
        if r.name != APP:
            continue
        for requests, again, events, accounts in zip(r.batch_requests, r.batch_retried,
                                                     r.batch_events, r.batch_accounts, strict=True):
            first = requests - again
            shapes.add("per-event" if first == 2 + 2 * events else
                       "grouped" if accounts + 1 <= first <= 2 + 2 * accounts else "other")
    if shapes == {"per-event"}:
        return "per-event"
    if shapes == {"grouped"}:
        return "grouped"
    return "mixed" if shapes else "not run"


def resent(run: LatencyRun) -> str:
    """Requests sent again after a transport failure, where any were."""
    parts = [f"{r.name}/{r.backend}/{r.accounts}/{r.rtt_ms:g} ms: {sum(r.batch_retried)}"
             for r in run.results if sum(r.batch_retried)]
    return ", ".join(parts) if parts else "none"


@dataclass
class Target:
    text: str
    backend: str
    measured: str
    met: bool


def _target_rtt(run: LatencyRun) -> float | None:
    return min(run.rtts, key=lambda r: abs(r - TARGET_RTT_MS)) if run.rtts else None


def targets(run: LatencyRun) -> list[Target]:
    """Issue 12's targets, at the RTT nearest 5 ms; few- and many-account scenarios."""
    rtt = _target_rtt(run)
    if rtt is None or not run.sizes.accounts:
        return []
    found = {(r.rtt_ms, r.accounts, r.backend, r.name): r for r in rows(run)}
    few, many = min(run.sizes.accounts), max(run.sizes.accounts)
    at = f"{rtt:g} ms RTT"
    speedup = {"cosmos": (12.0, 3.5), "table": (5.0, 2.5)}
    out: list[Target] = []
    for backend in run.backends:
        app = found.get((rtt, few, backend, APP))
        if app is not None:
            if (rtt, few, backend, LIMIT) in found:
                out.append(Target(f"{at}, {few} accounts: dedup path >= 0.85x the no-dedup grouped "
                                  "limit", backend, f"{app.vs_limit:.2f}x", app.vs_limit >= 0.85))
            if (rtt, few, backend, PER_EVENT) in found:
                need = speedup.get(backend, (12.0, 3.5))[0]
                out.append(Target(f"{at}, {few} accounts: dedup path >= {need:g}x the per-event "
                                  "sequential path", backend, f"{app.vs_per_event:.2f}x",
                                  app.vs_per_event >= need))
            out.append(Target(f"{at}, {few} accounts: <= 0.45 store requests per event", backend,
                              f"{app.requests_per_event:.3f}", app.requests_per_event <= 0.45))
        for accounts in dict.fromkeys((few, many)):  # issue 20: the dedup work costs ~nothing
            row = found.get((rtt, accounts, backend, APP))
            if row is None or (rtt, accounts, backend, REMEMBERED) not in found:
                continue
            out.append(Target(f"{at}, {accounts} accounts: dedup path >= 0.9x the no-dedup "
                              "remembered-etags variant's events/s", backend,
                              f"{row.vs_remembered:.2f}x", row.vs_remembered >= 0.9))
            out.append(Target(f"{at}, {accounts} accounts: client CPU per event <= 1.15x the "
                              "no-dedup remembered-etags variant's", backend,
                              f"{row.cpu_ms_per_event:.2f} ms, {row.cpu_vs_remembered:.2f}x",
                              row.cpu_vs_remembered <= 1.15))
        many_app = found.get((rtt, many, backend, APP))
        if many != few and many_app is not None and (rtt, many, backend, PER_EVENT) in found:
            need = speedup.get(backend, (12.0, 3.5))[1]
            out.append(Target(f"{at}, {many} accounts: dedup path >= {need:g}x the per-event "
                              "sequential path", backend, f"{many_app.vs_per_event:.2f}x",
                              many_app.vs_per_event >= need))
        replays = [r for r in rows(run) if r.name == APP and r.backend == backend]
        if replays:  # after a restart; a request resent after a transport failure is one request
            worst = max(r.replay_requests - r.replay_retried for r in replays)
            resent_too = sum(r.replay_retried for r in replays)
            out.append(Target("replayed, checkpointed batch: 1 store request", backend,
                              f"at most {worst} (batches of {replays[0].replay_events})"
                              + (f"; {resent_too} resent after a transport failure"
                                 if resent_too else ""), worst == 1))
    return out


def _num(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _x(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def _replay_cell(row: LatencyRow) -> str:
    """Requests of the replayed batch; one resent after a transport failure shown apart."""
    first = row.replay_requests - row.replay_retried
    return f"{first} (+{row.replay_retried} resent)" if row.replay_retried else str(first)


def _rtt_cell(row: LatencyRow) -> str:
    return f"{row.rtt_ms:g} ({row.added_ms:.1f})"


SUMMARY = ("Backend", "Accounts", "RTT ms (measured)", "Dedup per event (old), ev/s",
           "No dedup sequential, ev/s", "No dedup grouped (limit), ev/s",
           "No dedup, remembered etags, ev/s", "Sync service (threads), ev/s",
           "App, nothing remembered, ev/s", "App, ev/s", "App vs limit", "App vs etags",
           "App vs old", "App req/event", "App CPU/event", "Etags CPU/event", "App replay req")
FULL = ("RTT ms (measured)", "Accounts", "Backend", "Variant", "Events/s", "Req/event",
        "Client CPU/event", "Replayed batch: req", "vs limit", "vs etags", "CPU vs etags",
        "vs per-event", "Balances")


def summary_rows(run: LatencyRun) -> list[list[str]]:
    found = {(r.rtt_ms, r.accounts, r.backend, r.name): r for r in rows(run)}
    out = []
    for backend in run.backends:
        for accounts in run.sizes.accounts:
            for rtt in run.rtts:
                def eps(name: str, key: tuple[float, int, str] = (rtt, accounts, backend)) -> str:
                    row = found.get((*key, name))
                    return _num(row.events_per_second) if row else "n/a"

                def cpu(name: str, key: tuple[float, int, str] = (rtt, accounts, backend)) -> str:
                    row = found.get((*key, name))
                    return f"{row.cpu_ms_per_event:.2f} ms" if row else "n/a"
                app = found.get((rtt, accounts, backend, APP))
                ref = app or next((r for k, r in found.items() if k[:3] == (rtt, accounts, backend)),
                                  None)
                if ref is None:
                    continue
                out.append([
                    backend, str(accounts), _rtt_cell(ref), eps(PER_EVENT), eps("no-dedup-seq"),
                    eps(LIMIT), eps(REMEMBERED), eps(SYNC_APP), eps(COLD_APP), eps(APP),
                    _x(app.vs_limit) if app else "n/a", _x(app.vs_remembered) if app else "n/a",
                    _x(app.vs_per_event) if app else "n/a",
                    _num(app.requests_per_event, 2) if app else "n/a",
                    f"{app.cpu_ms_per_event:.2f} ms" if app else "n/a", cpu(REMEMBERED),
                    _replay_cell(app) if app else "n/a"])
    return out


def full_rows(run: LatencyRun) -> list[list[str]]:
    return [[_rtt_cell(r), str(r.accounts), r.backend, r.label, _num(r.events_per_second),
             _num(r.requests_per_event, 2), f"{r.cpu_ms_per_event:.2f} ms",
             f"{r.replay_requests} / {r.replay_events} events", _x(r.vs_limit), _x(r.vs_remembered),
             _x(r.cpu_vs_remembered), _x(r.vs_per_event),
             "ok" if r.balances_ok else "**wrong**"] for r in rows(run)]


def _table(headers: tuple[str, ...], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(cells) + " |" for cells in body)]


def _load(values: tuple[float, float, float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def header(run: LatencyRun) -> str:
    s = run.sizes
    probes = "; ".join(
        f"{rtt:g} ms {backend}: " + ", ".join(f"+{p.added_ms:.2f} ms {p.when}"
                                             for p in run.probes_of(rtt, backend))
        + f" (direct {statistics.median(p.direct_ms for p in run.probes_of(rtt, backend)):.2f} ms)"
        for rtt in run.rtts for backend in run.backends if run.probes_of(rtt, backend))
    return (f"Latency benchmark run {run.started_at} on {machine()}; load average (1/5/15 min) "
            f"{_load(run.load_before)} before, {_load(run.load_after)} after; seed {run.seed}; "
            f"{s.events} payment events in batches of {s.batch_size} over "
            f"{' / '.join(str(a) for a in s.accounts)} accounts, then a replay of the last batch "
            f"after a host restart; no-dedup grouped limit on {s.concurrency} threads; "
            f"{run.seconds:.0f} s. "
            f"Added RTT measured before and after each RTT's scenarios, {s.probe_reads} point "
            f"reads each way (median through the relay minus median direct): {probes}. App's "
            f"store requests per batch: {app_shape(run)}. Requests sent again after a transport "
            f"failure (counted): {resent(run)}.")


def markdown(run: LatencyRun) -> str:
    lines = [header(run), "", *_table(SUMMARY, summary_rows(run)), "", "All variants:", "",
             *_table(FULL, full_rows(run)), "", "Notes:", "",
             "- RTT: nominal, with the added round trip measured by point reads in brackets "
             "(mean of the checks before and after; it includes the relay's own hop).",
             "- Events/s: events over the wall time of the measured batches, one consumer; ratios "
             "are to other variants of the same backend, account count and RTT in the same run "
             "(interleaved per batch).",
             "- Req/event: data-plane store requests counted in the azure-core pipeline (exact); "
             "client CPU: the benchmark process's CPU time per event (relays and servers are "
             "other processes).",
             "- Replayed batch: the last batch again after a simulated host restart; without "
             "dedup it is applied twice (counted in the balances check).",
             *([f"- {run.hash_cost.note()}"] if run.hash_cost else []),
             "", "Targets (issues 12 and 20):", ""]
    for target in targets(run):
        lines.append(f"- {target.text} ({target.backend}): {target.measured}: "
                     f"{'met' if target.met else '**missed**'}")
    return "\n".join(lines) + "\n"


def text_table(run: LatencyRun) -> str:
    return aligned(SUMMARY, summary_rows(run))


def to_json(run: LatencyRun) -> dict[str, Any]:
    return {
        "started_at": run.started_at, "machine": machine(), "seed": run.seed,
        "seconds": run.seconds, "sizes": asdict(run.sizes), "rtts_ms": list(run.rtts),
        "load_before": run.load_before, "load_after": run.load_after,
        "probes": [{**asdict(p), "added_ms": p.added_ms} for p in run.probes],
        "app_shape": app_shape(run),
        "hash_cost": asdict(run.hash_cost) if run.hash_cost else None,
        "rows": [asdict(r) for r in rows(run)],
        "targets": [asdict(t) for t in targets(run)],
        "raw": [asdict(r) for r in run.results],
    }


def write_outputs(run: LatencyRun, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "latency.md"
    md.write_text(markdown(run), encoding="utf-8")
    js = out_dir / "latency.json"
    js.write_text(json.dumps(to_json(run), indent=2, default=str), encoding="utf-8")
    return {"markdown": md, "json": js}
