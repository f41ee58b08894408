"""The docs site: it builds in strict mode, and a reader's browser draws every sequence diagram.

The site is built once (into a temporary folder) by the real MkDocs with the project's mkdocs.yml;
Debian's Chromium loads each page that holds a diagram from a loopback server and the DevTools
protocol reads the SVG Material draws into each diagram's closed shadow root. The site serves its own
Mermaid (tools/mkdocs_hooks.py), so nothing is fetched from outside: the counter-proof takes that
copy away and sees no diagram drawn.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.browser import chromium_session, mermaid_diagrams, serve
from tests.simulator.test_html_report import chromium  # noqa: F401 (the fixture: installs Chromium)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The four sequence diagrams the docs must show (issue 26), by the `%% diagram:` line each carries.
REQUIRED = {"atomic-path", "two-phase-path", "event-hubs-batch", "outbox-dispatch"}
_FENCE = re.compile(r"^```mermaid\n(.*?)^```", re.S | re.M)


def build(site: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def diagrams_by_page() -> dict[str, list[str]]:
    """Each page's Mermaid sources, in page order."""
    found = {}
    for page in sorted(DOCS.rglob("*.md")):
        sources = _FENCE.findall(page.read_text())
        if sources:
            found[page.relative_to(DOCS).as_posix()] = sources
    return found


def page_url(base: str, page: str) -> str:
    """The URL MkDocs gives a page (use_directory_urls: `x.md` is `x/`, `index.md` is the root)."""
    stem = page.removesuffix(".md")
    return base if stem == "index" else f"{base}{stem.removesuffix('/index')}/"


def labels(source: str) -> list[str]:
    """The participants' display names a sequence diagram declares."""
    return re.findall(r"^\s*participant \S+ as (.+?)\s*$", source, re.M)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_the_four_sequence_diagrams_are_in_the_docs():
    tags = {m for sources in diagrams_by_page().values() for s in sources
            for m in re.findall(r"%% diagram: (\S+)", s)}
    assert tags >= REQUIRED, f"missing diagrams: {sorted(REQUIRED - tags)}"


def test_the_site_serves_its_own_mermaid_and_no_page_loads_one_from_outside(site):
    assert (site / "assets/javascripts/mermaid.min.js").stat().st_size > 1_000_000
    for page in site.rglob("*.html"):
        scripts = re.findall(r'<script[^>]+src="([^"]+)"', page.read_text())
        outside = [s for s in scripts if re.match(r"^(https?:)?//", s)]
        assert not outside, f"{page.relative_to(site)} loads {outside}"


def test_every_diagram_renders_to_svg_in_chromium(site, chromium, tmp_path):  # noqa: F811
    pages = diagrams_by_page()
    assert pages
    with serve(site) as base, chromium_session(chromium, tmp_path / "profile") as port:
        for page, sources in pages.items():
            drawn = mermaid_diagrams(port, page_url(base, page), expected=len(sources))
            assert len(drawn) == len(sources), f"{page}: {len(drawn)} diagram hosts, {len(sources)} sources"
            for source, diagram in zip(sources, drawn, strict=True):
                assert diagram.svg.startswith("<svg"), f"{page}: a diagram did not render\n{source[:200]}"
                if source.lstrip().startswith("sequenceDiagram"):
                    assert 'aria-roledescription="sequence"' in diagram.svg, page
                    for label in labels(source):
                        assert _text(label) in _text(diagram.svg), f"{page}: {label!r} not drawn"


def test_counter_proof_without_the_sites_mermaid_nothing_is_drawn(site, chromium, tmp_path):  # noqa: F811
    """The check above can fail: with the local copy emptied, Material falls back to a CDN this
    machine cannot reach, and the diagram stays source text."""
    stripped = tmp_path / "site"
    shutil.copytree(site, stripped)
    (stripped / "assets/javascripts/mermaid.min.js").write_text("/* removed */\n")
    with serve(stripped) as base, chromium_session(chromium, tmp_path / "profile") as port:
        drawn = mermaid_diagrams(port, page_url(base, "concepts.md"), expected=2, timeout=15)
    assert drawn and not any(d.svg for d in drawn), [d.svg[:80] for d in drawn]


def test_counter_proof_a_broken_link_fails_the_strict_build(tmp_path):
    """Strict mode is what makes the build a check: a link to a repository file that does not
    exist (through the hook) and an anchor that does not exist each fail it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](/benchmarks/NO-SUCH-FILE.md) and "
                                   "[no anchor](other.md#nowhere)\n")
    (docs / "other.md").write_text("# Other\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = config[:config.index("\nnav:")] + "\nnav:\n  - Home: index.md\n  - Other: other.md\n"
    config = config.replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("tools/mkdocs_hooks.py", str(ROOT / "tools/mkdocs_hooks.py"))
    (tmp_path / "mkdocs.yml").write_text(config)
    done = build(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert done.returncode != 0
    assert "NO-SUCH-FILE.md, which is not a file of the repository" in done.stderr
    assert "does not contain an anchor '#nowhere'" in done.stderr


def _text(markup: str) -> str:
    """Text as the SVG holds it (entities for &, <, >, quotes), whitespace squeezed."""
    markup = markup.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
    return re.sub(r"\s+", " ", markup)
