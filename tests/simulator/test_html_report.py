"""The demo's HTML report: written beside the text report by a real (tiny) demo run, well-formed,
every chart drawn from the run's own numbers and non-empty, and rendered by headless Chromium.

Chromium comes from Debian's `chromium` package; the fixture installs it when /usr/bin/chromium is
missing (apt-get), so only a run of these tests pays for it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from simulator.html_report import render

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")
# The smallest demo that still shows every kind of chart: one backend, in this process.
TINY_DEMO = ("--messages", "80", "--events", "80", "--backend", "table", "--serial", "--no-progress")
REQUIRED_CHARTS = ("Deliveries and duplicates by cause over virtual time", "Faults injected, by kind",
                   "Duplicate deliveries, by cause", "Outcomes per consumer",
                   "Latency distribution: service bus message", "Latency distribution: event hubs event")
VOID = {"meta", "br", "hr", "img", "input", "link", "line", "rect", "polyline", "path", "circle"}


class _Page(HTMLParser):
    """Checks tag balance and collects the charts (caption, data-total, marks) and invariant rows."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.charts: list[dict[str, Any]] = []
        self.rows: list[list[str]] = []
        self.hops: dict[str, dict[str, int]] = {}  # the outbox hops table: hop -> figures
        self._table_classes: list[str] = []
        self._in_caption = False
        self._row: list[str] | None = None
        self._cell = False
        self.doctype = False

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl.lower() == "doctype html"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "figure" and values.get("class") == "chart":
            self.charts.append({"total": float(values["data-total"] or 0), "caption": "", "marks": 0})
        if tag in ("rect", "polyline") and self.charts and self.stack.count("figure"):
            value = values.get("data-value")
            if tag == "polyline" or (value is not None and float(value) > 0):
                self.charts[-1]["marks"] += 1
        if tag == "figcaption":
            self._in_caption = True
        if tag == "table":
            self._table_classes.append(values.get("class") or "")
        if tag == "tr" and self._tables() == "invariants":
            self._row = []
        if tag == "tr" and self._tables() == "hops" and values.get("data-hop"):
            self.hops[str(values["data-hop"])] = {}
        if tag == "td" and self._tables() == "hops" and self.hops:
            for name, value in values.items():
                if name.startswith("data-") and value is not None:
                    self.hops[next(reversed(self.hops))][name[5:]] = int(value)
        if tag == "td":
            self._cell = True
            if self._row is not None:
                self._row.append("")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "table":
            self._table_classes.pop()
        if tag == "figcaption":
            self._in_caption = False
        if tag == "td":
            self._cell = False
        if tag == "tr" and self._row is not None:
            if self._row:
                self.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._in_caption:
            self.charts[-1]["caption"] += data
        if self._cell and self._row is not None:
            self._row[-1] += data

    def _tables(self) -> str:
        """The class of the innermost table open here ("" outside tables)."""
        return self._table_classes[-1] if self._table_classes else ""


def parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("demo")
    done = subprocess.run([sys.executable, "-m", "demo", *TINY_DEMO, "--report-dir", str(out),
                           "--json", str(out / "numbers.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"dir": out, "stdout": done.stdout,
            "numbers": json.loads((out / "numbers.json").read_text())["backends"]["table"]}


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's Chromium, installed on first use (the test command's own install step)."""
    if not CHROMIUM.exists():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "-o", "DPkg::Lock::Timeout=600", "update"],
                        ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "chromium"]):
            subprocess.run(command, check=True, env=env, capture_output=True, timeout=1200)
    assert CHROMIUM.exists()
    return CHROMIUM


def chromium_run(chromium: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=180, check=False)


def test_demo_writes_the_html_report_beside_the_text_report_and_prints_its_path(demo_run):
    out = demo_run["dir"]
    text, page = out / "demo-report.txt", out / "demo-report.html"
    assert text.exists() and page.exists()
    last = demo_run["stdout"].strip().splitlines()[-1]
    assert last == f"Reports: {text} and {page}", last
    assert "RESULT: all invariants hold" in text.read_text()


def test_the_report_is_well_formed_and_every_chart_has_data(demo_run):
    page = parse((demo_run["dir"] / "demo-report.html").read_text())
    assert page.doctype and not page.errors and not page.stack, (page.errors, page.stack)
    captions = [chart["caption"] for chart in page.charts]
    for required in REQUIRED_CHARTS:
        assert any(caption.startswith(required) for caption in captions), (required, captions)
    for chart in page.charts:
        assert chart["total"] > 0 and chart["marks"] > 0, f"empty chart: {chart}"


def test_the_charts_show_the_runs_own_numbers(demo_run):
    numbers = demo_run["numbers"]
    page = parse((demo_run["dir"] / "demo-report.html").read_text())
    totals = {chart["caption"]: chart["total"] for chart in page.charts}
    timeline = numbers["timeline"]
    assert sum(timeline["deliveries"]) == numbers["deliveriesTotal"]
    assert totals["Deliveries and duplicates by cause over virtual time"] == \
        numbers["deliveriesTotal"] + sum(numbers["duplicatesByCause"].values())
    assert totals["Faults injected, by kind"] == sum(numbers["faultsInjected"].values()) > 0
    assert totals["Duplicate deliveries, by cause"] == sum(numbers["duplicatesByCause"].values()) > 0
    outcomes = sum(sum(v.values()) for v in numbers["outcomesByFunction"].values())
    assert totals["Outcomes per consumer (function)"] == outcomes == numbers["deliveriesTotal"]
    rows = [(row[0], row[1]) for row in page.rows]
    assert rows == [("PASS" if inv["ok"] else "FAIL", inv["name"]) for inv in numbers["invariants"]]
    # Both outbox hops, with the run's own figures: each committed message effected downstream.
    assert page.hops == numbers["hops"]
    assert set(page.hops) == {"orders -> notify/audit", "payments -> balance_projection"}
    assert all(hop["effected"] > 0 for hop in page.hops.values()), page.hops


def test_chromium_renders_the_report_headless(demo_run, chromium, tmp_path):
    page = demo_run["dir"] / "demo-report.html"
    shot = tmp_path / "demo-report.png"
    done = chromium_run(chromium, tmp_path / "profile", "--hide-scrollbars", "--window-size=1300,1700",
                        f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[0] == 1700 and pixels.shape[1] == 1300
    ink = (pixels[..., :3].mean(axis=2) < 0.9).mean()
    assert ink > 0.02, f"the screenshot is almost blank ({ink:.3%} non-white)"
    dom = chromium_run(chromium, tmp_path / "profile-dom", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    figures = len(re.findall(r'<figure class="chart"', dom.stdout))
    assert figures == len(parse(page.read_text()).charts) >= len(REQUIRED_CHARTS)
    if os.environ.get("DEMO_REPORT_PNG"):  # keep a copy for a write-up
        shutil.copy(shot, os.environ["DEMO_REPORT_PNG"])


def _summary(**overrides: Any) -> dict[str, Any]:
    base = {"backend": "cosmos", "seed": 1, "messagesSent": 3, "eventsSent": 2, "doubleEffects": 0,
            "lost": 0, "validNotEffected": 0, "duplicatesAbsorbed": 1, "deliveriesTotal": 6,
            "virtualSeconds": 90.0, "runSeconds": 1.0, "faultsInjected": {"transient": 2},
            "duplicatesByCause": {"redelivery": 1, "producer retry": 0},
            "outcomesByFunction": {"orders": {"complete": 4}, "payments": {"ok": 2}},
            "latencyHistogramMs": {"service bus message": {"edges": [1.0, 10.0, 100.0], "counts": [3, 1]}},
            "timeline": {"binSeconds": 30.0, "startSeconds": 0.0, "deliveries": [4, 2, 0],
                         "duplicates": {"redelivery": [0, 1, 0]}, "faults": {"transient": [2, 0, 0]}},
            "invariants": [{"name": "exactly one effect", "ok": True, "detail": ""},
                           {"name": "nothing lost", "ok": False, "detail": "1 lost"}]}
    return {**base, **overrides}


def test_a_broken_invariant_shows_as_fail():
    page = render({"cosmos": _summary()})
    parsed = parse(page)
    assert [row[0] for row in parsed.rows] == ["PASS", "FAIL"]
    assert "RESULT: INVARIANT BROKEN" in page and 'class="fail"' in page


def test_counter_proof_an_empty_series_is_seen_as_an_empty_chart():
    """The "every chart has data" check above can fail: a run without faults draws a zero total."""
    page = parse(render({"cosmos": _summary(faultsInjected={})}))
    faults = next(c for c in page.charts if c["caption"] == "Faults injected, by kind")
    assert faults["total"] == 0 and faults["marks"] == 0


def test_each_outbox_hop_is_a_row_and_a_broken_one_shows_as_fail():
    hops = {"orders -> notify/audit": {"double": 0, "lost": 0, "phantom": 0, "pending": 0,
                                       "effected": 4},
            "payments -> balance_projection": {"double": 0, "lost": 1, "phantom": 0, "pending": 0,
                                               "effected": 3}}
    page = render({"cosmos": _summary(hops=hops, viewMismatches=1)})
    assert parse(page).hops == hops
    assert '<tr class="pass" data-hop="orders -&gt; notify/audit">' in page
    assert '<tr class="fail" data-hop="payments -&gt; balance_projection">' in page
    assert "Balance views differing from their balance document: 1" in page
