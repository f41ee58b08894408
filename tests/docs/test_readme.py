"""The README is an index a newcomer reads in minutes, and dated figures live in one file.

It opens with the two commands (CI runs `./dev test` through .ci/run), stays within about 250
lines, links every page of the docs, and every link it holds resolves. No Markdown file of the
repository but benchmarks/RESULTS.md states a figure with a date: the docs state rules and link it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_an_index_of_at_most_about_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_the_readme_opens_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block and text.index("```bash") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["./dev demo", "./dev test"], commands
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()


def test_every_docs_page_is_linked_from_the_readme_and_every_link_resolves():
    text = README.read_text()
    targets = [t for t in _LINK.findall(text) if not re.match(r"^[a-z]+:", t)]
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README links to nothing: {missing}"
    linked = {t.split("#")[0] for t in targets}
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def markdown_files() -> list[Path]:
    """The repository's Markdown, less installed and generated folders."""
    skip = {"node_modules", ".venv", ".venv-infra", ".cache", ".git", "demo-out"}
    return sorted(p for p in ROOT.rglob("*.md") if not skip & set(p.relative_to(ROOT).parts)
                  and not any(part.startswith(".venv") for part in p.relative_to(ROOT).parts))


def test_no_dated_figure_outside_the_results_file():
    results = ROOT / "benchmarks" / "RESULTS.md"
    files = markdown_files()
    assert README in files and results in files
    for path in files:
        if path == results:
            continue
        dated = [line for line in path.read_text().splitlines() if _DATE.search(line)]
        assert not dated, f"{path.relative_to(ROOT)} states dated figures (move them to " \
                          f"benchmarks/RESULTS.md): {dated[:3]}"


def test_counter_proof_a_dated_figure_is_seen():
    assert _DATE.search("808 s wall (2026-12-03 21:15 UTC, commit 581b38e)")


def test_the_python_the_docs_show_parses():
    """What the pages show inline (until it is included from files CI runs) is Python at least."""
    for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"^```python\n(.*?)^```", path.read_text(), re.S | re.M):
            try:
                ast.parse(block)
            except SyntaxError as error:
                raise AssertionError(f"{path.relative_to(ROOT)}: {error}\n{block}") from error
