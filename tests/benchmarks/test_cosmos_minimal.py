"""The Prefer: return=minimal benchmark measures what it says: the same transactions through the
store and the SDK, on answers recorded from the local server, echoed or minimal."""

from __future__ import annotations

import json

from benchmarks.cosmos_minimal import measure, minimal, record_answers


def test_the_minimal_answer_is_the_recorded_one_without_the_echoed_items():
    answers = record_answers(3)
    status, _, body = answers["batch"]
    echoed = json.loads(body)
    assert status == 200 and len(echoed) == 4 and all("resourceBody" in r for r in echoed)
    _, headers, stripped = minimal(answers["batch"])
    kept = json.loads(stripped)
    assert [r.get("eTag") for r in kept] == [r.get("eTag") for r in echoed]
    assert not any("resourceBody" in r for r in kept)
    assert headers["Content-Length"] == str(len(stripped))


def test_both_variants_commit_every_transaction_and_report_per_marker():
    cost = measure(transactions=3, markers=2, rounds=1)
    assert cost.full_us > 0 and cost.minimal_us > 0
    assert cost.minimal_bytes < cost.echoed_bytes
    assert "Prefer: return=minimal" in cost.note()
