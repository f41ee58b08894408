"""The settlement table and the resting places the docs promise are the code's.

docs/concepts.md#one-settlement-rule has one table: a condition per row, what each trigger does.
Every reason code it names is one the library (or the broker) writes. docs/operations.md names
every place a valid message can rest, the command that brings it back and the test that proves
it: the tests exist and the commands are the tool's.
"""

from __future__ import annotations

import re
from pathlib import Path

from replay.__main__ import parse_args

ROOT = Path(__file__).resolve().parents[2]
BROKER_REASONS = {"MaxDeliveryCountExceeded"}  # Service Bus writes it, not the library
_CODE = re.compile(r"`([A-Z][A-Za-z]+)`")
_TEST_FILE = re.compile(r"`(tests/[\w/]+\.py)`")
_COMMAND = re.compile(r"`python -m replay ([^`]+)`")


def section(page: str, title: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def table_rows(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def library_strings() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "shared").rglob("*.py"))


def test_the_settlement_table_has_a_column_per_trigger_and_names_the_codes_reasons():
    text = section("concepts.md", "One settlement rule")
    header = next(line for line in text.splitlines() if line.startswith("|"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "Condition", "Service Bus", "Event Hubs batch", "Storage Queue", "HTTP"]
    rows = table_rows(text)
    assert len(rows) >= 10 and all(len(row) == 5 for row in rows)
    named = reasons(rows)
    assert {"IdempotencyKeyConflict", "StoreRejected", "OutcomeUnknown", "StaleInProgress",
            "UnexpectedError", "MaxDequeueCountReached", "PoisonQueueUnavailable"} <= named
    unknown = unwritten(named, library_strings())
    assert not unknown, f"reasons the docs name that the library never writes: {unknown}"


def reasons(rows: list[list[str]]) -> set[str]:
    """The reason codes the broker columns name (HTTP answers with problem types instead)."""
    return {m for row in rows for cell in row[1:4] for m in _CODE.findall(cell)}


def unwritten(named: set[str], code: str) -> set[str]:
    return {reason for reason in named - BROKER_REASONS if f'"{reason}"' not in code}


def test_counter_proof_a_reason_the_code_never_writes_is_caught():
    rows = [["a claim left behind", "dead-letter `StaleClaim`", "parked", "envelope", "503"]]
    assert unwritten(reasons(rows), library_strings()) == {"StaleClaim"}


def test_every_resting_place_names_a_command_and_a_test_that_exist():
    rows = table_rows(section("operations.md", "Where a message can end up, and how it comes back"))
    places = " ".join(row[0] for row in rows)
    for place in ("dead-letter queue", "parking lot", "poison queue", "stale claim", "outbox"):
        assert place in places, place
    for where, _how_it_got_there, back, proved in rows:
        tests = _TEST_FILE.findall(proved)
        assert tests, f"{where}: no test named"
        for name in tests:
            path = ROOT / name
            assert path.is_file() and "def test_" in path.read_text(), name
        commands = _COMMAND.findall(back)
        assert commands or "sweep" in back, f"{where}: no way back named"
        for command in commands:
            argv = [word for word in command.split() if not word.startswith("<")
                    and not word.startswith("(")]
            parse_args(argv)  # an option the tool does not have exits with usage
