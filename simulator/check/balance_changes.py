"""The second outbox hop, payments -> balance_projection: every committed account
transaction's `BalanceChanged` effected exactly once downstream, none for a transaction
that did not commit (a phantom), none left pending after reconciliation, and every
account's view equal to its balance document.

What committed is read from the ledger: each account transaction of an Event Hubs batch
keeps its `BalanceChanged` on its first marker, with the position of that marker's event
(the partition's mark covering the position is the record that it was dispatched). What
was effected is read from balance_projection's markers (one per message it applied,
whatever its verdict). The two are matched by content (account, resulting balance,
version, payment ids), not by message id: a version only grows, so one content is one
transaction, and a message published outside the outbox (new ids) is still judged by
what it says. A committed transaction with no marker downstream is lost (or, when the
broker dead-lettered it, a valid message not effected), with more than one doubled; a
marker or a message the dispatcher sent (simulator) that matches no committed
transaction is a phantom. The views are the end-to-end proof, independent of what the
outbox recorded: after reconciliation each account's view holds its balance document's
`balanceCents` and `version`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from domain.balance_projection import CONSUMER, VIEW_DOCUMENT, BalanceChanged, view_partition
from domain.payments import BALANCE_CHANGED
from shared import request_hash
from shared._core.keys import store_safe_id
from shared._core.outbox import EventPosition
from shared._core.records import IdempotencyRecord
from shared._core.store import Document, IdempotencyStore
from shared._flows.watermark import Mark, event_time
from simulator.check.evidence import Evidence
from simulator.check.result import CheckResult, Invariant
from simulator.check.stores import Row, is_record, marker_of

KIND = BALANCE_CHANGED  # the tallies' key for this hop


@dataclass(frozen=True)
class Transaction:
    """A committed account transaction, as its first ledger marker holds its message."""

    message_id: str
    account: str
    version: int
    balance_cents: int
    content_hash: str  # what balance_projection's marker of this content holds
    position: EventPosition | None
    marker: str  # the ledger marker's key (for examples)


@dataclass
class BalanceHop:
    """What the hop's checks read: rows of the stores and what the harness saw."""

    ledger: list[Row]  # this run's ledger rows (payments markers and account documents)
    views: list[Row]  # the dedup store's rows in this run's view partitions
    marks: list[Row]  # the payments marks of this run's event hub
    published: dict[str, tuple[str, bytes]] | None = None  # id -> (destination, body) sent
    dead_letters: dict[str, list[str]] = field(default_factory=dict)  # message id -> reasons
    # What payments dispatched went through a broker to balance_projection (False: a test's
    # own dispatcher kept it): only then is each committed message owed an effect downstream.
    delivered: bool = True


def content_hash(body: bytes | str | dict[str, Any]) -> str | None:
    """The request hash balance_projection keeps for a BalanceChanged body (None: not one)."""
    try:
        data = body if isinstance(body, dict) else json.loads(body)
        if not isinstance(data, dict) or data.get("type", BALANCE_CHANGED) != BALANCE_CHANGED:
            return None
        change = BalanceChanged(str(data["accountId"]), int(data["balanceCents"]),
                                int(data["version"]), tuple(data.get("eventIds", ())))
    except (KeyError, TypeError, ValueError):
        return None
    return str(request_hash(change.content()))


def read(evidence: Evidence) -> BalanceHop:
    """The hop's rows: the ledger (shared with the payments check), the views and
    balance_projection's markers, and the marks, each read once."""
    dedup = _dedup_store(evidence)
    views = evidence.rows(dedup, partition=view_partition(evidence.run_id)) if dedup else []
    marks = (evidence.rows(dedup, partition=store_safe_id(f"hwm|payments|{evidence.hub}|"))
             if dedup and evidence.hub else [])
    letters: dict[str, list[str]] = defaultdict(list)
    for letter in evidence.dead_letters or []:
        if letter.consumer == CONSUMER and letter.logical.startswith("outbox:"):
            letters[letter.logical.split(":", 1)[1]].append(letter.reason)
    return BalanceHop(ledger=evidence.rows(evidence.store.ledger), views=views, marks=marks,
                      published=evidence.published, dead_letters=dict(letters),
                      delivered=evidence.outbox_delivered)


def _dedup_store(evidence: Evidence) -> IdempotencyStore | None:
    stores = evidence.store
    return stores.by_role.get("dedup") or stores.records.get("dedup")


def check(evidence: Evidence, result: CheckResult) -> list[Invariant]:
    return judge(read(evidence), result)


def judge(hop: BalanceHop, result: CheckResult) -> list[Invariant]:
    """Add the hop's figures to the tallies; its own invariants (none when the run published
    no BalanceChanged and nothing downstream shows one: the hop is off)."""
    committed = transactions(hop.ledger)
    effects: dict[str, list[IdempotencyRecord]] = defaultdict(list)
    views: dict[str, Row] = {}
    for row in hop.views:
        marker = marker_of(row)
        if marker is not None:
            if marker.key.consumer == CONSUMER:
                effects[marker.request_hash].append(marker)
        elif row.get("_id") == VIEW_DOCUMENT and row.get("kind") == "balance-view":
            views[str(row.get("accountId"))] = row
    if not committed and not effects and not views:
        return []
    by_hash = {tx.content_hash: tx for tx in committed}
    if hop.delivered:
        _effected(hop, result, committed, effects)
    _phantoms(hop, result, by_hash, effects)
    _pending(hop, result, committed)
    phantoms, pending = result.phantoms[KIND], result.pending[KIND]
    invariants = [
        Invariant("no BalanceChanged for a transaction that did not commit (no phantoms)",
                  phantoms == 0, f"{phantoms} phantoms" if phantoms else ""),
        Invariant("no BalanceChanged left pending after reconciliation (each marker's event "
                  "covered by its partition's mark)", pending == 0,
                  f"{pending} transactions still pending" if pending else ""),
    ]
    if hop.delivered:
        _views(hop, result, views)
        invariants.append(Invariant(
            "each account's view == its balance document (balanceCents and version)",
            not result.view_mismatches,
            f"{len(result.view_mismatches)} of {result.views_checked} accounts differ"
            if result.view_mismatches else f"{result.views_checked} accounts"))
    return invariants


def transactions(ledger: list[Row]) -> list[Transaction]:
    """The committed transactions' BalanceChanged, from the payments markers that hold them."""
    found: list[Transaction] = []
    for row in ledger:
        marker = marker_of(row)
        if marker is None or marker.key.consumer != "payments" or not marker.outbox:
            continue
        position = marker.outbox_position
        for message in marker.outbox:
            digest = content_hash(message.body)
            if digest is None:
                continue
            body = json.loads(message.body)
            found.append(Transaction(message.message_id, str(body["accountId"]),
                                     int(body["version"]), int(body["balanceCents"]), digest,
                                     position, marker.key.key))
    return found


def _effected(hop: BalanceHop, result: CheckResult, committed: list[Transaction],
              effects: dict[str, list[IdempotencyRecord]]) -> None:
    """Each committed transaction: effected once, not at all (lost, or dead-lettered), or more."""
    refused: dict[str, list[str]] = defaultdict(list)  # content -> dead-letter reasons
    for message_id, reasons in hop.dead_letters.items():
        sent = (hop.published or {}).get(message_id)
        digest = content_hash(sent[1]) if sent is not None else None
        refused[digest or message_id] += reasons
    for tx in committed:
        result.logical[KIND] += 1
        n = len(effects.get(tx.content_hash, []))
        what = f"{tx.account} version {tx.version} (message {tx.message_id})"
        if n == 1:
            result.effects[KIND] += 1
        elif n > 1:
            result.double_effects[KIND] += n - 1
            result.example("double effect", f"BalanceChanged {what}: {n} balance_projection markers")
        elif reasons := refused.get(tx.content_hash) or refused.get(tx.message_id):
            result.valid_not_effected[f"{KIND}: dead-lettered {reasons[0]}"] += 1
            result.example("valid not effected", f"BalanceChanged {what} ({reasons[0]})")
        else:
            result.lost[KIND] += 1
            result.example("lost", f"BalanceChanged {what}: never effected")


def _phantoms(hop: BalanceHop, result: CheckResult, committed: dict[str, Transaction],
              effects: dict[str, list[IdempotencyRecord]]) -> None:
    """Markers downstream, and messages the dispatcher sent, that match no committed
    transaction: each message id once."""
    phantom_ids: set[str] = set()
    for digest, markers in effects.items():
        if digest not in committed:
            for marker in markers:
                phantom_ids.add(marker.key.key)
                result.example("phantom", f"balance_projection applied {marker.key.key} "
                                          f"({marker.result}): no committed transaction")
    for message_id, (_, body) in (hop.published or {}).items():
        digest = content_hash(body)
        if digest is not None and digest not in committed and message_id not in phantom_ids:
            phantom_ids.add(message_id)
            result.example("phantom", f"BalanceChanged {message_id} sent: no committed transaction")
    if phantom_ids:
        result.phantoms[KIND] += len(phantom_ids)


def _pending(hop: BalanceHop, result: CheckResult, committed: list[Transaction]) -> None:
    """Committed transactions whose event the partition's mark does not cover."""
    marks: dict[str, Mark] = {}
    for row in hop.marks:
        if "sequenceNumber" in row and "partitionId" in row:
            marks[str(row["partitionId"])] = Mark(
                int(row["sequenceNumber"]), Document(str(row["_id"]), str(row["_partition"]), row),
                event_time(row.get("enqueuedTime")))
    for tx in committed:
        if tx.position is None:  # dispatched and recorded per commit (a single event): not ours
            continue
        mark = marks.get(tx.position.partition_id)
        if mark is None or not _covered(mark, tx.position):
            result.pending[KIND] += 1
            result.example("pending", f"BalanceChanged {tx.account} version {tx.version}: event "
                                      f"{tx.position.partition_id}/{tx.position.sequence_number} "
                                      "above its partition's mark")


def _covered(mark: Mark, position: EventPosition) -> bool:
    """The mark covers the event (`Mark.covers`), or the event is of an earlier incarnation of
    the hub: numbered above the mark yet enqueued before the marked event, which within one
    incarnation cannot be (the simulator fails a hub over only once it is drained)."""
    if mark.covers(position.sequence_number, position.enqueued_time):
        return True
    when, marked = event_time(position.enqueued_time), mark.enqueued_time
    return when is not None and marked is not None and when < marked


def _views(hop: BalanceHop, result: CheckResult, views: dict[str, Row]) -> None:
    """Each account's view against its balance document (both read after reconciliation)."""
    balances = {str(row.get("accountId")): row for row in hop.ledger
                if not is_record(row) and row.get("kind") == "account"}
    accounts = sorted(set(balances) | set(views))
    for account in accounts:
        balance, view = balances.get(account), views.get(account)
        expected = None if balance is None else (int(balance.get("balanceCents", 0)),
                                                 int(balance.get("version", 0)))
        shown = None if view is None else (int(view.get("balanceCents", 0)),
                                           int(view.get("version", 0)))
        if expected != shown:
            result.view_mismatches.append({"account": account, "balance": expected, "view": shown})
            result.example("view differs", f"{account}: balance {expected}, view {shown}")
    result.views_checked = len(accounts)
