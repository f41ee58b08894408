"""The seeded workload and its ledger."""

from __future__ import annotations

import json
from collections import Counter

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
    binary = [i for i in w.items if i.properties]
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
    for item in sorted(w.by_kind("order_status"), key=lambda i: i.at):
        by_order.setdefault(item.json_body()["orderId"], []).append(item.json_body()["version"])
    in_order = sum(v == sorted(v) for v in by_order.values())
    assert in_order >= 0.8 * len(by_order) and in_order < len(by_order)


def test_ledger_round_trip():
    w = generate(seed=10, messages=100, events=100, run_id="r7")
    data = json.loads(json.dumps(w.ledger(hub="payments")))
    meta, items = load_ledger(data)
    assert meta["format"] == LEDGER_FORMAT and meta["runId"] == "r7" and meta["hub"] == "payments"
    assert [i.to_json() for i in items] == [i.to_json() for i in w.items]
