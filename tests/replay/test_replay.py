"""The replay tool end to end: messages parked and dead-lettered for real reasons, replayed
to exactly one effect (read from the stores, the API's log and the invariant checker),
a second replay that changes nothing, discards that keep a note.

Every test runs on both dedup backends (Table Storage on Azurite, Cosmos on the local
server) and, where Service Bus is involved, on both dead-letter sources: the simulator's
broker, and the azure-servicebus implementation driven through the SDK's client surface
(tests/replay/sdk_client.py).
"""

from __future__ import annotations

import json

import pytest

import domain.orders
import domain.payments
from replay.deadletters import DEAD_LETTER_PROPERTIES
from replay.tool import Filters, Options, ReplayError
from shared import DedupKey, request_hash
from simulator.check import Checker, DeadLetter, Evidence, stores_of
from tests.support.services import records

from .conftest import WINDOW

SOURCES = ("simulator", "sdk")


def check(world):
    """The simulator's invariant checker on the stores, the broker's DLQs and the API's log."""
    consumer_of = {ref.path: ref.consumer for ref in world.entities}
    letters = [DeadLetter(consumer_of[entity.path], m.origin.logical, m.origin.variant,
                          m.dead_letter_reason or "", m.dead_letter_description or "")
               for entity in world.namespace.entities for m in entity.dead_letters]
    evidence = Evidence(dead_letters=letters, api_calls=list(world.api.calls),
                        api_honours_key=world.api.honours_key)
    return Checker(world.items, stores_of(world.services.stores), run_id=world.run_id,
                   hub=world.settings.payments_hub, evidence=evidence).run()


# The checker's invariants this tool answers for. (It also flags a valid message that was
# effected but had a copy refused: a fact of the run that a replay resolves but cannot undo.)
CORE = ("exactly one effect per message (no double effects)",
        "each account balance == sum of its applied events",
        "effects complete (no partial effects)",
        "nothing lost (effected, dead-lettered or parked with a reason)",
        "every key conflict dead-lettered or parked")


def core_ok(result) -> bool:
    found = {i.name: i for i in result.invariants}
    assert set(CORE) <= set(found), sorted(found)
    failed = [found[name] for name in CORE if not found[name].ok]
    assert not failed, failed
    return True


def all_ok(result) -> bool:
    """After the replay every invariant holds, "every valid message effected" included."""
    failed = [invariant for invariant in result.invariants if not invariant.ok]
    assert not failed, failed
    return True


def by_key(tool, world):
    """Open items by the logical message they carry: (consumer, reason, key) -> id."""
    return {(i.consumer, i.reason, i.key): i.id for i in tool.items()}


@pytest.mark.parametrize("dead_letters", SOURCES)
def test_every_valid_message_gets_exactly_one_effect_and_a_second_replay_changes_nothing(
        make_world, backend, dead_letters, monkeypatch):
    w = make_world(backend)
    # -- Service Bus: one fine, one stuck behind an outage, one processed whose settlement kept
    # failing, one refused by a consumer bug fixed later, one reusing an order id.
    ok, stuck, done = w.order(1, lines=2), w.order(2), w.order(3)
    fixed = w.order(4, lines=3)
    clash = w.order(5, order_id=ok.key, variant=1, expect="conflict")
    lost, fine = w.notification(1), w.notification(2)
    w.api.unreachable.add(("notify", lost.key))  # timed out before reaching the API
    w.lost_settlements.add(done.message_id)
    for item in (ok, done, lost, fine):
        w.send(item)
    w.drain()
    w.stores["orders"].down = True
    w.send(stuck)
    w.drain()
    w.stores["orders"].down = False
    with monkeypatch.context() as patch:
        patch.setattr(domain.orders, "MAX_LINES", 2)  # the bug: orders of 3+ lines refused
        w.send(fixed)
        w.drain()
    w.clock.advance(WINDOW + 1)  # past duplicate detection, so the reused id reaches the consumer
    w.send(clash)
    w.drain()
    w.lost_settlements.clear()
    w.api.unreachable.clear()
    # -- Event Hubs payments: applied, parked while the ledger refused the app (403, not
    # transient: parked, not retried), applied but parked (403 right after the commit), refused
    # by a bug fixed later, a reused CloudEvent id.
    p_ok = w.payment(1, amount=1000)
    p_outage = w.payment(2, amount=200)
    p_applied = w.payment(3, amount=30)
    p_fixed = w.payment(4, amount=5, kind="payment.debit")
    p_clash = w.payment(1, amount=999, variant=1, expect="conflict")
    assert w.process_payments([p_ok]).applied == 1
    w.stores["ledger"].forbidden = True
    assert w.process_payments([p_outage]).parked == {"StoreRejected": 1}
    w.stores["ledger"].forbidden = False
    w.stores["ledger"].lose_next_commit_answer = True
    assert w.process_payments([p_applied]).parked == {"StoreRejected": 1}
    w.stores["ledger"].forbidden = False
    with monkeypatch.context() as patch:
        patch.delitem(domain.payments.EVENT_TYPES, "payment.debit")
        assert w.process_payments([p_fixed]).parked == {"UnknownEventType": 1}
        tool = w.tool(dead_letters)
        fixed_id = next(i.id for i in tool.items() if i.reason == "UnknownEventType")
        [early] = tool.replay([fixed_id])  # before the fix is deployed: still refused, kept open
        assert early.status == "failed" and "UnknownEventType" in early.outcome
    assert w.process_payments([p_clash]).parked == {"IdempotencyKeyConflict": 1}

    assert w.balance() == 1030  # p_ok, and p_applied whose answer was lost
    assert w.dead_lettered() == {"orders": [f"{done.key}:MaxDeliveryCountExceeded",
                                            f"{stuck.key}:MaxDeliveryCountExceeded",
                                            f"{fixed.key}:OrderTooLarge",
                                            f"{ok.key}:IdempotencyKeyConflict"]}
    before = check(w)
    assert core_ok(before)
    assert before.effects["order"] == 2 and before.effects["payment"] == 2  # of 4 valid each
    assert before.effects["notification (notify)"] == 1

    tool = w.tool(dead_letters)
    listed = by_key(tool, w)
    assert set(listed) == {
        ("orders", "MaxDeliveryCountExceeded", stuck.key), ("orders", "MaxDeliveryCountExceeded", done.key),
        ("orders", "OrderTooLarge", fixed.key), ("orders", "IdempotencyKeyConflict", ok.key),
        ("notify", "OutcomeUnknown", lost.key),
        ("payments", "StoreRejected", p_outage.key), ("payments", "StoreRejected", p_applied.key),
        ("payments", "UnknownEventType", p_fixed.key), ("payments", "IdempotencyKeyConflict", p_ok.key)}

    results = {r.id: r for r in tool.replay(filters=Filters(), options=Options(confirm_not_sent=True))}
    status = {key: (results[i].status, results[i].effect) for key, i in listed.items()}
    assert status == {
        ("orders", "MaxDeliveryCountExceeded", stuck.key): ("replayed", "resubmitted"),
        ("orders", "MaxDeliveryCountExceeded", done.key): ("replayed", "resubmitted"),
        ("orders", "OrderTooLarge", fixed.key): ("replayed", "resubmitted"),
        ("orders", "IdempotencyKeyConflict", ok.key): ("refused", None),
        ("notify", "OutcomeUnknown", lost.key): ("replayed", "processed"),
        ("payments", "StoreRejected", p_outage.key): ("replayed", "processed"),
        ("payments", "StoreRejected", p_applied.key): ("replayed", "duplicate"),
        ("payments", "UnknownEventType", p_fixed.key): ("replayed", "processed"),
        ("payments", "IdempotencyKeyConflict", p_ok.key): ("refused", None)}
    assert "will absorb it as a duplicate" in results[listed[("orders", "MaxDeliveryCountExceeded",
                                                              done.key)]].outcome
    deliveries = w.drain()
    assert sorted(deliveries) == sorted([("orders", stuck.key, "complete"),
                                         ("orders", done.key, "complete"),
                                         ("orders", fixed.key, "complete")])

    # Exactly one effect each, read from the stores and the API's log.
    for order in (ok, stuck, done, fixed):
        assert w.order_document(order.key) is not None
    assert w.balance() == 1000 + 200 + 30 - 5
    assert [w.api_calls(channel, n.key) for channel in ("notify", "audit") for n in (lost, fine)] \
        == [1, 1, 1, 1]
    after = check(w)
    assert all_ok(after)
    assert after.effects == {"order": 4, "payment": 4, "notification (notify)": 2,
                             "notification (audit)": 2}
    assert not after.double_effects and not after.lost

    # Marks: who, when, what.
    notify_entry = tool.find(listed[("notify", "OutcomeUnknown", lost.key)]).entry
    assert (notify_entry.resolved, notify_entry.resolution, notify_entry.resolved_by) == (
        True, "replayed", "ops@example.org")
    assert notify_entry.resolved_at == w.clock() and "operator confirmed" in notify_entry.outcome
    fixed_entry = tool.find(listed[("payments", "UnknownEventType", p_fixed.key)]).entry
    assert [step["action"] for step in fixed_entry.history] == ["replay-failed", "replayed"]
    journal = {i.id: i for i in tool.items(Filters(state="replayed", source="deadletter"))}
    assert set(journal) == {listed[("orders", "MaxDeliveryCountExceeded", stuck.key)],
                            listed[("orders", "MaxDeliveryCountExceeded", done.key)],
                            listed[("orders", "OrderTooLarge", fixed.key)]}
    assert all(i.entry.resolved_by == "ops@example.org" for i in journal.values())

    # A second replay, of everything and of each id, changes nothing.
    again = tool.replay(filters=Filters(), options=Options(confirm_not_sent=True))
    assert sorted(r.status for r in again) == ["refused", "refused"]  # the two conflicts
    replayed_ids = [i for key, i in listed.items() if status[key][0] == "replayed"]
    assert {r.status for r in tool.replay(replayed_ids, options=Options(confirm_not_sent=True))} \
        == {"skipped"}
    assert w.drain() == []
    assert w.balance() == 1225 and len(w.api.calls) == 4
    assert check(w).effects == after.effects

    # Discard the conflicts with a note; the DLQ empties, the notes stay.
    clash_id = listed[("orders", "IdempotencyKeyConflict", ok.key)]
    p_clash_id = listed[("payments", "IdempotencyKeyConflict", p_ok.key)]
    with pytest.raises(ReplayError):
        tool.discard(clash_id, "  ")
    assert tool.discard(clash_id, "order id reused by the shop; customer called").status == "discarded"
    assert tool.discard(p_clash_id, "duplicate event id from the PSP, amount wrong").status \
        == "discarded"
    assert tool.discard(p_clash_id, "again").status == "skipped"
    assert tool.items() == [] and w.dead_lettered() == {}
    discarded = {i.id: i.entry for i in tool.items(Filters(state="discarded"))}
    assert discarded[clash_id].note == "order id reused by the shop; customer called"
    assert discarded[p_clash_id].note == "duplicate event id from the PSP, amount wrong"
    assert discarded[p_clash_id].resolved_by == "ops@example.org"
    assert w.balance() == 1225 and w.order_document(ok.key).body["lineCount"] == 2


@pytest.mark.parametrize("dead_letters", SOURCES)
def test_resubmission_keeps_the_original_identity(make_world, backend, dead_letters, monkeypatch):
    w = make_world(backend)
    order = w.order(7, lines=3)
    with monkeypatch.context() as patch:
        patch.setattr(domain.orders, "MAX_LINES", 1)
        w.send(order)
        w.drain()
    [original] = w.namespace.entity("orders").dead_letters
    assert original.dead_letter_reason == "OrderTooLarge"
    w.clock.advance(WINDOW + 1)
    tool = w.tool(dead_letters)
    [result] = tool.replay([f"dlq:orders/{original.sequence_number}"])
    assert result.status == "replayed"
    assert w.namespace.entity("orders").dead_letters == []
    delivery = w.namespace.entity("orders").receive(w.clock())  # what the broker now holds
    copy = delivery.message.sent
    assert copy is not original.sent  # a new message...
    assert (copy.message_id, copy.body, copy.content_type, copy.correlation_id) == (
        order.message_id, order.body_bytes, "application/json", f"corr-{order.key}")
    assert copy.application_properties == {"tenant": "t1", "attempt": 1}  # ...with its identity
    assert not DEAD_LETTER_PROPERTIES & set(copy.application_properties)
    assert delivery.message.sequence_number > original.sequence_number
    w.namespace.entity("orders").abandon(delivery.lock_token, w.clock())
    assert w.drain() == [("orders", order.key, "complete")]
    assert w.order_document(order.key).body["lineCount"] == 3


@pytest.mark.parametrize("dead_letters", SOURCES)
def test_a_copy_the_broker_would_drop_is_not_resubmitted_and_the_dead_letter_is_kept(
        make_world, backend, dead_letters):
    """Inside the duplicate-detection window Service Bus drops a copy with the same MessageId
    silently: completing the dead-lettered one then would lose the message."""
    w = make_world(backend)
    order = w.order(8)
    w.stores["orders"].down = True
    w.send(order)
    w.drain()  # 3 deliveries, 2 lock durations: well inside the 10-minute window
    w.stores["orders"].down = False
    tool = w.tool(dead_letters)
    [item] = tool.items()
    [refused] = tool.replay([item.id])
    assert refused.status == "refused" and "duplicate-detection window" in refused.outcome
    assert len(w.namespace.entity("orders").dead_letters) == 1 and w.order_document(order.key) is None
    w.clock.advance(WINDOW)
    [done] = tool.replay([item.id])
    assert done.status == "replayed"
    assert w.drain() == [("orders", order.key, "complete")]


def test_the_simulator_source_detects_a_dropped_copy(make_world, backend):
    """Had a producer re-sent the id just now, the broker drops the resubmission: the
    simulator's source sees it and keeps the dead-lettered message."""
    w = make_world(backend)
    order = w.order(9)
    w.stores["orders"].down = True
    w.send(order)
    w.drain()
    w.stores["orders"].down = False
    w.clock.advance(WINDOW + 1)
    assert w.send(order)  # the producer retries: accepted, and remembered by duplicate detection
    tool = w.tool("simulator")
    [item] = [i for i in tool.items() if i.source == "deadletter"]
    [result] = tool.replay([item.id])
    assert result.status == "failed" and "dropped" in result.outcome
    assert len(w.namespace.entity("orders").dead_letters) == 1
    assert tool.find(item.id).entry.history[-1]["action"] == "replay-failed"


def test_notifications_need_a_person_when_the_api_ignores_idempotency_keys(make_world, backend):
    w = make_world(backend, honours_key=False)
    note = w.notification(3)
    w.api.unreachable.add(("audit", note.key))
    w.send(note)
    w.drain()
    tool = w.tool("simulator")
    [item] = tool.items()
    assert (item.consumer, item.reason) == ("audit", "OutcomeUnknown")
    _, facts = tool.show(item.id)
    assert facts["dedup"] == "closed as parked (OutcomeUnknown)"
    [refused] = tool.replay([item.id])
    assert refused.status == "refused" and "--confirm-not-sent" in refused.outcome
    assert w.api_calls("audit", note.key) == 0 and not tool.find(item.id).entry.resolved
    [dry] = tool.replay([item.id], options=Options(confirm_not_sent=True, dry_run=True))
    assert dry.status == "would-replay" and w.api_calls("audit", note.key) == 0
    [unlucky] = tool.replay([item.id], options=Options(confirm_not_sent=True))  # times out again
    assert unlucky.status == "failed" and "parked again" in unlucky.outcome
    entry = tool.find(item.id).entry
    assert not entry.resolved and entry.history[-1]["action"] == "replay-failed"
    w.api.unreachable.clear()
    [sent] = tool.replay([item.id], options=Options(confirm_not_sent=True))
    assert sent.status == "replayed" and "closed record re-opened" in sent.outcome
    assert [w.api_calls(c, note.key) for c in ("notify", "audit")] == [1, 1]
    [again] = tool.replay([item.id], options=Options(confirm_not_sent=True))
    assert again.status == "skipped" and w.api_calls("audit", note.key) == 1


def test_a_reopened_notification_already_sent_since_is_absorbed(make_world, backend):
    """If the record was completed meanwhile (the entry's mark got lost), a replay is a
    duplicate: the tool re-opens only a record closed as parked."""
    w = make_world(backend, honours_key=True)
    note = w.notification(4)
    w.send(note)
    w.drain()
    entry_id = w.services.parking.park(consumer="notify", entry_id=note.key, reason="OutcomeUnknown",
                                       payload=note.body, alert=False,
                                       context={"message_id": note.key})
    tool = w.tool("simulator")
    [result] = tool.replay([f"parked:notify/{entry_id}"])
    assert (result.status, result.effect) == ("replayed", "duplicate")
    assert w.api_calls("notify", note.key) == 1


def test_discard_of_a_dead_letter_records_the_note_and_removes_it(make_world, backend):
    w = make_world(backend)
    bad = w.order(10, lines=2)
    body = json.loads(bad.body)
    body["lines"] = []
    bad.body, bad.expect = json.dumps(body), "deadletter:InvalidOrder"
    w.send(bad)
    w.drain()
    tool = w.tool("sdk")
    [item] = tool.items()
    result = tool.discard(item.id, "empty order from the test shop")
    assert result.status == "discarded" and w.dead_lettered() == {}
    journal = tool.find(item.id)
    assert (journal.state, journal.entry.note, journal.entry.resolved_by) == (
        "discarded", "empty order from the test shop", "ops@example.org")
    assert tool.items(Filters(state="all"))[0].entry.payload == bad.body  # the journal keeps it


@pytest.mark.parametrize("dead_letters", SOURCES)
def test_a_dead_letter_whose_claim_the_sweep_closed_is_reopened_not_absorbed(
        make_world, backend, dead_letters):
    """An attempt crashed mid-send, then an outage ran the message out of deliveries; the
    maintenance sweep closed the stale claim as parked. Resubmitted as it is, the copy would be
    absorbed as a duplicate of a send nobody knows happened: the tool re-opens the record
    (with the operator's word when the API ignores keys) and the notification is sent once."""
    w = make_world(backend, honours_key=False)
    note = w.notification(5)
    records(w.services).claim(DedupKey.from_message_id("notify", note.message_id),
                              request_hash(json.loads(note.body)))  # the crashed attempt
    w.stores["notifications"].down = True
    w.send(note)
    w.drain()
    w.stores["notifications"].down = False
    assert sorted(w.dead_lettered()) == ["audit", "notify"]
    w.clock.advance(w.settings.window.length.total_seconds() + 3600)
    assert w.services.maintenance.run().parked == 1
    tool = w.tool(dead_letters)
    (letter,) = tool.items(Filters(source="deadletter", consumer="notify"))
    (refused,) = tool.replay([letter.id])
    assert refused.status == "refused" and "--confirm-not-sent" in refused.outcome
    (sent,) = tool.replay([letter.id], options=Options(confirm_not_sent=True))
    assert sent.status == "replayed" and "re-opened" in sent.outcome
    w.drain()
    assert w.api_calls("notify", note.key) == 1
    (swept,) = tool.items(Filters(source="parked", consumer="notify"))
    assert swept.reason == "StaleInProgress"  # the key alone: a person discards it with a note
