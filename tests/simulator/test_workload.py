"""The seeded workload and its ledger."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from simulator.workload import LEDGER_FORMAT, cloudevent_key, generate, load_ledger


def test_same_seed_same_workload_and_counts_add_up():
    a = generate(seed=3, messages=1000, events=800, run_id="r1")
    b = generate(seed=3, messages=1000, events=800, run_id="r1")
    assert [i.to_json() for i in a.items] == [i.to_json() for i in b.items]
    kinds = Counter(i.kind for i in a.items)
    assert kinds["order"] + kinds["order_status"] + kinds["notification"] == 1000
    assert kinds["payment"] == 800
    assert generate(seed=4, messages=1000, events=800, run_id="r1").items[0].to_json() != \
        a.items[0].to_json()


def test_conflicts_invalid_input_and_duplicates_are_in_the_mix():
    w = generate(seed=5, messages=2000, events=2000, duplicate_rate=0.25, run_id="r2")
    expects = Counter(i.expect.split(":")[0] for i in w.items)
    assert expects["conflict"] >= 2 and expects["deadletter"] >= 1 and expects["park"] >= 1
    for conflict in (i for i in w.items if i.expect == "conflict"):
        originals = [o for o in w.items if o.key == conflict.key and o.variant == 0]
        assert len(originals) == 1 and originals[0].body != conflict.body
        assert originals[0].at < conflict.at  # the reused id comes later
    copies = sum(len(i.copies) for i in w.items)
    assert 0.07 * len(w.items) < copies < 0.2 * len(w.items)
    window = w.duplicate_detection_window
    late = sum(d > window for i in w.items for d in i.copies)
    assert late > copies / 2  # most retries come after the broker's duplicate-detection window


def test_ids_are_unique_per_logical_message_and_carry_the_run_id():
    w = generate(seed=6, messages=500, events=500, run_id="r3")
    originals = [i for i in w.items if i.variant == 0]
    assert len({i.logical for i in originals}) == len(originals)
    assert all("r3" in i.key for i in w.items)
    payment = next(i for i in w.items if i.kind == "payment" and not i.properties and i.variant == 0
                   and i.expect == "effect")
    body = json.loads(payment.body)
    assert payment.key == cloudevent_key(body["source"], body["id"])


def test_binary_mode_cloudevents_carry_their_attributes_as_properties():
    w = generate(seed=7, messages=0, events=400, run_id="r4")
    binary = [i for i in w.items if i.properties and not i.invalid]
    assert binary, "some events use the binary content mode"
    for item in binary:
        assert {"ce_id", "ce_source", "ce_type", "ce_specversion"} <= set(item.properties)
        assert item.key == cloudevent_key(item.properties["ce_source"], item.properties["ce_id"])


def test_sends_are_time_ordered_and_include_every_copy():
    w = generate(seed=8, messages=300, events=300, run_id="r5")
    sends = w.sends()
    assert [s[0] for s in sends] == sorted(s[0] for s in sends)
    assert len(sends) == len(w.items) + sum(len(i.copies) for i in w.items)


def test_status_versions_mostly_go_out_in_order():
    w = generate(seed=9, messages=2000, events=0, run_id="r6")
    by_order = {}
    for item in sorted((i for i in w.by_kind("order_status") if not i.invalid), key=lambda i: i.at):
        by_order.setdefault(item.json_body()["orderId"], []).append(item.json_body()["version"])
    in_order = sum(v == sorted(v) for v in by_order.values())
    assert in_order >= 0.8 * len(by_order) and in_order < len(by_order)


def test_ledger_round_trip():
    w = generate(seed=10, messages=100, events=100, run_id="r7")
    data = json.loads(json.dumps(w.ledger(hub="payments")))
    meta, items = load_ledger(data)
    assert meta["format"] == LEDGER_FORMAT and meta["runId"] == "r7" and meta["hub"] == "payments"
    assert [i.to_json() for i in items] == [i.to_json() for i in w.items]


def _depth(text):
    depth = deepest = 0
    for char in text:  # no strings hold brackets in these bodies
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(char, 0)
        deepest = max(deepest, depth)
    return deepest


def _recursive_depth(value):
    if isinstance(value, list):
        return 1 + max((_recursive_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_recursive_depth(v) for v in value.values()), default=0)
    return 0


def _hostile(workload):
    return {(i.kind, i.case): i for i in workload.items if i.case}


def test_hostile_cases_are_in_every_workload_of_a_hundred_messages_and_events():
    w = generate(seed=12, messages=300, events=300, run_id="h1", oversize_bytes=300_000)
    kinds = Counter(i.kind for i in w.items)  # counted within the totals, not on top
    assert kinds["order"] + kinds["order_status"] + kinds["notification"] == 300
    assert kinds["payment"] == 300
    hostile = _hostile(w)
    assert {case for kind, case in hostile if kind == "order"} >= {
        "deep-nesting", "deep-nesting-in-field", "nan", "infinity", "float-overflow",
        "surrogate-in-id", "surrogate-in-field", "int-2^53+1", "int-10^30", "int-2^63",
        "missing-keys", "oversize"}
    assert {case for kind, case in hostile if kind == "payment"} >= {
        "structured:deep-nesting", "structured:deep-nesting-in-data",
        "structured:deep-nesting-in-extension", "structured:nan", "structured:surrogate-in-id",
        "structured:surrogate-in-account", "structured:int-2^53+1", "structured:int-2^63",
        "structured:missing-data", "structured:oversize", "binary:deep-nesting", "binary:infinity",
        "binary:surrogate-in-account", "binary:int-10^30", "binary:missing-id"}
    assert {kind for kind, _ in hostile} == {"order", "order_status", "notification", "payment"}
    for (kind, case), item in hostile.items():
        assert item.invalid, (kind, case)
        assert item.expect.startswith("park:" if kind == "payment" else "deadletter:")
        assert item.body.isascii(), (kind, case)  # surrogates travel escaped, as valid UTF-8
        assert "h1" in item.key
    assert not any(i.case for i in w.items if not i.invalid)


def test_hostile_bodies_are_what_they_claim():
    w = generate(seed=13, messages=200, events=200, run_id="h2", oversize_bytes=250_000)
    hostile = _hostile(w)
    deep = hostile[("order", "deep-nesting")].body
    assert deep.startswith("[" * 5000) and len(deep.encode()) < 16 * 1024
    for key in (("order", "deep-nesting"), ("order", "deep-nesting-in-field"),
                ("payment", "structured:deep-nesting"), ("payment", "binary:deep-nesting"),
                ("payment", "structured:deep-nesting-in-data"),
                ("payment", "structured:deep-nesting-in-extension"),
                ("notification", "deep-nesting"), ("order_status", "deep-nesting")):
        assert _depth(hostile[key].body) >= 5000, key
        with pytest.raises(RecursionError):  # what any recursive walk of it does
            _recursive_depth(json.loads(hostile[key].body))
    assert math.isnan(json.loads(hostile[("order", "nan")].body)["lines"][0]["unitPrice"])
    assert json.loads(hostile[("payment", "binary:infinity")].body)["amountCents"] == math.inf
    assert json.loads(hostile[("order", "float-overflow")].body)["lines"][0]["unitPrice"] == math.inf
    assert json.loads(hostile[("payment", "structured:surrogate-in-account")].body)["data"][
        "accountId"].endswith("\ud800")
    assert json.loads(hostile[("order", "surrogate-in-id")].body)["orderId"].endswith("\ud800")
    assert json.loads(hostile[("payment", "structured:int-2^53+1")].body)["data"][
        "amountCents"] == 2**53 + 1
    assert json.loads(hostile[("payment", "binary:int-10^30")].body)["amountCents"] == 10**30
    assert json.loads(hostile[("order", "int-2^63")].body)["lines"][0]["quantity"] == 2**63
    assert "data" not in json.loads(hostile[("payment", "structured:missing-data")].body)
    assert "ce_id" not in hostile[("payment", "binary:missing-id")].properties
    assert len(hostile[("order", "oversize")].body_bytes) == 250_000
    assert len(hostile[("payment", "structured:oversize")].body_bytes) == 250_000
    assert not hostile[("order", "oversize")].copies  # a few instances of the big ones only



def test_every_payment_body_is_unique():
    # Parked events are matched to what was sent by their body's hash.
    w = generate(seed=15, messages=0, events=3000, run_id="h4", invalid_rate=0.02)
    payments = [i for i in w.items if i.kind == "payment"]
    assert sum(i.invalid and not i.case for i in payments) >= 30
    assert len({i.body_sha256 for i in payments}) == len(payments)


def test_hostile_cases_only_when_asked_and_large_enough():
    assert not any(i.case for i in generate(seed=14, messages=99, events=99, run_id="h3").items)
    assert not any(i.case for i in generate(seed=14, messages=500, events=500, run_id="h3",
                                            hostile=False).items)
    w = generate(seed=14, messages=500, events=500, run_id="h3")
    assert any(i.case for i in w.items)
    assert not any(i.case in ("oversize", "structured:oversize") for i in w.items)
    _, items = load_ledger(json.loads(json.dumps(w.ledger())))
    assert [i.case for i in items] == [i.case for i in w.items]
