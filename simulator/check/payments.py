"""`payments`: one ledger marker per payment, holding the content of an event sent under
its key, and every account balance equal to the sum of its applied events."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from shared import request_hash
from shared._core.records import IdempotencyRecord
from simulator.check.evidence import Evidence
from simulator.check.result import CheckResult, Invariant
from simulator.check.stores import marker_of
from simulator.check.verdicts import Verdicts
from simulator.workload import Item


def payment_content(item: Item) -> dict[str, Any] | None:
    """What the app hashes for a payment (type, account, amount), from what was sent."""
    body = item.json_body()
    if not isinstance(body, dict):
        return None
    if item.properties.get("ce_type"):
        event_type, data = item.properties["ce_type"], body
    else:
        event_type, data = body.get("type"), body.get("data")
    if not isinstance(data, dict):
        return None
    return {"type": event_type, "accountId": data.get("accountId"),
            "amountCents": data.get("amountCents")}


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    markers: dict[str, list[IdempotencyRecord]] = defaultdict(list)
    balances: dict[str, int] = {}
    for row in evidence.rows(evidence.store.ledger):
        marker = marker_of(row)
        if marker is not None:
            if marker.key.consumer == "payments":
                markers[marker.key.key].append(marker)
        elif row.get("kind") == "account":
            balances[str(row.get("accountId"))] = int(row.get("balanceCents", 0))
    expected = _effects(evidence, result, markers)
    for account in sorted(set(expected) | set(balances)):
        if balances.get(account, 0) != expected.get(account, 0):
            result.balance_mismatches.append(
                {"account": account, "balanceCents": balances.get(account, 0),
                 "sumOfAppliedEventsCents": expected.get(account, 0)})
    result.accounts_checked = len(set(expected) | set(balances))
    return [Invariant("each account balance == sum of its applied events",
                      not result.balance_mismatches,
                      f"{len(result.balance_mismatches)} of {result.accounts_checked} accounts differ"
                      if result.balance_mismatches else f"{result.accounts_checked} accounts")]


def _effects(evidence: Evidence, result: CheckResult,
             markers: dict[str, list[IdempotencyRecord]]) -> Counter[str]:
    """Rule on each payment; the balance change each account should show, in cents."""
    verdicts = Verdicts(evidence, result)
    expected: Counter[str] = Counter()
    for key, variants in evidence.of_kind("payment").items():
        result.logical["payment"] += 1
        found = markers.get(key, [])
        valid = [v for v in variants if not v.expect.startswith("park:")]
        if not valid:
            if found:
                result.double_effects["payment (invalid event applied)"] += 1
            for variant in variants:
                verdicts.not_effected("payment", "payments", variant, evidence.parked_of(variant),
                                      f"payment {key}")
            continue
        if len(found) > 1:
            result.double_effects["payment"] += len(found) - 1
            result.example("double effect", f"payment {key}: {len(found)} ledger markers")
        if not found:
            for variant in valid:
                verdicts.not_effected("payment", "payments", variant, evidence.parked_of(variant),
                                      f"payment {key}")
            verdicts.valid_not_effected("payment", "payments", valid, evidence.parked_of,
                                        f"payment {key}")
            continue
        result.effects["payment"] += 1
        applied = None
        for variant in valid:
            content = payment_content(variant)
            if content is not None and found[0].request_hash == request_hash(content):
                applied = variant
        if applied is None:
            result.partial["payment content matches no event sent"] += 1
            continue
        verdicts.valid_effected("payment", "payments", applied, evidence.parked_of(applied),
                                f"payment {key}")
        content = payment_content(applied)
        assert content is not None
        sign = 1 if content["type"] == "payment.credit" else -1
        expected[content["accountId"]] += sign * content["amountCents"] * len(found)
        for variant in valid:
            if variant is not applied:
                verdicts.conflict("payments", variant, evidence.parked_of(variant))
    return expected
