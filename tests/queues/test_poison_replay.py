"""`python -m replay` on the Storage Queue poison queue: Azurite's queue service, the app's
stores, the order_audit function in the real worker.

What the tool promises (docs/operations.md#where-a-message-can-end-up): a valid message the
consumer poisoned comes back as the original (its id and body), once; bad input and reused
keys stay refused unless asked for; the envelope leaves the poison queue only after its
resubmission is on the main queue; bad input to the tool deletes nothing.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

import pytest

import replay.__main__ as cli
from replay.poison import QueueRef, StoragePoisonQueues
from replay.stores import document_lister
from replay.tool import Filters, Options, ReplayError, ReplayTool
from shared._flows.parking import ParkingLot
from shared._triggers.queue_messages import QueueMessageView, poison_envelope, read_envelope

pytestmark = pytest.mark.timeout(300)


def order(order_id: str | None = None, total: float = 10.0) -> dict[str, Any]:
    return {"type": "OrderAccepted", "orderId": order_id or f"o-{uuid.uuid4().hex[:8]}",
            "customerId": f"c-{uuid.uuid4().hex[:8]}", "currency": "EUR", "total": total,
            "lineCount": 1}


def tool_for(rig, connection: str, *, queue: str | None = None) -> ReplayTool:
    parked = rig.services.stores["parked"]
    poison = StoragePoisonQueues.connect(
        [QueueRef("order_audit", queue or rig.queue.queue_name)], connection_string=connection)
    return ReplayTool(rig.services, ParkingLot(parked, lister=document_lister(parked)), None,
                      operator="alice", clock=time.time, poison=poison)


def poison_now(rig, body: dict[str, Any] | bytes, *, reason: str = "MaxDequeueCountReached",
               message_id: str | None = None, copies: int = 1) -> str:
    """Write the consumer's envelope for a message to the poison queue (`copies` times: the
    poison write is at least once); the original message id."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    original = message_id or f"m-{uuid.uuid4().hex[:8]}"
    text = poison_envelope(QueueMessageView(original, raw, 5), consumer="order_audit",
                           reason=reason, detail="Transient: store answered 503")
    for _ in range(copies):
        rig.poison.send_message(base64.b64encode(text.encode()).decode())
    return original


def poison_count(rig) -> int:
    return len(rig.poison.peek_messages(max_messages=32))


def audited(rig, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    summary = rig.trail.summary(body["customerId"]) or {"orders": 0}
    return int(summary["orders"]), rig.trail.entry(body["customerId"], body["orderId"])


def test_a_message_poisoned_by_a_long_outage_comes_back_once_through_the_real_worker(
        make_rig, queue_service):
    """The outage outlasts the dequeue window: the consumer poisons the valid message on its
    last delivery. After it, the replay resubmits the original and the function applies it
    once; the envelope is gone."""
    rig = make_rig(max_dequeue_count=2)
    body = order()
    original = rig.send(body)
    rig.outage.forced = True  # the store answers 503 until the message is poisoned
    rig.host(max_dequeue_count=2, visibility_timeout=0.5).run_until_drained(timeout=60)
    rig.outage.forced = False  # the store is back
    tool = tool_for(rig, queue_service)
    (item,) = tool.items(Filters(source="poison"))
    assert (item.reason, item.key, item.state) == ("MaxDequeueCountReached", original, "open")
    assert tool.show(item.id)[1]["dedup"] == "no effect recorded"

    (result,) = tool.replay([item.id])
    assert result.status == "replayed", result.outcome
    assert f"carrying the original id {original}" in result.outcome
    assert poison_count(rig) == 0, "the envelope left the poison queue after the send"
    host = rig.host()
    host.run_until_drained(timeout=60)
    (delivery,) = host.stats.deliveries
    assert delivery.outcome == "deleted" and delivery.message_id != original
    assert audited(rig, body)[0] == 1
    assert tool.items(Filters(source="poison")) == []
    (journal,) = tool.items(Filters(source="poison", state="all"))
    assert journal.state == "replayed" and journal.key == original


def test_replaying_two_envelopes_of_one_message_and_an_applied_one_gives_one_effect(
        make_rig, queue_service):
    """The poison write is at least once (two envelopes of one message), and a message can be
    poisoned after its effect committed (a re-send): every copy comes back, one effect."""
    rig = make_rig()
    twice, applied = order(), order()
    rig.send(applied)
    rig.host().run_until_drained(timeout=60)
    poison_now(rig, twice, copies=2)
    poison_now(rig, applied)
    tool = tool_for(rig, queue_service)
    facts = [tool.show(i.id)[1]["dedup"] for i in tool.items(Filters(source="poison"))]
    assert sorted(facts) == ["completed", "no effect recorded", "no effect recorded"]

    results = tool.replay(filters=Filters(source="poison"))
    assert [r.status for r in results] == ["replayed"] * 3
    rig.host().run_until_drained(timeout=60)
    assert audited(rig, twice)[0] == 1 and audited(rig, applied)[0] == 1
    assert poison_count(rig) == 0 and tool.replay(filters=Filters(source="poison")) == []


def test_the_same_resubmission_delivered_twice_is_absorbed(make_rig, queue_service):
    """A replay whose envelope could not be deleted may be replayed again: the consumer's
    dedup, keyed as the original, absorbs the second copy."""
    rig = make_rig()
    body = order()
    poison_now(rig, body)
    tool = tool_for(rig, queue_service)
    (item,) = tool.items(Filters(source="poison"))
    from shared._triggers.queue_messages import resubmission

    assert item.poisoned is not None and item.poisoned.envelope is not None
    text = resubmission(item.poisoned.envelope, by="alice")
    rig.producer.send_message(text)
    rig.producer.send_message(text)
    rig.host().run_until_drained(timeout=60)
    assert audited(rig, body)[0] == 1


def test_refusals_stay_refused_unless_asked_for_and_nothing_is_deleted(make_rig, queue_service):
    rig = make_rig()
    first = order()
    rig.send(first)
    rig.host().run_until_drained(timeout=60)
    rig.send({**first, "total": 99.0})  # the same order id, other content
    rig.send({"type": "OrderAccepted", "customerId": "c"})  # no order id
    rig.host().run_until_drained(timeout=60)
    tool = tool_for(rig, queue_service)
    reasons = sorted(i.reason for i in tool.items(Filters(source="poison")))
    assert reasons == ["IdempotencyKeyConflict", "InvalidOrderAccepted"]

    refused = tool.replay(filters=Filters(source="poison"))
    assert [r.status for r in refused] == ["refused", "refused"]
    assert all("--include-refused" in r.outcome and "nothing deleted" in r.outcome
               for r in refused)
    assert poison_count(rig) == 2

    (conflict,) = tool.items(Filters(source="poison", reason="IdempotencyKeyConflict"))
    (again,) = tool.replay([conflict.id], options=Options(include_refused=True))
    assert again.status == "replayed"
    rig.host().run_until_drained(timeout=60)
    count, entry = audited(rig, first)
    assert count == 1 and entry is not None and entry["totalCents"] == 1000, "first content kept"
    texts = [read_envelope(base64.b64decode(m.content)) for m in rig.poison.peek_messages(32)]
    assert sorted(t["reason"] for t in texts) == ["IdempotencyKeyConflict", "InvalidOrderAccepted"]


def test_bad_input_to_the_tool_gets_a_clear_answer_and_deletes_nothing(make_rig, queue_service):
    rig = make_rig()
    rig.poison.send_message(base64.b64encode(b'{"not": "an envelope"}').decode())
    rig.poison.send_message("not base64 at all!")
    cut = json.loads(poison_envelope(QueueMessageView("m-big", b"x" * 60_000, 5),
                                     consumer="order_audit", reason="MaxDequeueCountReached",
                                     detail="Transient"))
    assert cut["bodyTruncated"] is True
    cut["body"] = cut["body"][:100]  # Azurite's 64 KiB limit: a short cut body says the same
    rig.poison.send_message(base64.b64encode(json.dumps(cut).encode()).decode())
    tool = tool_for(rig, queue_service)
    reasons = sorted(i.reason for i in tool.items(Filters(source="poison")))
    assert reasons == ["MaxDequeueCountReached", "NotAnEnvelope", "NotAnEnvelope"]

    results = {r.id: r for r in tool.replay(filters=Filters(source="poison"),
                                            options=Options(include_refused=True))}
    assert [r.status for r in results.values()] == ["refused"] * 3
    outcomes = " | ".join(r.outcome for r in results.values())
    assert "not an envelope the consumer wrote" in outcomes and "--host-copies" in outcomes
    assert "not base64 text" in outcomes and "re-send it from its source" in outcomes
    assert "the body was cut to fit the poison queue" in outcomes
    assert poison_count(rig) == 3, "nothing deleted"
    with pytest.raises(ReplayError, match="poison:order_audit/nope is not in"):
        tool.replay(["poison:order_audit/nope"])
    with pytest.raises(ReplayError, match="'payments' is not a queue consumer"):
        tool.show("poison:payments/x")

    missing = tool_for(rig, queue_service, queue=f"nowhere-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ReplayError, match=r"-poison' does not exist in this account.*nothing "
                                          r"deleted"):
        missing.items(Filters(source="poison"))


def test_a_main_queue_that_does_not_exist_leaves_the_envelope(make_rig, queue_service):
    rig = make_rig()
    poison_now(rig, order())
    tool = tool_for(rig, queue_service)
    rig.queue.delete_queue()
    (result,) = tool.replay(filters=Filters(source="poison"))
    assert result.status == "failed" and "does not exist: nothing sent, the envelope stays" \
        in result.outcome
    assert poison_count(rig) == 1


def test_an_envelope_left_behind_after_its_resubmission_is_replayed_once(make_rig, queue_service):
    """The send succeeded, the delete did not: the item is recorded as replayed; the next run
    skips it and removes the envelope left behind, sending nothing more."""
    rig = make_rig()
    body = order()
    poison_now(rig, body)
    tool = tool_for(rig, queue_service)
    source = tool.poison
    assert isinstance(source, StoragePoisonQueues)
    real_delete = source._delete

    def lost_answer(message: Any, held: Any) -> None:
        from azure.core.exceptions import ServiceRequestError

        raise ServiceRequestError("connection reset")

    source._delete = lost_answer  # the delete's answer is lost
    (first,) = tool.replay(filters=Filters(source="poison"))
    assert first.status == "replayed" and "the envelope could not be deleted" in first.outcome
    assert poison_count(rig) == 1, "released again at the end of the run"
    source._delete = real_delete
    (second,) = tool.replay(filters=Filters(source="poison"))
    assert second.status == "skipped" and second.outcome.startswith("already replayed by alice")
    assert poison_count(rig) == 0
    rig.host().run_until_drained(timeout=60)
    assert audited(rig, body)[0] == 1
    assert rig.queue.get_queue_properties().approximate_message_count == 0


def test_filters_select_by_consumer_reason_message_id_and_age(make_rig, queue_service):
    rig = make_rig()
    one = poison_now(rig, order())
    poison_now(rig, order(), reason="StoreRejected")
    tool = tool_for(rig, queue_service)
    assert [i.key for i in tool.items(Filters(source="poison", message_id=one))] == [one]
    assert len(tool.items(Filters(source="poison", reason="StoreRejected"))) == 1
    assert len(tool.items(Filters(consumer="order_audit"))) == 2
    assert tool.items(Filters(consumer="payments", source="poison")) == []
    assert len(tool.items(Filters(source="poison", newer_than=600))) == 2
    assert tool.items(Filters(source="poison", older_than=600)) == []


def test_the_command_line_lists_shows_replays_and_discards_poison_envelopes(
        make_rig, queue_service, capsys):
    rig = make_rig()
    kept, dropped = order(), order()
    kept_id, dropped_id = poison_now(rig, kept), poison_now(rig, dropped)
    tool = tool_for(rig, queue_service)

    def run(*argv: str) -> tuple[int, str]:
        code = cli.run(tool, cli.parse_args(list(argv)))
        return code, capsys.readouterr().out

    code, out = run("list", "--source", "poison")
    assert code == 0 and "2 item(s): 0 parked, 0 dead-lettered, 2 poisoned" in out
    (drop,) = tool.items(Filters(source="poison", message_id=dropped_id))
    code, out = run("discard", drop.id, "--note", "cancelled by the customer")
    assert code == 0 and "removed from the poison queue; note kept" in out
    code, out = run("replay", "--source", "poison", "--message-id", kept_id, "--dry-run")
    assert code == 0 and "1 would-replay" in out
    code, out = run("replay", "--source", "poison")
    assert code == 0 and "1 replayed" in out
    code, out = run("show", drop.id)
    assert "poison queue envelope" in out and "discarded by alice" in out
    assert "cancelled by the customer" in out
    rig.host().run_until_drained(timeout=60)
    assert audited(rig, kept)[0] == 1 and audited(rig, dropped)[0] == 0


@pytest.mark.parametrize("reason", ["StaleInProgress", "OutcomeUnknown"])
def test_an_effect_of_unknown_outcome_waits_for_a_person(make_rig, queue_service, reason):
    rig = make_rig()
    body = order()
    poison_now(rig, body, reason=reason)
    tool = tool_for(rig, queue_service)
    (refused,) = tool.replay(filters=Filters(source="poison"))
    assert refused.status == "refused" and "Reconcile it with the downstream" in refused.outcome
    assert poison_count(rig) == 1
    (replayed,) = tool.replay(filters=Filters(source="poison"),
                              options=Options(include_refused=True))
    assert replayed.status == "replayed" and poison_count(rig) == 0
    rig.host().run_until_drained(timeout=60)
    assert audited(rig, body)[0] == 1
