"""Figures, targets, and the printed / markdown / JSON / PNG outputs of a run."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import BenchmarkRun, VariantResult
from benchmarks.variants import BASELINE


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def mean(values: list[int] | list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass
class Row:
    name: str
    label: str
    backend: str
    project: bool
    req_new: float
    req_new_range: tuple[int, int]
    req_dup: float
    req_first_batch: float
    req_replay_batch: float
    replay_extra_effects_per_batch: float
    concurrent_extra_effects: int
    concurrent_outcomes: dict[str, int]
    throughput: float  # new messages per second, one consumer thread
    p50_ms: float
    p99_ms: float
    dup_p50_ms: float
    cpu_ms: float  # mean client CPU per new message
    throughput_ratio: float
    p50_ratio: float
    p99_ratio: float
    meta_requests: int
    retried_calls: int


def _row(result: VariantResult, base: VariantResult | None) -> Row:
    total = sum(result.new_latency)
    throughput = len(result.new_latency) / total if total else math.nan
    p50 = percentile(result.new_latency, 50) * 1000
    p99 = percentile(result.new_latency, 99) * 1000
    if base is not None and base.new_latency:
        base_tp = len(base.new_latency) / sum(base.new_latency)
        base_p50 = percentile(base.new_latency, 50) * 1000
        base_p99 = percentile(base.new_latency, 99) * 1000
    else:
        base_tp = base_p50 = base_p99 = math.nan
    batches = len(result.replay_batch_requests)
    return Row(
        name=result.name, label=result.label, backend=result.backend, project=result.project,
        req_new=mean(result.new_requests),
        req_new_range=(min(result.new_requests, default=0), max(result.new_requests, default=0)),
        req_dup=mean(result.dup_requests),
        req_first_batch=mean(result.first_batch_requests),
        req_replay_batch=mean(result.replay_batch_requests),
        replay_extra_effects_per_batch=result.replay_extra_effects / batches if batches else math.nan,
        concurrent_extra_effects=result.concurrent_extra_effects,
        concurrent_outcomes=dict(result.outcomes.get("concurrent", {})),
        throughput=throughput, p50_ms=p50, p99_ms=p99,
        dup_p50_ms=percentile(result.dup_latency, 50) * 1000,
        cpu_ms=mean(result.new_cpu) * 1000,
        throughput_ratio=throughput / base_tp, p50_ratio=p50 / base_p50, p99_ratio=p99 / base_p99,
        meta_requests=result.meta_requests, retried_calls=result.retried_calls,
    )


def rows(run: BenchmarkRun) -> list[Row]:
    return [_row(r, run.result(BASELINE, r.backend)) for r in run.results]


@dataclass
class Target:
    text: str
    backend: str
    measured: str
    met: bool


def targets(run: BenchmarkRun) -> list[Target]:
    found = {(r.name, r.backend): r for r in rows(run)}
    out: list[Target] = []
    for backend in run.backends:
        atomic = found.get(("atomic", backend))
        cached = found.get(("atomic+cache", backend))
        hwm = found.get(("atomic+hwm", backend))
        powertools = found.get(("powertools", backend))
        if atomic:
            out.append(Target("atomic: exactly 1 store request per new message", backend,
                              f"{atomic.req_new:g} (min {atomic.req_new_range[0]}, "
                              f"max {atomic.req_new_range[1]})",
                              atomic.req_new_range == (1, 1)))
            out.append(Target("atomic: at most 2 store requests per duplicate", backend,
                              f"{atomic.req_dup:g}", atomic.req_dup <= 2))
            out.append(Target("atomic: throughput at least 0.9x no-dedup", backend,
                              f"{atomic.throughput_ratio:.2f}x", atomic.throughput_ratio >= 0.9))
        if cached:
            out.append(Target("atomic + warm cache: 0 store requests per duplicate", backend,
                              f"{cached.req_dup:g}", cached.req_dup == 0))
        if hwm:
            out.append(Target("replayed, checkpointed batch: at most 1 store request in total",
                              backend, f"{hwm.req_replay_batch:g} per batch of "
                              f"{run.sizes.batch_size}", hwm.req_replay_batch <= 1))
        if atomic and powertools:
            factor = powertools.req_new / atomic.req_new if atomic.req_new else math.inf
            out.append(Target("atomic: at least 2x fewer store requests than Powertools-style",
                              backend, f"{factor:.2f}x fewer ({powertools.req_new:g} vs "
                              f"{atomic.req_new:g} per new message)", factor >= 2))
    return out


def _num(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.{digits}f}"


def machine() -> str:
    cores = os.cpu_count() or 0
    return f"{platform.system()} {platform.machine()}, {cores} cores, Python {platform.python_version()}"


HEADERS = ("Variant", "Backend", "Req/new msg", "Req/duplicate", "Req/batch first pass",
           "Req/replayed batch", "Extra effects: replay/batch", "Extra effects: concurrent",
           "Throughput vs no-dedup", "p50 vs no-dedup", "p99 vs no-dedup", "Client CPU/msg")


def table_rows(run: BenchmarkRun) -> list[list[str]]:
    out = []
    for row in rows(run):
        out.append([
            row.label, row.backend, _num(row.req_new), _num(row.req_dup), _num(row.req_first_batch),
            _num(row.req_replay_batch), _num(row.replay_extra_effects_per_batch),
            f"{row.concurrent_extra_effects}/{run.sizes.concurrent}",
            f"{row.throughput_ratio:.2f}x", f"{row.p50_ratio:.2f}x", f"{row.p99_ratio:.2f}x",
            f"{row.cpu_ms:.1f} ms",
        ])
    return out


def _baseline_line(run: BenchmarkRun) -> list[str]:
    lines = []
    for row in rows(run):
        if row.name == BASELINE:
            lines.append(f"no-dedup on {row.backend}: {row.throughput:.0f} msg/s on one thread, "
                         f"p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms")
    return lines


def _meta_note(run: BenchmarkRun) -> str:
    parts = [f"{r.name}/{r.backend}: {r.meta_requests}" for r in run.results if r.meta_requests]
    retried = [f"{r.name}/{r.backend}: {r.retried_calls}" for r in run.results if r.retried_calls]
    text = "none during the measured phases" if not parts else "during the measured phases: " + \
        ", ".join(parts)
    if retried:
        text += "; SDK retries: " + ", ".join(retried)
    return text


def markdown(run: BenchmarkRun) -> str:
    s = run.sizes
    lines = [
        f"Benchmark run {run.started_at} on {machine()}; seed {run.seed}; "
        f"{s.messages} new messages, {s.duplicates} duplicates, {s.batches} Event Hubs batches "
        f"of {s.batch_size} events replayed once after a restart, {s.concurrent} messages x "
        f"{s.copies} concurrent copies; Azurite (Table) and the local Cosmos server; "
        f"{run.seconds:.0f} s.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---" for _ in HEADERS) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(run)]
    lines += ["", "Baselines measured in the same run: " + "; ".join(_baseline_line(run)) + ".",
              "", "Notes:", "",
              "- Store requests are data-plane HTTP requests counted in the azure-core pipeline "
              "(exact, per message); SDK management requests are counted apart "
              f"({_meta_note(run)}).",
              "- Ratios are to the no-dedup baseline on the same backend, measured in the same "
              "run, interleaved; latency ratios above 1 are slower. Client CPU is the consumer "
              "process's CPU time per new message (SDK, serialization, TLS).",
              "- Req/duplicate of `atomic + local cache` is a warm cache (same process); a cold "
              "cache costs what `atomic` costs. Replay runs after a simulated host restart "
              "(process-local state dropped), so that row's replay is cold.",
              f"- `atomic + high-water mark` first pass: 1 mark read + {s.batch_size} commits + "
              "1 mark write per batch, plus 1 read on the partition's very first batch.",
              "- Every row except `atomic + high-water mark` handles an Event Hubs batch one "
              "event at a time: its replay column is the replay without a high-water mark.",
              "- Extra effects: messages whose effect was applied more than once, on replay "
              f"(per batch) and when delivered as {s.copies} simultaneous copies.",
              "", "Targets:", ""]
    for target in targets(run):
        mark = "met" if target.met else "**missed**"
        lines.append(f"- {target.text} ({target.backend}): {target.measured}: {mark}")
    return "\n".join(lines) + "\n"


def text_table(run: BenchmarkRun) -> str:
    return aligned(HEADERS, table_rows(run))


def aligned(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: columns padded to their widest cell, a dashed rule under the header."""
    data = [list(headers), *rows]
    widths = [max(len(r[i]) for r in data) for i in range(len(headers))]
    out = []
    for index, row in enumerate(data):
        out.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def to_json(run: BenchmarkRun) -> dict[str, Any]:
    return {
        "started_at": run.started_at, "machine": machine(), "seed": run.seed,
        "seconds": run.seconds, "sizes": asdict(run.sizes),
        "rows": [asdict(r) for r in rows(run)],
        "targets": [asdict(t) for t in targets(run)],
        "raw": [_raw(r) for r in run.results],
    }


def _raw(result: VariantResult) -> dict[str, Any]:
    """A result without latency samples; Counters as plain dicts (asdict mangles them)."""
    fields = {k: v for k, v in vars(result).items()
              if k not in ("new_latency", "dup_latency", "new_cpu")}
    fields["outcomes"] = {phase: dict(c) for phase, c in result.outcomes.items()}
    return fields


def chart(run: BenchmarkRun, path: Path) -> Path | None:
    """A PNG of requests and relative speed per variant; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    data = rows(run)
    names = list(dict.fromkeys(r.name for r in data))
    backends = list(run.backends)
    panels = [
        ("Store requests per new message", lambda r: r.req_new),
        ("Store requests per duplicate", lambda r: r.req_dup),
        (f"Store requests per replayed batch ({run.sizes.batch_size} events)",
         lambda r: r.req_replay_batch),
        ("Throughput vs no-dedup (x)", lambda r: r.throughput_ratio),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    width = 0.8 / max(1, len(backends))
    colors = {"table": "#4C72B0", "cosmos": "#DD8452"}
    for ax, (title, value) in zip(axes.flat, panels, strict=True):
        for b, backend in enumerate(backends):
            xs, ys = [], []
            for i, name in enumerate(names):
                row = next((r for r in data if r.name == name and r.backend == backend), None)
                if row is not None:
                    xs.append(i + (b - (len(backends) - 1) / 2) * width)
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


def write_outputs(run: BenchmarkRun, out_dir: Path, *, with_chart: bool = True) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    md = out_dir / "results.md"
    md.write_text(markdown(run), encoding="utf-8")
    written["markdown"] = md
    js = out_dir / "results.json"
    js.write_text(json.dumps(to_json(run), indent=2, default=str), encoding="utf-8")
    written["json"] = js
    if with_chart:
        png = chart(run, out_dir / "chart.png")
        if png is not None:
            written["chart"] = png
    return written
