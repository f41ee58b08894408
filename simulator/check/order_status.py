"""`order_status`: the stored version of each order's status is at least every valid
event's version (later versions win; an older event is absorbed, not lost)."""

from __future__ import annotations

from collections import defaultdict

from simulator.check.evidence import Evidence
from simulator.check.result import CheckResult, Invariant
from simulator.check.verdicts import Verdicts
from simulator.workload import Item


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    stored = {str(row.get("orderId")): row for row in evidence.rows(evidence.store.order_status)}
    verdicts = Verdicts(evidence, result)
    by_order: dict[str, list[Item]] = defaultdict(list)
    for item in evidence.items:
        if item.kind != "order_status":
            continue
        if item.invalid:  # hostile input: its own order id, which must stay unwritten
            result.logical["order_status"] += 1
            if item.key in stored:
                result.double_effects["order status (invalid input effected)"] += 1
                result.example("double effect", f"status {item.key}: invalid input applied")
            verdicts.not_effected("order_status", "order_status", item, [], f"status {item.key}")
            continue
        by_order[item.json_body()["orderId"]].append(item)
    for order_id, events in by_order.items():
        result.logical["order_status"] += len(events)
        version = int(stored[order_id]["version"]) if order_id in stored else 0
        for event in events:
            what = f"status {event.key}: stored version {version}"
            if version >= event.json_body()["version"]:
                result.effects["order_status"] += 1
                verdicts.valid_effected("order_status", "order_status", event, [], what)
            else:
                verdicts.not_effected("order_status", "order_status", event, [], what)
                verdicts.valid_not_effected("order_status", "order_status", [event],
                                            lambda _: [], what)
    return []
