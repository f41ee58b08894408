"""The report of a run, either mode: rows of figures, targets, tables, markdown, JSON, chart.

Every figure comes from the run's samples (`benchmarks.stats`); every ratio is
to another variant of the same backend and scenario in the same run (the work
was interleaved). A target is a figure, a bound and a comparison, checked
here from those figures and printed met or missed with them.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.runner import Result, Run
from benchmarks.stats import Comparison, Figures, compare
from benchmarks.variants import (
    APP,
    BASELINE,
    COLD_APP,
    LIMIT,
    NO_PUBLISH,
    PER_EVENT,
    REMEMBERED,
    SAME,
    SYNC_APP,
)
from benchmarks.workload import LatencySizes, Sizes

TARGET_RTT_MS = 5.0
REFERENCES = {"loopback": (BASELINE,), "latency": (LIMIT, PER_EVENT, REMEMBERED, SAME, NO_PUBLISH)}
NAN = math.nan


@dataclass
class Row:
    name: str
    label: str
    backend: str
    rtt_ms: float
    added_ms: float  # measured through the relay (point reads), mean of before/after
    accounts: int
    main: Figures  # the interleaved phase: new messages, or payment batches
    duplicate: Figures | None
    first_pass: Figures | None
    replay: Figures | None
    vs: dict[str, Comparison] = field(default_factory=dict[str, Comparison])
    replay_extra_effects: int = 0
    concurrent_extra_effects: int = 0
    concurrent_messages: int = 0
    concurrent_outcomes: dict[str, int] = field(default_factory=dict[str, int])
    balances_ok: bool | None = None
    meta_requests: int = 0
    retried_calls: int = 0

    def x(self, reference: str, figure: str = "events_per_second") -> float:
        """This row's figure over `reference`'s (NaN when that variant did not run)."""
        found = self.vs.get(reference)
        return NAN if found is None else float(getattr(found, figure))


def _optional(result: Result, phase: str) -> Figures | None:
    return result.figures(phase) if result.samples(phase) else None


def rows(run: Run) -> list[Row]:
    out: list[Row] = []
    for r in run.results:
        row = Row(r.name, r.label, r.backend, r.rtt_ms, run.added_ms(r.rtt_ms, r.backend),
                  r.accounts, r.figures(), _optional(r, "duplicate"), _optional(r, "first_pass"),
                  _optional(r, "replay"), replay_extra_effects=r.replay_extra_effects,
                  concurrent_extra_effects=r.concurrent_extra_effects,
                  concurrent_messages=getattr(run.sizes, "concurrent", 0),
                  concurrent_outcomes=dict(r.outcomes.get("concurrent", {})),
                  balances_ok=(r.balances_checked > 0 and r.balance_mismatches == 0
                               if run.mode == "latency" else None),
                  meta_requests=r.meta_requests, retried_calls=r.retried_calls)
        for reference in REFERENCES[run.mode]:
            base = run.result(reference, r.backend, rtt_ms=r.rtt_ms, accounts=r.accounts)
            if base is not None and base.samples(base.main):
                row.vs[reference] = compare(row.main, base.figures())
        out.append(row)
    return out


# -- targets -------------------------------------------------------------------------------------
@dataclass
class Target:
    text: str
    backend: str
    value: float
    op: str  # ">=", "<=" or "=="
    bound: float
    detail: str  # the figures the value comes from

    @property
    def met(self) -> bool:
        if math.isnan(self.value):
            return False
        return {">=": self.value >= self.bound, "<=": self.value <= self.bound,
                "==": self.value == self.bound}[self.op]

    def line(self, *, markdown: bool = False) -> str:
        if markdown:
            return (f"- {self.text} ({self.backend}): {self.detail}: "
                    f"{'met' if self.met else '**missed**'}")
        return f"[{'met' if self.met else 'MISSED'}] {self.text} ({self.backend}): {self.detail}"


def targets(run: Run) -> list[Target]:
    return _loopback_targets(run) if run.mode == "loopback" else _latency_targets(run)


def _loopback_targets(run: Run) -> list[Target]:
    found = {(r.name, r.backend): r for r in rows(run)}
    sizes = run.sizes
    batch = sizes.batch_size
    out: list[Target] = []
    for backend in run.backends:
        atomic = found.get(("atomic", backend))
        cached = found.get(("atomic+cache", backend))
        hwm = found.get(("atomic+hwm", backend))
        powertools = found.get(("powertools", backend))
        outbox = found.get(("atomic+outbox", backend))

        def add(text: str, value: float, op: str, bound: float, detail: str,
                backend: str = backend) -> None:
            out.append(Target(text, backend, value, op, bound, detail))

        if atomic:
            f = atomic.main
            add("atomic: exactly 1 store request per new message",
                float(f.requests_max) if f.requests_min == f.requests_max else NAN, "==", 1,
                f"{f.requests_per_unit:g} (min {f.requests_min}, max {f.requests_max})")
            dup = _per_unit(atomic.duplicate)
            add("atomic: at most 2 store requests per duplicate", dup, "<=", 2, f"{dup:g}")
            tp = atomic.x(BASELINE)
            add("atomic: throughput at least 0.9x no-dedup", tp, ">=", 0.9, f"{tp:.2f}x")
        if outbox:
            new, dup = outbox.main.requests_per_unit, _per_unit(outbox.duplicate)
            add("atomic + one outgoing message: at most 2 store requests per new message", new,
                "<=", 2, f"{new:g} ({outbox.main.messages_per_event:g} messages sent per message)")
            add("atomic + one outgoing message: at most 1 store request per duplicate with "
                "nothing pending", dup, "<=", 1, f"{dup:g}")
        if cached:
            dup = _per_unit(cached.duplicate)
            add("atomic + warm cache: 0 store requests per duplicate", dup, "==", 0, f"{dup:g}")
        if hwm:
            replay = _per_unit(hwm.replay)
            add("replayed, checkpointed batch: at most 1 store request in total", replay, "<=", 1,
                f"{replay:g} per batch of {batch}")
        if atomic and powertools:
            factor = (powertools.main.requests_per_unit / atomic.main.requests_per_unit
                      if atomic.main.requests_per_unit else math.inf)
            add("atomic: at least 2x fewer store requests than Powertools-style", factor, ">=", 2,
                f"{factor:.2f}x fewer ({powertools.main.requests_per_unit:g} vs "
                f"{atomic.main.requests_per_unit:g} per new message)")
    return out


def _per_unit(figures: Figures | None) -> float:
    return NAN if figures is None else figures.requests_per_unit


def target_rtt(run: Run) -> float | None:
    return min(run.rtts, key=lambda r: abs(r - TARGET_RTT_MS)) if run.rtts else None


def _latency_targets(run: Run) -> list[Target]:
    """At the RTT nearest 5 ms, for the fewest and the most accounts of the run."""
    at_rtt = target_rtt(run)
    accounts = run.sizes.accounts if isinstance(run.sizes, LatencySizes) else ()
    if at_rtt is None or not accounts:
        return []
    found = {(r.accounts, r.backend, r.name): r for r in rows(run) if r.rtt_ms == at_rtt}
    few, many = min(accounts), max(accounts)
    speedup = {"cosmos": (12.0, 3.5), "table": (5.0, 2.5)}
    out: list[Target] = []

    def ratio(app: Row, reference: str, need: float, text: str, *, figure: str = "events_per_second",
              at_most: bool = False) -> None:
        if (app.accounts, app.backend, reference) not in found:
            return
        value = app.x(reference, figure)
        base = found[(app.accounts, app.backend, reference)]
        if figure == "events_per_second":
            detail = (f"{value:.2f}x ({app.main.events_per_second:.0f} vs "
                      f"{base.main.events_per_second:.0f} events/s)")
        else:
            detail = (f"{value:.2f}x ({app.main.cpu_ms_per_event:.2f} vs "
                      f"{base.main.cpu_ms_per_event:.2f} ms per event)")
        out.append(Target(f"{at_rtt:g} ms RTT, {app.accounts} accounts: {text}", app.backend,
                          value, "<=" if at_most else ">=", need, detail))

    for backend in run.backends:
        need_few, need_many = speedup.get(backend, speedup["cosmos"])
        app = found.get((few, backend, APP))
        if app is not None:
            ratio(app, LIMIT, 0.85, "app >= 0.85x the no-dedup grouped limit's events/s")
            ratio(app, PER_EVENT, need_few, f"app >= {need_few:g}x the per-event path's events/s")
            per_event = app.main.requests_per_event
            for bound, why in ((0.45, "grouped commits"), (0.35, "with its outgoing messages")):
                out.append(Target(f"{at_rtt:g} ms RTT, {few} accounts: app <= {bound:g} store "
                                  f"requests per event ({why})", backend, per_event, "<=", bound,
                                  f"{per_event:.3f} ({app.main.messages_per_event:.3f} messages "
                                  "sent per event)"))
        for count in dict.fromkeys((few, many)):
            row = found.get((count, backend, APP))
            if row is None:
                continue
            ratio(row, REMEMBERED, 0.9, "app >= 0.9x no-dedup-etags' events/s (the dedup work "
                  "costs about nothing)")
            ratio(row, REMEMBERED, 1.15, "app's client CPU per event <= 1.15x no-dedup-etags'",
                  figure="cpu_per_event", at_most=True)
            ratio(row, SAME, 0.95, "app >= 0.95x same-transactions' events/s (the library's own "
                  "work costs at most a twentieth)")
            ratio(row, SAME, 1.10, "app's client CPU per event <= 1.10x same-transactions'",
                  figure="cpu_per_event", at_most=True)
            ratio(row, NO_PUBLISH, 0.8, "app >= 0.8x app-no-publish's events/s (publishing "
                  "costs at most a fifth)")
        many_app = found.get((many, backend, APP))
        if many != few and many_app is not None:
            ratio(many_app, PER_EVENT, need_many,
                  f"app >= {need_many:g}x the per-event path's events/s")
        replays = [r for r in rows(run) if r.name == APP and r.backend == backend and r.replay]
        if replays:  # after a restart; a request resent after a transport failure is one request
            worst = max(r.replay.requests_max for r in replays if r.replay)
            resent = sum(r.replay.resent for r in replays if r.replay)
            events = replays[0].replay.events if replays[0].replay else 0
            out.append(Target("replayed, checkpointed batch: 1 store request", backend, worst, "==",
                              1, f"at most {worst} (batches of {events})"
                              + (f"; {resent} resent after a transport failure" if resent else "")))
    return out


@dataclass(frozen=True)
class Split:
    """The app's client CPU beyond same-transactions', as a cost per transaction plus one per
    event (microseconds)."""

    backend: str
    per_transaction_us: float
    per_event_us: float
    few: int  # the account counts it was solved from
    many: int

    def line(self) -> str:
        return (f"[split] {self.backend}: the library's client CPU beyond same-transactions' is "
                f"{self.per_transaction_us:.0f} us per transaction + {self.per_event_us:.0f} us "
                f"per event (from the {self.few}- and {self.many}-account rows)")


def library_cpu_split(run: Run) -> list[Split]:
    """Per backend, at the target RTT: app minus same-transactions CPU per event is
    e + g * (transactions per event); the fewest- and the most-accounts rows differ in
    transactions per event, so the two give g and e."""
    at_rtt = target_rtt(run)
    accounts = run.sizes.accounts if isinstance(run.sizes, LatencySizes) else ()
    if at_rtt is None or len(set(accounts)) < 2:
        return []
    found = {(r.accounts, r.backend, r.name): r for r in rows(run) if r.rtt_ms == at_rtt}
    few, many = min(accounts), max(accounts)
    out: list[Split] = []
    for backend in run.backends:
        app1, same1 = found.get((few, backend, APP)), found.get((few, backend, SAME))
        app2, same2 = found.get((many, backend, APP)), found.get((many, backend, SAME))
        if app1 is None or same1 is None or app2 is None or same2 is None:
            continue
        d1 = app1.main.cpu_ms_per_event - same1.main.cpu_ms_per_event
        d2 = app2.main.cpu_ms_per_event - same2.main.cpu_ms_per_event
        t1, t2 = app1.main.transactions_per_event, app2.main.transactions_per_event
        if not t2 > t1:
            continue
        per_transaction = (d2 - d1) / (t2 - t1)
        out.append(Split(backend, per_transaction * 1000, (d1 - per_transaction * t1) * 1000,
                         few, many))
    return out


# -- tables --------------------------------------------------------------------------------------
def _num(value: float, digits: int = 2) -> str:
    if math.isnan(value):
        return "n/a"
    return str(int(value)) if float(value).is_integer() else f"{value:.{digits}f}"


def _x(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def _eps(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.0f}"


def _replay_cell(row: Row) -> str:
    """Requests of the replayed batch (first attempts); a resend shown apart."""
    if row.replay is None:
        return "n/a"
    first = row.replay.requests - row.replay.resent
    return f"{first} (+{row.replay.resent} resent)" if row.replay.resent else str(first)


Column = tuple[str, Callable[[Row], str]]
LOOPBACK_COLUMNS: list[Column] = [
    ("Variant", lambda r: r.label), ("Backend", lambda r: r.backend),
    ("Req/new msg", lambda r: _num(r.main.requests_per_unit)),
    ("Req/duplicate", lambda r: _num(_per_unit(r.duplicate))),
    ("Req/batch first pass", lambda r: _num(_per_unit(r.first_pass))),
    ("Req/replayed batch", lambda r: _num(_per_unit(r.replay))),
    ("Extra effects: replay/batch",
     lambda r: _num(r.replay_extra_effects / r.replay.units if r.replay else NAN)),
    ("Extra effects: concurrent", lambda r: f"{r.concurrent_extra_effects}/{r.concurrent_messages}"),
    ("Throughput vs no-dedup", lambda r: _x(r.x(BASELINE))),
    ("p50 vs no-dedup", lambda r: _x(r.x(BASELINE, "p50"))),
    ("p99 vs no-dedup", lambda r: _x(r.x(BASELINE, "p99"))),
    ("Client CPU/msg", lambda r: f"{r.main.cpu_ms_per_event:.1f} ms"),
    ("Messages sent/msg", lambda r: _num(r.main.messages_per_event)),
]
FULL_COLUMNS: list[Column] = [
    ("RTT ms (measured)", lambda r: f"{r.rtt_ms:g} ({r.added_ms:.1f})"),
    ("Accounts", lambda r: str(r.accounts)), ("Backend", lambda r: r.backend),
    ("Variant", lambda r: r.label), ("Events/s", lambda r: _eps(r.main.events_per_second)),
    ("Req/event", lambda r: f"{r.main.requests_per_event:.2f}"),
    ("Msgs sent/event", lambda r: f"{r.main.messages_per_event:.2f}"),
    ("Client CPU/event", lambda r: f"{r.main.cpu_ms_per_event:.2f} ms"),
    ("Replayed batch: req", lambda r: f"{r.replay.requests if r.replay else 0} / "
                                      f"{r.replay.events if r.replay else 0} events"),
    ("vs limit", lambda r: _x(r.x(LIMIT))), ("vs etags", lambda r: _x(r.x(REMEMBERED))),
    ("CPU vs etags", lambda r: _x(r.x(REMEMBERED, "cpu_per_event"))),
    ("vs same-tx", lambda r: _x(r.x(SAME))), ("CPU vs same-tx", lambda r: _x(r.x(SAME, "cpu_per_event"))),
    ("vs no-publish", lambda r: _x(r.x(NO_PUBLISH))), ("vs per-event", lambda r: _x(r.x(PER_EVENT))),
    ("Balances", lambda r: "ok" if r.balances_ok else "**wrong**"),
]
# The latency summary: one line per backend, account count and RTT; the app's figures and
# each variant's events/s.
SUMMARY_EPS = ((PER_EVENT, "Dedup per event (old)"), ("no-dedup-seq", "No dedup sequential"),
               (LIMIT, "No dedup grouped (limit)"), (REMEMBERED, "No dedup, remembered etags"),
               (SAME, "Same transactions, raw SDK"), (SYNC_APP, "Sync service (threads)"),
               (COLD_APP, "App, nothing remembered"),
               (NO_PUBLISH, "App, publishing off"), (APP, "App"))
SUMMARY_APP: list[Column] = [
    ("App vs limit", lambda r: _x(r.x(LIMIT))), ("App vs etags", lambda r: _x(r.x(REMEMBERED))),
    ("App CPU vs etags", lambda r: _x(r.x(REMEMBERED, "cpu_per_event"))),
    ("App vs same-tx", lambda r: _x(r.x(SAME))),
    ("App CPU vs same-tx", lambda r: _x(r.x(SAME, "cpu_per_event"))),
    ("App vs no-publish", lambda r: _x(r.x(NO_PUBLISH))), ("App vs old", lambda r: _x(r.x(PER_EVENT))),
    ("App req/event", lambda r: f"{r.main.requests_per_event:.2f}"),
    ("App msgs sent/event", lambda r: f"{r.main.messages_per_event:.2f}"),
    ("App CPU/event", lambda r: f"{r.main.cpu_ms_per_event:.2f} ms"),
]


def summary_headers() -> list[str]:
    return (["Backend", "Accounts", "RTT ms (measured)"]
            + [f"{label}, ev/s" for _, label in SUMMARY_EPS]
            + [header for header, _ in SUMMARY_APP]
            + ["Etags CPU/event", "Same-tx CPU/event", "App replay req"])


def summary_rows(run: Run) -> list[list[str]]:
    found = {(r.rtt_ms, r.accounts, r.backend, r.name): r for r in rows(run)}
    accounts = run.sizes.accounts if isinstance(run.sizes, LatencySizes) else ()
    out: list[list[str]] = []
    for backend in run.backends:
        for count in accounts:
            for rtt_ms in run.rtts:
                here = {name: row for (t, a, b, name), row in found.items()
                        if (t, a, b) == (rtt_ms, count, backend)}
                if not here:
                    continue
                app = here.get(APP)
                ref = app or next(iter(here.values()))
                etags, same = here.get(REMEMBERED), here.get(SAME)
                out.append(
                    [backend, str(count), f"{rtt_ms:g} ({ref.added_ms:.1f})"]
                    + [_eps(here[name].main.events_per_second) if name in here else "n/a"
                       for name, _ in SUMMARY_EPS]
                    + [cell(app) if app else "n/a" for _, cell in SUMMARY_APP]
                    + [f"{etags.main.cpu_ms_per_event:.2f} ms" if etags else "n/a",
                       f"{same.main.cpu_ms_per_event:.2f} ms" if same else "n/a",
                       _replay_cell(app) if app else "n/a"])
    return out


def aligned(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A plain-text table: columns padded to their widest cell, a dashed rule under the header."""
    data = [list(headers), *body]
    widths = [max(len(r[i]) for r in data) for i in range(len(headers))]
    out = []
    for index, row in enumerate(data):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _markdown_table(headers: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(cells) + " |" for cells in body)]


def _cells(columns: list[Column], run: Run) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in columns], [[cell(r) for _, cell in columns] for r in rows(run)]


def text_table(run: Run) -> str:
    if run.mode == "loopback":
        return aligned(*_cells(LOOPBACK_COLUMNS, run))
    return aligned(summary_headers(), summary_rows(run))


# -- header, notes, markdown ---------------------------------------------------------------------
def machine() -> str:
    cores = os.cpu_count() or 0
    return f"{platform.system()} {platform.machine()}, {cores} cores, Python {platform.python_version()}"


def _load(values: tuple[float, float, float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def app_shape(run: Run, name: str = APP) -> str:
    """What the app's batches cost, in store requests, read from the counts (not assumed).

    Per event: 1 mark read + 2 per event + 1 mark write. Grouped: one
    transaction per account (the markers + the balance) + 1 mark write, plus a
    read of the mark and of each balance the instance did not write last (at
    most 2 + 2 per account; more when a group exceeds 99 events and is split).
    Requests sent again after a transport failure are taken out.
    """
    shapes = set()
    for r in run.results:
        if r.name == name:
            for s in r.samples("batches"):
                first = s.first_attempts
                shapes.add("per-event" if first == 2 + 2 * s.events else
                           "grouped" if s.accounts + 1 <= first <= 2 + 2 * s.accounts else "other")
    if len(shapes) == 1:
        return shapes.pop()
    return "mixed" if shapes else "not run"


def resent(run: Run) -> str:
    """Requests sent again after a transport failure, where any were."""
    parts = [f"{r.name}/{r.backend}/{r.accounts}/{r.rtt_ms:g} ms: {n}" for r in run.results
             if (n := sum(s.resent for s in r.samples(r.main)))]
    return ", ".join(parts) if parts else "none"


def header(run: Run) -> str:
    common = (f"run {run.started_at} on {machine()}; load average (1/5/15 min) "
              f"{_load(run.load_before)} before, {_load(run.load_after)} after; seed {run.seed}")
    s = run.sizes
    if isinstance(s, Sizes):
        return (f"Benchmark {common}; {s.messages} new messages, {s.duplicates} duplicates, "
                f"{s.batches} Event Hubs batches of {s.batch_size} events replayed once after a "
                f"restart, {s.concurrent} messages x {s.copies} concurrent copies; Azurite (Table) "
                f"and the local Cosmos server; {run.seconds:.0f} s.")
    probes = "; ".join(
        f"{rtt_ms:g} ms {backend}: " + ", ".join(f"+{p.added_ms:.2f} ms {p.when}"
                                                 for p in run.probes_of(rtt_ms, backend))
        + f" (direct {statistics.median(p.direct_ms for p in run.probes_of(rtt_ms, backend)):.2f} ms)"
        for rtt_ms in run.rtts for backend in run.backends if run.probes_of(rtt_ms, backend))
    return (f"Latency benchmark {common}; {s.events} payment events in batches of {s.batch_size} "
            f"over {' / '.join(str(a) for a in s.accounts)} accounts, then a replay of the last "
            f"batch after a host restart; no-dedup limits on {s.concurrency} concurrent groups; "
            f"{run.seconds:.0f} s. Added RTT measured before and after each RTT's scenarios, "
            f"{s.probe_reads} point reads each way (median through the relay minus median "
            f"direct): {probes}. Store requests per batch: app {app_shape(run)}, app-no-publish "
            f"{app_shape(run, NO_PUBLISH)}, same-transactions {app_shape(run, SAME)}. Requests "
            f"sent again after a transport failure (counted): {resent(run)}.")


def _baselines(run: Run) -> str:
    return "; ".join(f"no-dedup on {r.backend}: {r.main.events_per_second:.0f} msg/s on one "
                     f"thread, p50 {r.main.p50_ms:.2f} ms, p99 {r.main.p99_ms:.2f} ms"
                     for r in rows(run) if r.name == BASELINE)


def _meta_note(run: Run) -> str:
    parts = [f"{r.name}/{r.backend}: {r.meta_requests}" for r in run.results if r.meta_requests]
    retried = [f"{r.name}/{r.backend}: {r.retried_calls}" for r in run.results if r.retried_calls]
    text = ("none during the measured phases" if not parts
            else "during the measured phases: " + ", ".join(parts))
    return text + ("; requests sent again: " + ", ".join(retried) if retried else "")


def _loopback_notes(run: Run) -> list[str]:
    s = run.sizes
    assert isinstance(s, Sizes)
    return [
        f"Baselines measured in the same run: {_baselines(run)}.", "", "Notes:", "",
        "- Store requests are data-plane HTTP requests counted in the azure-core pipeline "
        f"(exact, per message); SDK management requests are counted apart ({_meta_note(run)}).",
        "- Ratios are to the no-dedup baseline on the same backend, measured in the same run, "
        "interleaved; latency ratios above 1 are slower. Client CPU is the consumer process's "
        "CPU time per new message (SDK, serialization, TLS).",
        "- Req/duplicate of `atomic + local cache` is a warm cache (same process); a cold cache "
        "costs what `atomic` costs. Replay runs after a simulated host restart (process-local "
        "state dropped), so that row's replay is cold.",
        f"- `atomic + high-water mark` first pass: 1 mark read + {s.batch_size} commits + 1 mark "
        "write per batch, plus 1 read on the partition's very first batch.",
        "- Every row except `atomic + high-water mark` handles an Event Hubs batch one event at "
        "a time: its replay column is the replay without a high-water mark.",
        "- Extra effects: messages whose effect was applied more than once, on replay (per "
        f"batch) and when delivered as {s.copies} simultaneous copies.",
        "- Messages sent: the outbox's sends are costed, not made (`benchmarks.counting`).",
    ]


def _latency_notes(run: Run) -> list[str]:
    return [
        "All variants:", "", *_markdown_table(*_cells(FULL_COLUMNS, run)), "", "Notes:", "",
        "- RTT: nominal, with the added round trip measured by point reads in brackets (mean of "
        "the checks before and after; it includes the relay's own hop).",
        "- Events/s: events over the wall time of the measured batches, one consumer; ratios are "
        "to other variants of the same backend, account count and RTT in the same run "
        "(interleaved per batch).",
        "- Req/event: data-plane store requests counted in the azure-core pipeline (exact); "
        "client CPU: the benchmark process's CPU time per event (relays and servers are other "
        "processes).",
        "- Msgs sent/event: outgoing messages the app's dispatcher was given; nothing is sent, "
        "each send costs one round trip of the nominal RTT (awaited in the async app, a blocked "
        "thread in the sync one).",
        "- Replayed batch: the last batch again after a simulated host restart; without dedup it "
        "is applied twice (counted in the balances check).",
        *([f"- {run.hash_cost.note()}"] if run.hash_cost else []),
    ]


def markdown(run: Run) -> str:
    if run.mode == "loopback":
        table = _markdown_table(*_cells(LOOPBACK_COLUMNS, run))
        notes = _loopback_notes(run)
    else:
        table = _markdown_table(summary_headers(), summary_rows(run))
        notes = _latency_notes(run)
    lines = [header(run), "", *table, "", *notes, "", "Targets:", "",
             *(t.line(markdown=True) for t in targets(run)),
             *(f"- {split.line()}" for split in library_cpu_split(run))]
    return "\n".join(lines) + "\n"


# -- outputs -------------------------------------------------------------------------------------
def to_json(run: Run) -> dict[str, Any]:
    return {
        "mode": run.mode, "started_at": run.started_at, "machine": machine(), "seed": run.seed,
        "seconds": run.seconds, "sizes": asdict(run.sizes), "rtts_ms": list(run.rtts),
        "load_before": run.load_before, "load_after": run.load_after,
        "probes": [{**asdict(p), "added_ms": p.added_ms} for p in run.probes],
        "app_shape": app_shape(run) if run.mode == "latency" else None,
        "hash_cost": asdict(run.hash_cost) if run.hash_cost else None,
        "rows": [asdict(r) for r in rows(run)],
        "targets": [{**asdict(t), "met": t.met} for t in targets(run)],
        "cpu_split": [asdict(s) for s in library_cpu_split(run)],
        "raw": [{**asdict(r), "outcomes": {k: dict(v) for k, v in r.outcomes.items()}}
                for r in run.results],
    }


def chart(run: Run, path: Path) -> Path | None:
    """Loopback: a PNG of requests and relative speed per variant; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    data = rows(run)
    names = list(dict.fromkeys(r.name for r in data))
    panels: list[tuple[str, Callable[[Row], float]]] = [
        ("Store requests per new message", lambda r: r.main.requests_per_unit),
        ("Store requests per duplicate", lambda r: _per_unit(r.duplicate)),
        (f"Store requests per replayed batch ({run.sizes.batch_size} events)",
         lambda r: _per_unit(r.replay)),
        ("Throughput vs no-dedup (x)", lambda r: r.x(BASELINE)),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    width = 0.8 / max(1, len(run.backends))
    colors = {"table": "#4C72B0", "cosmos": "#DD8452"}
    for ax, (title, value) in zip(axes.flat, panels, strict=True):
        for b, backend in enumerate(run.backends):
            xs: list[float] = []
            ys: list[float] = []
            for i, name in enumerate(names):
                row = next((r for r in data if r.name == name and r.backend == backend), None)
                if row is not None:
                    xs.append(i + (b - (len(run.backends) - 1) / 2) * width)
                    ys.append(value(row))
            bars = ax.bar(xs, ys, width, label=backend, color=colors.get(backend))
            ax.bar_label(bars, labels=[_num(y) for y in ys], fontsize=7, padding=1)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        if title.startswith("Throughput"):
            ax.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"Idempotent consumer benchmark, {run.started_at}, {machine()}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(run: Run, out_dir: Path, *, with_chart: bool = True) -> dict[str, Path]:
    """Loopback: results.md, results.json, chart.png; latency: latency.md, latency.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "results" if run.mode == "loopback" else "latency"
    written = {"markdown": out_dir / f"{stem}.md", "json": out_dir / f"{stem}.json"}
    written["markdown"].write_text(markdown(run), encoding="utf-8")
    written["json"].write_text(json.dumps(to_json(run), indent=2, default=str), encoding="utf-8")
    if with_chart and run.mode == "loopback":
        png = chart(run, out_dir / "chart.png")
        if png is not None:
            written["chart"] = png
    return written
