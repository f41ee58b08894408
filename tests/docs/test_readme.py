"""The README is an index a newcomer reads in minutes, and dated figures live in one file.

It opens with the two commands (CI runs `./dev test` through .ci/run), stays within about 250
lines, links every page of the docs, and every link it holds resolves. No Markdown file of the
repository but benchmarks/RESULTS.md states a figure with a date: the docs state rules and link it.
GitHub renders the README and cannot include files, so its quick starts quote the example apps CI
runs (tests/examples), verbatim.
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
_EXAMPLE_LINK = re.compile(r"\]\((examples/[^)\s#]+\.py)\)")
_PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
ELISION = "# ..."  # where a quote leaves lines of its example out


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
    generated = ROOT / "benchmarks" / "out"  # `./dev bench` writes its dated run there (ignored)
    return sorted(p for p in ROOT.rglob("*.md") if not skip & set(p.relative_to(ROOT).parts)
                  and not any(part.startswith(".venv") for part in p.relative_to(ROOT).parts)
                  and not p.is_relative_to(generated))


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


def misquoted(quote: str, source: str) -> list[str]:
    """The lines of `quote` that are not its source's, verbatim and in order: each run of lines
    between `# ...` markers must be consecutive lines of the source (blank lines aside), each run
    after the one before it. Empty when the quote is faithful."""
    lines = [line for line in source.splitlines() if line.strip()]
    runs: list[list[str]] = [[]]
    for line in quote.splitlines():
        if line.strip() == ELISION:
            runs.append([])
        elif line.strip():
            runs[-1].append(line)
    wrong: list[str] = []
    position = 0
    for run in filter(None, runs):
        starts = [i for i in range(position, len(lines) - len(run) + 1)
                  if lines[i:i + len(run)] == run]
        if starts:
            position = starts[0] + len(run)
        else:
            wrong += [line for line in run if line not in lines] or run
    return wrong


def test_the_readmes_quick_starts_quote_the_example_apps_verbatim():
    text = README.read_text()
    blocks = list(_PYTHON.finditer(text))
    assert len(blocks) >= 3, "the README has lost its quick starts"
    for block in blocks:
        section = text[text.rfind("\n#", 0, block.start()):block.start()]
        linked = _EXAMPLE_LINK.findall(section)
        assert linked, f"a README quick start links no example file before it:\n{block.group(1)[:200]}"
        wrong = misquoted(block.group(1), (ROOT / linked[-1]).read_text())
        assert not wrong, f"README.md quotes {linked[-1]} wrongly (fix the quote): {wrong}"


def test_counter_proof_a_quick_start_that_drifted_from_its_example_is_caught():
    """The README's Service Bus quick start before the examples existed, against the example."""
    example = (ROOT / "examples" / "servicebus_orders" / "function_app.py").read_text()
    old = ("def save_order(tx, order):  # runs inside the transaction that creates the marker\n"
           "    tx.create(order[\"orderId\"], order)\n")
    assert misquoted(old, example) == old.splitlines()
    faithful = "\n".join(example.splitlines()[28:32])
    assert misquoted(faithful, example) == []
    swapped = "\n".join([*example.splitlines()[30:32], ELISION, *example.splitlines()[28:30]])
    assert misquoted(swapped, example), "runs out of order must be caught"


def test_the_front_door_the_docs_list_is_the_librarys():
    """docs/library.md's front-door table names exactly `shared.__all__`."""
    import shared

    page = (ROOT / "docs" / "library.md").read_text("utf-8")
    table = page[page.index("## The front door"):page.index("## The dedup flow without a trigger")]
    rows = [line.split("|")[2] for line in table.splitlines() if line.startswith("| ")][1:]
    named = {name for row in rows for name in re.findall(r"`(\w+)`", row) if "." not in name}
    assert named == set(shared.__all__), (sorted(named ^ set(shared.__all__)))
    assert len(shared.__all__) <= 60  # everything an app imports (the sample's included)
