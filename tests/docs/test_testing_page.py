"""docs/testing.md: its example is the file CI runs, quoted verbatim; the stand-ins its table
names are the ones `shared.testing` exports; and that file is one pytest collects."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import shared.testing
from tests.docs.test_readme import misquoted

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
EXAMPLE = ROOT / "examples" / "testing" / "test_orders_consumer.py"


def _quote() -> str:
    """The page's Python blocks, each quoting the example."""
    quotes = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    assert quotes
    return "# ...\n".join(quotes)  # each block a run of its own


def test_the_page_quotes_the_example_verbatim():
    assert misquoted(_quote(), EXAMPLE.read_text()) == []


def test_counter_proof_a_changed_line_is_named():
    changed = _quote().replace('== "IdempotencyKeyConflict"', '== "KeyReused"')
    assert misquoted(changed, EXAMPLE.read_text()) == [
        '    assert actions.settled[-1].reason == "KeyReused"']


def test_the_table_names_what_shared_testing_exports():
    named = set(re.findall(r"^\| `(\w+)`(?: \(`(\w+)`\))? \|", PAGE.read_text(), re.M))
    names = {name for pair in named for name in pair if name}
    assert names == set(shared.testing.__all__) - {"Settlement"}


def test_the_example_is_collected_with_the_suite():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "examples/testing" in config["tool"]["pytest"]["ini_options"]["testpaths"]
