"""The outbox hop, orders -> notify/audit: every committed order's OrderAccepted effected
once per subscription with the committed content; none for an order that did not commit
(a phantom); and no order still carrying pending messages after reconciliation."""

from __future__ import annotations

import json
from collections import defaultdict

from shared._core.outbox import has_pending
from simulator.check.evidence import CHANNELS, DeadLetter, Evidence
from simulator.check.result import CheckResult, Invariant
from simulator.faults import ApiCall

KIND = "OrderAccepted"  # the tallies' key prefix for this hop


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    committed = _committed(evidence, result)
    if evidence.api_calls is not None and evidence.outbox_delivered:
        _delivered(evidence, result, committed, evidence.api_calls)
    phantoms = {k: n for k, n in result.phantoms.items() if k.startswith(KIND)}
    pending = result.pending[KIND]
    return [
        Invariant("no OrderAccepted for an order that did not commit (no phantoms)",
                  not phantoms,
                  f"{sum(phantoms.values())} phantoms {phantoms}" if phantoms else ""),
        Invariant("no OrderAccepted left pending after reconciliation",
                  pending == 0, f"{pending} orders still pending" if pending else ""),
    ]


def _committed(evidence: Evidence, result: CheckResult) -> dict[str, str]:
    """Committed orders: order id -> the content OrderAccepted must carry; pending counted."""
    committed: dict[str, str] = {}
    for row in evidence.rows(evidence.store.orders):
        if row.get("kind") != "order":
            continue
        order_id = str(row.get("orderId"))
        committed[order_id] = json.dumps([round(float(row.get("total") or 0), 2),
                                          row.get("lineCount")])
        if has_pending(row):
            result.pending[KIND] += 1
            result.example("pending", f"order {order_id} still carries its messages")
    return committed


def _delivered(evidence: Evidence, result: CheckResult, committed: dict[str, str],
               calls: list[ApiCall]) -> None:
    """What reached the notification API for each order, per subscription."""
    per: dict[tuple[str, str], list[ApiCall]] = defaultdict(list)
    for call in calls:
        if call.notification_id.startswith("OrderAccepted:"):
            per[(call.channel, call.notification_id.split(":", 1)[1])].append(call)
    for (channel, order_id), seen in per.items():
        wrong = [c for c in seen if c.new_effect and committed.get(order_id) != c.content]
        if wrong:
            result.phantoms[f"OrderAccepted ({channel})"] += len(wrong)
            why = "no committed order" if order_id not in committed else "other content"
            result.example("phantom", f"{channel} OrderAccepted {order_id}: {why}")
    refused: dict[tuple[str, str], list[DeadLetter]] = defaultdict(list)
    for letter in evidence.dead_letters or []:
        if letter.logical.startswith("outbox:"):
            order = evidence.outbox_orders.get(letter.logical.split(":", 1)[1])
            if order is not None:
                refused[(letter.consumer, order)].append(letter)
    for order_id, content in committed.items():
        for channel in CHANNELS:
            result.logical[f"OrderAccepted ({channel})"] += 1
            effects = sum(1 for c in per.get((channel, order_id), [])
                          if c.new_effect and c.content == content)
            if effects == 0:
                letters = refused.get((channel, order_id))
                if letters:  # refused with a reason: not lost, but a valid message not effected
                    reason = letters[0].reason
                    result.valid_not_effected[f"OrderAccepted: dead-lettered {reason}"] += 1
                    result.example("valid not effected",
                                   f"{channel} OrderAccepted {order_id} ({reason})")
                    continue
                result.lost[f"OrderAccepted ({channel})"] += 1
                result.example("lost", f"{channel} OrderAccepted {order_id}: never effected")
            elif effects > 1:
                result.double_effects[f"OrderAccepted ({channel})"] += effects - 1
                result.example("double effect",
                               f"{channel} OrderAccepted {order_id}: {effects} notifications")
            else:
                result.effects[f"OrderAccepted ({channel})"] += 1
