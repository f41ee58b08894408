"""`orders`: one order document per order id, with all its lines, holding the content of
a message sent under that id; the other variants refused as key conflicts."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from simulator.check.evidence import Evidence
from simulator.check.result import CheckResult, Invariant
from simulator.check.stores import Row, marker_of
from simulator.check.verdicts import Verdicts


def order_total(body: dict[str, Any]) -> float:
    return round(sum(line["quantity"] * line["unitPrice"] for line in body["lines"]), 2)


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    orders: dict[str, list[Row]] = defaultdict(list)
    lines: Counter[str] = Counter()
    for row in evidence.rows(evidence.store.orders):
        if row.get("kind") == "order":
            marker = marker_of(row)
            orders[marker.key.key if marker is not None else str(row.get("orderId"))].append(row)
        elif row.get("kind") == "line":
            lines[str(row.get("orderId"))] += 1
    verdicts = Verdicts(evidence, result)
    for key, variants in evidence.of_kind("order").items():
        result.logical["order"] += 1
        stored = orders.get(key, [])
        valid = [v for v in variants if not v.expect.startswith("deadletter:")]
        if not valid:  # malformed input: must not be effected, must be dead-lettered
            if stored:
                result.double_effects["order (invalid input effected)"] += 1
            for variant in variants:
                verdicts.not_effected("order", "orders", variant, [], f"order {key}")
            continue
        if len(stored) > 1:
            result.double_effects["order"] += len(stored) - 1
            result.example("double effect", f"order {key}: {len(stored)} order documents")
        if not stored:
            if lines[key]:  # lines written without their order document
                result.partial["order lines without their order"] += 1
                result.example("partial", f"order {key}: {lines[key]} lines, no order")
            for variant in valid:
                verdicts.not_effected("order", "orders", variant, [], f"order {key}")
            verdicts.valid_not_effected("order", "orders", valid, lambda _: [], f"order {key}")
            continue
        result.effects["order"] += 1
        document = stored[0]
        applied = None
        for variant in valid:
            body = variant.json_body()
            if (abs(float(document.get("total", -1)) - order_total(body)) < 0.005
                    and int(document.get("lineCount", -1)) == len(body["lines"])):
                applied = variant
        expected_lines = int(document.get("lineCount", 0)) * len(stored)
        order_id = str(document.get("orderId"))
        if lines[order_id] < expected_lines:
            result.partial["order lines missing"] += 1
            result.example("partial", f"order {key}: {lines[order_id]}/{expected_lines} lines")
        elif lines[order_id] > expected_lines:
            result.double_effects["order line"] += lines[order_id] - expected_lines
        if applied is None:
            result.partial["order content matches no message sent"] += 1
        else:
            verdicts.valid_effected("order", "orders", applied, [], f"order {key}")
        for variant in valid:
            if variant is not applied:
                verdicts.conflict("orders", variant, [])
    return []
