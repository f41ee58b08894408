"""The demo's HTML report: the text report's numbers as charts (inline SVG, no scripts, no network).

One self-contained page per run, one section per backend: deliveries and duplicates by cause over
virtual time, faults injected (over time and by kind), outcomes per consumer, latency
distributions, each outbox hop's figures (effected, double, lost, phantom, pending), and the
invariants with PASS/FAIL. Built from `simulator.report.summary` dicts, so
the page shows exactly what the text report and `--json` say. The SVG is drawn by the small helpers
below: every chart is a `<figure class="chart">` carrying `data-total` (the sum of what it plots),
which the tests read to prove no chart is empty.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
WIDTH, HEIGHT = 640, 260
MARGIN = {"left": 56, "right": 16, "top": 16, "bottom": 40}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or float(value).is_integer() else f"{value:.3g}"


def _figure(kind: str, title: str, svg: str, total: float, legend: Sequence[tuple[str, str]] = ()) -> str:
    keys = "".join(f'<span class="key"><i style="background:{color}"></i>{_e(label)}</span>'
                   for label, color in legend)
    return (f'<figure class="chart" data-chart="{_e(kind)}" data-total="{total:g}">'
            f"<figcaption>{_e(title)}</figcaption>{svg}"
            + (f'<div class="legend">{keys}</div>' if keys else "") + "</figure>")


def _axes(y_max: float, x_labels: Sequence[tuple[float, str]], y_label: str) -> list[str]:
    left, top = MARGIN["left"], MARGIN["top"]
    bottom, right = HEIGHT - MARGIN["bottom"], WIDTH - MARGIN["right"]
    parts = [f'<line class="axis" x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}"/>',
             f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>']
    for i in range(5):
        value = y_max * i / 4
        y = bottom - (bottom - top) * i / 4
        parts.append(f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                     f"{_number(value)}</text>")
        if i:
            parts.append(f'<line class="gridline" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
    for x, label in x_labels:
        parts.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                     f"{_e(label)}</text>")
    parts.append(f'<text class="label" x="12" y="{top + (bottom - top) / 2:.0f}" '
                 f'transform="rotate(-90 12 {top + (bottom - top) / 2:.0f})" text-anchor="middle">'
                 f"{_e(y_label)}</text>")
    return parts


def line_chart(title: str, series: Mapping[str, Sequence[float]], *, x_step: float, x_unit: str,
               y_label: str) -> str:
    """Series over equal slices of the x axis (one polyline each)."""
    lengths = {len(values) for values in series.values()} or {0}
    n = max(lengths)
    y_max = max([max(values, default=0) for values in series.values()] + [1])
    left, top = MARGIN["left"], MARGIN["top"]
    plot_w = WIDTH - MARGIN["left"] - MARGIN["right"]
    plot_h = HEIGHT - MARGIN["top"] - MARGIN["bottom"]

    def x_of(i: float) -> float:
        return left + plot_w * (i + 0.5) / max(n, 1)

    ticks = [(x_of(i), f"{(i + 0.5) * x_step:.0f}{x_unit}") for i in range(0, n, max(1, n // 6))]
    parts = _axes(y_max, ticks, y_label)
    legend = []
    for index, (name, values) in enumerate(series.items()):
        color = PALETTE[index % len(PALETTE)]
        points = " ".join(f"{x_of(i):.1f},{top + plot_h * (1 - v / y_max):.1f}" for i, v in enumerate(values))
        parts.append(f'<polyline class="series" data-series="{_e(name)}" fill="none" stroke="{color}" '
                     f'stroke-width="2" points="{points}"/>')
        legend.append((name, color))
    svg = f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img">{"".join(parts)}</svg>'
    return _figure("line", title, svg, sum(sum(v) for v in series.values()), legend)


def bar_chart(title: str, bars: Sequence[tuple[str, float]], *, unit: str = "") -> str:
    """Horizontal bars, one per label, largest first."""
    bars = sorted(bars, key=lambda bar: -bar[1])
    row, label_w = 22, 330
    height = max(1, len(bars)) * row + 12
    v_max = max([value for _, value in bars] + [1])
    parts = []
    for i, (label, value) in enumerate(bars):
        y = 6 + i * row
        w = (WIDTH - label_w - 90) * value / v_max
        parts.append(f'<text class="tick" x="{label_w - 8}" y="{y + 15}" text-anchor="end">{_e(label)}</text>'
                     f'<rect class="bar" data-value="{value:g}" x="{label_w}" y="{y + 3}" width="{w:.1f}" '
                     f'height="{row - 6}" fill="{PALETTE[0]}"/>'
                     f'<text class="tick" x="{label_w + w + 6:.1f}" y="{y + 15}">'
                     f"{_number(value)}{unit}</text>")
    if not bars:
        parts.append('<text class="tick" x="12" y="20">(none)</text>')
    svg = f'<svg viewBox="0 0 {WIDTH} {height}" role="img">{"".join(parts)}</svg>'
    return _figure("bar", title, svg, sum(value for _, value in bars))


def stacked_bars(title: str, rows: Mapping[str, Mapping[str, float]]) -> str:
    """One horizontal bar per row, split by category (e.g. outcomes per consumer)."""
    categories = sorted({c for parts in rows.values() for c in parts},
                        key=lambda c: -sum(parts.get(c, 0) for parts in rows.values()))
    colors = {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(categories)}
    row, label_w = 26, 130
    height = max(1, len(rows)) * row + 12
    v_max = max([sum(parts.values()) for parts in rows.values()] + [1])
    parts_svg = []
    for i, (name, parts) in enumerate(sorted(rows.items())):
        y = 6 + i * row
        x = float(label_w)
        parts_svg.append(f'<text class="tick" x="{label_w - 8}" y="{y + 17}" text-anchor="end">'
                         f"{_e(name)}</text>")
        for category in categories:
            value = parts.get(category, 0)
            if not value:
                continue
            w = (WIDTH - label_w - 70) * value / v_max
            parts_svg.append(f'<rect class="bar" data-value="{value:g}" x="{x:.1f}" y="{y + 3}" '
                             f'width="{w:.1f}" height="{row - 6}" fill="{colors[category]}">'
                             f"<title>{_e(name)}: {_e(category)} {_number(value)}</title></rect>")
            x += w
        parts_svg.append(f'<text class="tick" x="{x + 6:.1f}" y="{y + 17}">'
                         f"{_number(sum(parts.values()))}</text>")
    svg = f'<svg viewBox="0 0 {WIDTH} {height}" role="img">{"".join(parts_svg)}</svg>'
    total = sum(sum(parts.values()) for parts in rows.values())
    return _figure("stacked", title, svg, total, [(c, colors[c]) for c in categories])


def _duration(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def histogram(title: str, edges: Sequence[float], counts: Sequence[int]) -> str:
    """Vertical bars over (log-spaced) bins of milliseconds; the x ticks are bin edges."""
    n = len(counts)
    y_max = max([*counts, 1])
    left, top = MARGIN["left"], MARGIN["top"]
    plot_w = WIDTH - MARGIN["left"] - MARGIN["right"]
    plot_h = HEIGHT - MARGIN["top"] - MARGIN["bottom"]
    ticks = [(left + plot_w * i / max(n, 1), _duration(edges[i]))
             for i in range(0, n + 1, max(1, n // 6))]
    parts = _axes(y_max, ticks, "count")
    for i, count in enumerate(counts):
        h = plot_h * count / y_max
        parts.append(f'<rect class="bar" data-value="{count}" x="{left + plot_w * i / n + 1:.1f}" '
                     f'y="{top + plot_h - h:.1f}" width="{max(plot_w / n - 2, 1):.1f}" height="{h:.1f}" '
                     f'fill="{PALETTE[0]}"/>')
    svg = f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img">{"".join(parts)}</svg>'
    return _figure("histogram", title, svg, float(sum(counts)))


def _invariants(rows: Sequence[Mapping[str, Any]]) -> str:
    body = "".join(
        f'<tr class="{"pass" if row["ok"] else "fail"}"><td>{"PASS" if row["ok"] else "FAIL"}</td>'
        f"<td>{_e(row['name'])}</td><td>{_e(row.get('detail') or '')}</td></tr>" for row in rows)
    return (f'<table class="invariants" data-total="{len(rows)}"><thead><tr><th>Result</th>'
            f"<th>Invariant (checked from the stores)</th><th>Detail</th></tr></thead>"
            f"<tbody>{body}</tbody></table>")


def _hops(hops: Mapping[str, Mapping[str, int]], view_mismatches: int) -> str:
    """Each outbox hop's figures (double, lost, phantom, pending, effected) as a table."""
    columns = ("effected", "double", "lost", "phantom", "pending")
    body = "".join(
        f'<tr class="{"pass" if not any(h[c] for c in columns[1:]) else "fail"}" '
        f'data-hop="{_e(hop)}"><td>{_e(hop)}</td>'
        + "".join(f'<td data-{c}="{h[c]}">{h[c]:,}</td>' for c in columns) + "</tr>"
        for hop, h in hops.items())
    total = sum(h[c] for h in hops.values() for c in columns)
    return (f'<table class="hops" data-total="{total}"><thead><tr><th>Outbox hop</th>'
            + "".join(f"<th>{c}</th>" for c in columns) + f"</tr></thead><tbody>{body}</tbody>"
            f"</table><p>Balance views differing from their balance document: "
            f"{view_mismatches:,}</p>")


def backend_section(s: Mapping[str, Any], text_report: str = "") -> str:
    """Charts and invariants of one backend's run."""
    timeline = s["timeline"]
    width = timeline["binSeconds"]
    unit, scale = ("min", 60.0) if width * len(timeline["deliveries"]) > 600 else ("s", 1.0)
    charts = [
        line_chart("Deliveries and duplicates by cause over virtual time",
                   {"deliveries": timeline["deliveries"],
                    **{f"duplicate: {c}": v for c, v in timeline["duplicates"].items() if any(v)}},
                   x_step=width / scale, x_unit=unit, y_label=f"per {width / scale:.2g} {unit}"),
    ]
    if any(any(v) for v in timeline["faults"].values()):
        charts.append(line_chart("Faults injected over virtual time", timeline["faults"],
                                 x_step=width / scale, x_unit=unit,
                                 y_label=f"per {width / scale:.2g} {unit}"))
    charts.append(bar_chart("Faults injected, by kind", list(s["faultsInjected"].items())))
    charts.append(bar_chart("Duplicate deliveries, by cause", list(s["duplicatesByCause"].items())))
    charts.append(stacked_bars("Outcomes per consumer (function)", s["outcomesByFunction"]))
    for kind, hist in sorted(s["latencyHistogramMs"].items()):
        charts.append(histogram(f"Latency distribution: {kind}", hist["edges"], hist["counts"]))
    ok = all(row["ok"] for row in s["invariants"])
    kpis = (f'<p class="kpis"><b class="{"pass" if ok else "fail"}">{"PASS" if ok else "FAIL"}</b> '
            f"double effects {s['doubleEffects']:,} · lost {s['lost']:,} · phantom "
            f"{s.get('phantoms', 0):,} · pending {s.get('outboxPending', 0):,} · valid not effected "
            f"{s['validNotEffected']:,} · duplicates absorbed {s['duplicatesAbsorbed']:,} · "
            f"deliveries {s['deliveriesTotal']:,} · {s['virtualSeconds'] / 60:.1f} min virtual, "
            f"{s['runSeconds']:.1f} s wall</p>")
    details = (f"<details><summary>Text report</summary><pre>{_e(text_report)}</pre></details>"
               if text_report else "")
    return (f'<section class="backend" data-backend="{_e(s["backend"])}"><h2>{_e(s["backend"])} backend '
            f"(seed {s['seed']}, {s['messagesSent']:,} messages, {s['eventsSent']:,} events)</h2>"
            f'{kpis}<div class="charts">{"".join(charts)}</div><h3>Outbox hops</h3>'
            f"{_hops(s.get('hops', {}), s.get('viewMismatches', 0))}<h3>Invariants</h3>"
            f"{_invariants(s['invariants'])}{details}</section>")


CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px}h3{font-size:15px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:8px}
figcaption{font-weight:600;margin-bottom:4px}svg{width:100%;height:auto}
.axis{stroke:#444}.gridline{stroke:#eee}.tick{font-size:11px;fill:#444}.label{font-size:11px;fill:#444}
.legend{font-size:12px}.key{margin-right:12px;white-space:nowrap}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:4px 8px;text-align:left}
tr.pass td:first-child,b.pass{color:#137333}tr.fail td:first-child,b.fail{color:#b3261e}
pre{font-size:12px;overflow:auto;background:#f7f7f7;padding:8px}
"""


def render(summaries: Mapping[str, Mapping[str, Any]], *, title: str = "Idempotent consumers: demo report",
           subtitle: str = "", text_reports: Mapping[str, str] | None = None) -> str:
    """The whole page for one run (one section per backend)."""
    text_reports = text_reports or {}
    ok = all(all(row["ok"] for row in s["invariants"]) for s in summaries.values() if s)
    sections = "".join(backend_section(s, text_reports.get(name, "")) for name, s in summaries.items() if s)
    verdict = "all invariants hold" if ok else "INVARIANT BROKEN"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>'
            f'<body><h1>{_e(title)}</h1><p>{_e(subtitle)}</p>'
            f'<p class="verdict"><b class="{"pass" if ok else "fail"}">RESULT: {verdict}</b></p>'
            f"{sections}</body></html>\n")
