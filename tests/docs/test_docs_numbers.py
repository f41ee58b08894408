"""The numbers the docs state are the code's: each fact below finds every place a page (or the
README) states a number with its pattern and compares it with the constant the code runs with, so
a change to either side without the other fails here.

A fact must be found at least once (a rewording that loses it fails too, naming the pattern).
Pages are read with their line breaks squeezed to spaces, so a sentence may wrap anywhere.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def read(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text())


def number(text: str) -> float:
    return float(text.replace(",", ""))


def code(module: str, name: str) -> Any:
    """A constant of the code, named the way a reader finds it."""
    return getattr(importlib.import_module(module), name)


def default(module: str, callable_name: str, parameter: str) -> Any:
    """The default of a keyword the code's constructor or function declares."""
    target = getattr(importlib.import_module(module), callable_name)
    return inspect.signature(target).parameters[parameter].default


def settings_default(field: str) -> Any:
    """What the sample app's settings give `field` when the environment leaves it unset."""
    from functions.settings import Settings

    env = {"TABLE_CONNECTION_STRING": "UseDevelopmentStorage=true", "COSMOS_ENDPOINT": "https://x/",
           "NOTIFICATION_API_URL": "https://notify.example.com/api"}
    return getattr(Settings.from_env(env), field)


def host(path: str) -> Any:
    node: Any = json.loads((ROOT / "host.json").read_text())
    for part in path.split("."):
        node = node[part]
    return node


def minutes(hms: str) -> float:
    hours, mins, secs = (int(part) for part in hms.split(":"))
    return hours * 60 + mins + secs / 60


@dataclass(frozen=True)
class Fact:
    """Every match of `pattern` (its groups, as numbers) must equal `expected()`."""

    name: str
    pattern: str
    expected: Callable[[], tuple[float, ...]]


def _budget() -> Any:
    from functions.services import RETRY_BUDGET

    return RETRY_BUDGET


FACTS = [
    # Event Hubs batch and the retry budget
    Fact("Retry-After cap", r"Retry-After`? (?:of at most|up to) \**(\d+) s",
         lambda: (code("shared._flows.batch", "MAX_RETRY_AFTER_SECONDS"),)),
    Fact("SDK retries", r"at most \*\*(\d+)\*\* times, \*\*(\d+) s\*\* apart",
         lambda: (_budget().sdk_retries, _budget().sdk_wait)),
    Fact("one request's wait in the SDK", r"One request waits at most \*\*(\d+) s\*\* inside the SDK",
         lambda: (_budget().request_seconds,)),
    Fact("the batch's throttling bound",
         r"\*\*A x \((\d+) s \+ (\d+) s\) = (\d+) s\*\* of waiting \(A = (\d+)\)",
         lambda: (_budget().request_seconds, code("shared._flows.batch", "MAX_RETRY_AFTER_SECONDS"),
                  _budget().unit_seconds(attempts=settings_default("payments_max_attempts"),
                                         max_retry_after=code("shared._flows.batch",
                                                              "MAX_RETRY_AFTER_SECONDS")),
                  settings_default("payments_max_attempts"))),
    Fact("tries per group (processor)", r"`max_attempts` times \(default (\d+)\)",
         lambda: (default("shared._flows.batch", "BasePartitionBatchProcessor", "max_attempts"),)),
    Fact("tries per group (sample)", r"`PAYMENTS_MAX_ATTEMPTS`, default \*\*(\d+)\*\*",
         lambda: (settings_default("payments_max_attempts"),)),
    Fact("groups at once", r"`max_concurrency`, default (\d+)",
         lambda: (default("shared._flows.batch", "BasePartitionBatchProcessor", "max_concurrency"),)),
    Fact("operations per transaction", r"split at (\d+) operations",
         lambda: (code("shared._core.store", "MAX_TRANSACTION_OPERATIONS"),)),
    # Leases and retention
    Fact("lease fraction (library)", r"by default \**(0\.\d+) x\**",
         lambda: (round(code("shared._core.config", "IdempotencyConfig")().lease
                        / code("shared._core.config", "RedeliveryWindow")().lock_duration, 3),)),
    Fact("lease fraction (sample)", r"the lease defaults to (0\.\d+) x the lock",
         lambda: (round(settings_default("lease") / settings_default("window").lock_duration, 3),)),
    Fact("lease renewal limit", r"for at most the host's lock renewal,? \(?\*\*(\d+) minutes\*\*",
         lambda: (code("shared._core.config", "IdempotencyConfig")().max_lease_renewal / timedelta(minutes=1),
                  )),
    Fact("host lock renewal", r"`maxAutoLockRenewalDuration`,? (\d+) minutes",
         lambda: (minutes(host("extensions.serviceBus.maxAutoLockRenewalDuration")),)),
    Fact("default TTL", r"default TTL is \*\*(\d+) days\*\*|TTL \((\d+) days by default",
         lambda: (code("shared._core.config", "DEFAULT_TTL").days,)),
    Fact("default TTL (sample)",
         r"the default TTL \(`DEDUP_TTL_SECONDS`, (\d+) days\)|the default TTL \((\d+) days\)",
         lambda: (settings_default("ttl").days,)),
    Fact("redelivery window", r"the redelivery window is (\d+) day and (\d+) minutes",
         lambda: divmod(int(code("shared._core.config", "RedeliveryWindow")().length.total_seconds() // 60),
                        24 * 60)),
    Fact("function timeout", r"(\d+)-minute `functionTimeout`|`functionTimeout` (\d+) minutes",
         lambda: (minutes(host("functionTimeout")),)),
    Fact("maintenance budget", r"one bounded sweep per store within \*\*(\d+) minutes\*\*",
         lambda: (code("shared._core.sweep", "DEFAULT_BUDGET_SECONDS") / 60,)),
    Fact("sweep page", r"one page \(at most ([\d,]+) rows\)",
         lambda: (code("shared._core.sweep", "DEFAULT_PAGE_SIZE"),)),
    # Keys, payloads and results
    Fact("escaped id length", r"escaped id would pass (\d+) characters",
         lambda: (code("shared._core.keys", "MAX_ENCODED_LENGTH"),)),
    Fact("raw key size", r"The raw key \(at most (\d+) KiB\)",
         lambda: (code("shared._core.keys", "MAX_RAW_KEY_BYTES") / 1024,)),
    Fact("nesting depth", r"(?:deeper than|over) (\d+) levels",
         lambda: (code("shared._core.payload", "MAX_DEPTH"),)),
    Fact("exact integers", r"2\^(\d+) - 1",
         lambda: (code("shared._core.payload", "MAX_SAFE_INTEGER").bit_length(),)),
    Fact("result size", r"at most (\d+) KiB, `max_result_bytes`",
         lambda: (code("shared._core.config", "IdempotencyConfig")().max_result_bytes / 1024,)),
    Fact("parked payload", r"Parked payloads are stored up to ([\d,]+) characters",
         lambda: (code("shared._flows.parking", "MAX_INLINE_PAYLOAD_CHARS"),)),
    # The outbox
    Fact("outgoing body", r"a body over \*\*(\d+) KiB\*\*",
         lambda: (code("shared._core.outbox", "MAX_BODY_BYTES") / 1024,)),
    Fact("messages per key", r"more than \*\*(\d+)\*\* messages",
         lambda: (code("shared._core.outbox", "MAX_MESSAGES"),)),
    Fact("pending bytes per key", r"\*\*(\d+) KiB\*\* of bodies and properties per key",
         lambda: (code("shared._core.outbox", "MAX_PENDING_BYTES") / 1024,)),
    Fact("Table chunk", r"chunked into ([\d,]+)-character properties",
         lambda: (code("shared._core.outbox", "TABLE_CHUNK_CHARS"),)),
    Fact("sweep age", r"`OUTBOX_SWEEP_AGE_SECONDS` \(default (\d+)\)",
         lambda: (settings_default("outbox_sweep_age").total_seconds(),)),
    Fact("duplicate detection window", r"`OUTBOX_DUPLICATE_DETECTION_SECONDS`, default (\d+) days",
         lambda: (settings_default("outbox_duplicate_detection").days,)),
    Fact("trace sampling", r"`TRACE_SAMPLING_RATIO` \(default (0\.\d+)",
         lambda: (code("shared._core.observability", "DEFAULT_SAMPLING_RATIO"),)),
    # The trigger helpers (shared/_triggers/servicebus.py, shared/_triggers/http.py)
    Fact("Service Bus body", r"at most (\d+) KiB, a Standard-tier message",
         lambda: (code("shared._triggers.servicebus", "MAX_MESSAGE_BYTES") / 1024,)),
    Fact("HTTP body",
         r"at most (\d+) KiB by default, `max_body_bytes=`|`max_body_bytes`, (\d+) KiB by default",
         lambda: (code("shared._triggers.http", "MAX_REQUEST_BYTES") / 1024,)),
    Fact("Idempotency-Key length", r"longer than (\d+) characters, holding control characters",
         lambda: (code("shared._triggers.http", "MAX_KEY_CHARS"),)),
    Fact("caller header lengths",
         r"is longer than ([\d,]+) characters, `X-MS-CLIENT-PRINCIPAL` is longer than (\d+) KiB",
         lambda: (code("shared._triggers.http", "MAX_CALLER_CHARS"),
                  code("shared._triggers.http", "MAX_PRINCIPAL_CHARS") / 1024)),
    Fact("HTTP Retry-After", r"`Retry-After: (\d+)`",
         lambda: (default("shared._triggers.http", "BaseIdempotencyKeyEndpoint", "retry_after_seconds"),)),
    # Clock skew (a lease renewed every 1/LEASE_RENEWALS of it, judged on each instance's clock)
    Fact("skew between two instances",
         r"just under (\d+) s with the default (\d+)-second lease",
         lambda: (round(_lease() * (1 - 1 / code("shared._flows.idempotency", "LEASE_RENEWALS")), 6),
                  _lease())),
    Fact("skew from the store's clock",
         r"within 1/(\d+) of the lease of the store's clock\*\* for every instance \((\d+) s by default\)",
         lambda: (code("shared._flows.idempotency", "LEASE_RENEWALS"),
                  _lease() / code("shared._flows.idempotency", "LEASE_RENEWALS"))),
    Fact("skew warning threshold", r"\*\*1/(\d+) of the lease\*\* \((\d+) s by default\)",
         lambda: (round(1 / code("shared._flows.dedup_steps", "CLOCK_SKEW_WARNING_FRACTION"), 6),
                  _lease() * code("shared._flows.dedup_steps", "CLOCK_SKEW_WARNING_FRACTION"))),
    Fact("skew sampling", r"samples at most once every (\d+) s",
         lambda: (code("shared._core.telemetry", "CLOCK_SKEW_SAMPLE_SECONDS"),)),
    Fact("skew warning interval", r"`ClockSkewDetected` \(WARNING, at most (?:once )?every (\d+) minutes",
         lambda: (code("shared._core.telemetry", "CLOCK_SKEW_WARNING_SECONDS") / 60,)),
    # Storage queues (shared/_triggers/queues.py, shared/_triggers/queue_messages.py)
    Fact("max dequeue count", r"`maxDequeueCount`(?:\*\*)? \(default (\d+)\)",
         lambda: (code("shared._triggers.queues", "DEFAULT_MAX_DEQUEUE_COUNT"),)),
    Fact("poison envelope text", r"64 KiB \((\d+) KiB of text before base64\)",
         lambda: (code("shared._triggers.queue_messages", "MAX_POISON_TEXT_BYTES") / 1024,)),
    Fact("queue body", r"bounded decoder, at most (\d+) KiB\); `key\(item\)`",
         lambda: (default("shared._triggers.queues", "StorageQueueConsumer", "max_body_bytes") / 1024,)),
]


def _lease() -> float:
    return code("shared._core.config", "IdempotencyConfig")().lease.total_seconds()


def mismatches(fact: Fact, texts: dict[str, str]) -> tuple[int, list[str]]:
    """How often the fact is stated, and each statement that differs from the code."""
    expected = tuple(float(v) for v in fact.expected())
    found, wrong = 0, []
    for name, text in texts.items():
        for match in re.finditer(fact.pattern, text):
            found += 1
            stated = tuple(number(g) for g in match.groups() if g is not None)
            if stated != expected:
                wrong.append(f"{name}: {match.group(0)!r} states {stated}, the code has {expected}")
    return found, wrong


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_the_docs_state_the_codes_number(fact):
    texts = {path.relative_to(ROOT).as_posix(): read(path) for path in PAGES}
    found, wrong = mismatches(fact, texts)
    assert found, f"no page states the {fact.name} any more (pattern {fact.pattern!r})"
    assert not wrong, "\n".join(wrong)


def test_counter_proof_the_old_readmes_retry_after_is_caught():
    """The README said the batch honours Retry-After "up to 30 s" while the code waits at most 5."""
    old = ("retry a transient failure (`max_attempts`, backoff, Retry-After up to 30 s); park what "
           "can never succeed")
    fact = next(f for f in FACTS if f.name == "Retry-After cap")
    found, wrong = mismatches(fact, {"README.md at 49ff5f8": old})
    assert found == 1 and wrong and "states (30.0,)" in wrong[0], wrong


def test_the_cosmos_indexed_paths_the_docs_list_are_the_codes():
    from shared._backends.cosmos_indexing import RECORD_QUERY_PATHS

    text = read(ROOT / "docs" / "stores.md")
    sentence = re.search(r"excludes `/\*` and indexes only (.*?) and the partition key property", text)
    assert sentence, "docs/stores.md no longer lists the indexed paths"
    assert tuple(re.findall(r"`(/[^`]+)`", sentence.group(1))) == tuple(RECORD_QUERY_PATHS)


def test_every_problem_type_has_its_section_on_the_http_page():
    """Each problem type's URI ends in the anchor of its section (RFC 9457: a type resolves to its
    documentation); the section is titled with the type's title and states its status."""
    problems: dict[str, tuple[int, str]] = dict(code("shared._triggers.http", "PROBLEMS"))
    text = (ROOT / "docs" / "http.md").read_text()
    sections = {m.group(2): (m.group(1), text[m.end():text.find("\n#", m.end())])
                for m in re.finditer(r"^### (.+?) \{#([a-z0-9-]+)\}$", text, re.M)}
    assert set(sections) == set(problems), (sorted(set(problems) - set(sections)),
                                            sorted(set(sections) - set(problems)))
    for slug, (status, title) in problems.items():
        heading, body = sections[slug]
        assert heading == title, f"{slug}: section titled {heading!r}, the type's title is {title!r}"
        assert f"**{status}" in body, f"{slug}: the section does not state status {status}"
