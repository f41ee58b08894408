"""`notify` and `audit`: one accepted notification per subscription for each valid
notification (distinct Idempotency-Keys when the API honours them, raw calls when not),
none for hostile input. From the API's log in the simulator; from the dedup records
against a real deployment, where the API's log cannot be read."""

from __future__ import annotations

from collections import defaultdict

from shared._core.records import IdempotencyRecord, RecordState
from simulator.check.evidence import CHANNELS, Evidence
from simulator.check.result import CheckResult, Invariant
from simulator.check.stores import marker_of
from simulator.check.verdicts import Verdicts
from simulator.faults import ApiCall
from simulator.workload import Item


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    if evidence.api_calls is None:
        return _from_records(evidence, result)
    per: dict[tuple[str, str], list[ApiCall]] = defaultdict(list)
    for call in evidence.api_calls:
        per[(call.channel, call.notification_id)].append(call)
    verdicts = Verdicts(evidence, result)
    for key, variants in evidence.of_kind("notification").items():
        item = variants[0]
        if item.invalid:  # hostile input: no call may carry its id
            _invalid(evidence, result, key, item, sum(len(per.get((c, key), [])) for c in CHANNELS))
            continue
        for channel in CHANNELS:
            result.logical[f"notification ({channel})"] += 1
            seen = per.get((channel, key), [])
            keys = {c.key for c in seen}
            effects = sum(1 for c in seen if c.new_effect)
            result.resent_same_key += len(seen) - len(keys)
            if effects > 1:
                result.double_effects[f"notification ({channel})"] += effects - 1
                result.example("double effect",
                               f"{channel} {key}: {effects} notifications accepted "
                               f"({len(keys)} distinct keys, {len(seen)} calls)")
            _rule(verdicts, channel, key, item, effected=effects >= 1,
                  effect=f"notification ({channel})")
    return []


def _from_records(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    """Without the API's log (a real deployment): the dedup records say what was sent."""
    records: dict[str, dict[str, IdempotencyRecord]] = {}
    for channel in CHANNELS:
        rows = evidence.rows(evidence.store.notifications,
                             partition=f"{channel}|{evidence.run_id}")
        markers = (marker_of(row) for row in rows)
        records[channel] = {m.key.key: m for m in markers if m is not None}
    verdicts = Verdicts(evidence, result)
    for key, variants in evidence.of_kind("notification").items():
        item = variants[0]
        if item.invalid:
            _invalid(evidence, result, key, item, sum(key in records[c] for c in CHANNELS))
            continue
        for channel in CHANNELS:
            result.logical[f"notification ({channel})"] += 1
            record = records[channel].get(key)
            effected = (record is not None and record.state is RecordState.COMPLETED
                        and not (isinstance(record.result, dict) and "parked" in record.result))
            _rule(verdicts, channel, key, item, effected=effected,
                  effect=f"notification ({channel}, recorded)")
    return []


def _rule(verdicts: Verdicts, channel: str, key: str, item: Item, *, effected: bool,
          effect: str) -> None:
    """One valid notification at one subscription: effected (once), or why not."""
    parked = verdicts.evidence.parked_entry(channel, key)
    what = f"{channel} {key}"
    if effected:
        verdicts.result.effects[effect] += 1
        verdicts.valid_effected("notification", channel, item, parked, what)
    else:
        verdicts.not_effected("notification", channel, item, parked, what)
        verdicts.valid_not_effected("notification", channel, [item], lambda _: parked, what)


def _invalid(evidence: Evidence, result: CheckResult, key: str, item: Item, effects: int) -> None:
    """Hostile input on the topic: never sent; rejected on each subscription."""
    result.logical["notification (invalid input)"] += 1
    if effects:
        result.double_effects["notification (invalid input effected)"] += 1
        result.example("double effect", f"notification {key}: invalid input sent")
    verdicts = Verdicts(evidence, result)
    for channel in CHANNELS:
        verdicts.not_effected("notification", channel, item, evidence.parked_entry(channel, key),
                              f"{channel} {key}")
