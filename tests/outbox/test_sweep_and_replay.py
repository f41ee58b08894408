"""What no redelivery repairs: the maintenance sweep and the replay tool dispatch pending
outgoing messages (the app's services on Azurite and the Cosmos server)."""

from __future__ import annotations

import asyncio
import json
import uuid

from replay.__main__ import parse_args, run
from replay.tool import ReplayTool, pending_outgoing
from shared._flows.parking import ParkingLot
from shared._triggers.servicebus import MessageView
from tests.functions.conftest import api, services, services_for  # noqa: F401 - fixtures


def order(order_id: str) -> MessageView:
    body = {"orderId": order_id, "customerId": "C-1", "currency": "EUR",
            "lines": [{"sku": "A", "quantity": 1, "unitPrice": 2.5}]}
    return MessageView(message_id=order_id, body=json.dumps(body).encode(),
                          correlation_id="corr-s")


def commit_without_dispatch(services, order_id: str) -> None:  # noqa: F811 - the fixture's name
    services.dispatcher.fail_next()
    decision = asyncio.run(services.orders.handle(order(order_id)))
    assert decision.action.value == "abandon"  # transient: the message would come back
    assert services.stores["orders"].get_record(order_id, order_id).outbox


def test_the_sweep_dispatches_what_is_pending_past_its_age_and_reports_the_oldest(services, clock):  # noqa: F811
    order_id = f"ORD-{uuid.uuid4().hex[:10]}"
    commit_without_dispatch(services, order_id)
    services.maintenance.run()
    assert services.dispatcher.sent == []  # not old enough
    clock.advance(services.settings.outbox_sweep_age.total_seconds() + 5)
    report = services.maintenance.run()
    assert report.outbox_dispatched >= 1 and report.outbox_failed == 0
    assert report.oldest_pending_age >= services.settings.outbox_sweep_age.total_seconds()
    assert [m.destination for m in services.dispatcher.sent
            if order_id.encode() in m.body] == [services.settings.notifications_topic]
    assert services.stores["orders"].get_record(order_id, order_id).outbox == ()
    assert services.maintenance.run().outbox_pending == 0


def test_the_sweep_keeps_what_still_fails_for_the_next_run(services, clock):  # noqa: F811
    order_id = f"ORD-{uuid.uuid4().hex[:10]}"
    commit_without_dispatch(services, order_id)
    clock.advance(services.settings.outbox_sweep_age.total_seconds() + 5)
    services.dispatcher.fail_next(1000)  # the broker is down for the whole sweep
    report = services.maintenance.run()
    assert report.outbox_failed >= 1
    assert services.stores["orders"].get_record(order_id, order_id).outbox


def test_replay_lists_pending_messages_dry_runs_then_dispatches(services, clock, capsys):  # noqa: F811
    order_id = f"ORD-{uuid.uuid4().hex[:10]}"
    commit_without_dispatch(services, order_id)
    clock.advance(1)
    now = clock()
    (listed,) = [p for p in pending_outgoing(services, older_than=0, now=now) if p.key == order_id]
    assert listed.status == "pending" and listed.messages[0]["destination"] == "notifications"
    tool = ReplayTool(services, ParkingLot(services.stores["parked"]), None, operator="t",
                      clock=clock)
    assert run(tool, parse_args(["outbox", "--dispatch", "--dry-run", "--no-servicebus"])) == 0
    assert "would dispatch" in capsys.readouterr().out
    assert not [m for m in services.dispatcher.sent if order_id.encode() in m.body]
    assert run(tool, parse_args(["outbox", "--dispatch", "--json", "--no-servicebus"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in out if p["key"] == order_id] == ["dispatched"]
    assert len([m for m in services.dispatcher.sent if order_id.encode() in m.body]) == 1
    assert not [p for p in pending_outgoing(services, older_than=0, now=now) if p.key == order_id]
