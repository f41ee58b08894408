"""`python -m replay`: the commands' text and JSON, argument rules, and the tool built from
app settings alone (a fresh process against Azurite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

import domain.orders
import domain.payments
from functions.services import real_stores
from functions.settings import Settings
from replay.__main__ import duration, parse_args, run
from replay.tool import Filters, Options
from shared._flows.parking import ParkingLot

from .conftest import WINDOW


def command(tool, capsys, *argv: str) -> tuple[int, str]:
    code = run(tool, parse_args(list(argv)))
    return code, capsys.readouterr().out


def test_a_session_in_text_and_json(make_world, backend, capsys, monkeypatch):
    w = make_world(backend, honours_key=False)
    big = w.order(1, lines=2)
    with monkeypatch.context() as patch:
        patch.setattr(domain.orders, "MAX_LINES", 1)
        w.send(big)
        w.drain()
    pay = w.payment(1, amount=250)
    w.stores["ledger"].forbidden = True
    w.process_payments([pay])
    w.stores["ledger"].forbidden = False
    w.clock.advance(WINDOW + 5)
    tool = w.tool("sdk", operator="alice")

    code, out = command(tool, capsys, "list")
    assert code == 0
    assert "dlq:orders/" in out and "OrderTooLarge" in out and big.key in out
    assert "parked:payments/" in out and "StoreRejected" in out and "10m05s" in out
    assert "2 item(s): 1 parked, 1 dead-lettered" in out
    code, out = command(tool, capsys, "list", "--json", "--consumer", "payments")
    [listed] = json.loads(out)
    assert (listed["source"], listed["reason"], listed["key"], listed["state"]) == (
        "parked", "StoreRejected", pay.key, "open")
    code, out = command(tool, capsys, "list", "--filter", "reason=OrderTooLarge,older-than=10m")
    assert "dlq:orders/" in out and "parked:" not in out
    code, out = command(tool, capsys, "list", "--newer-than", "1m")
    assert "nothing to show" in out

    dlq_id = next(i.id for i in tool.items() if i.source == "deadletter")
    code, out = command(tool, capsys, "show", dlq_id)
    assert f"MessageId={big.key}" in out and '"tenant": "t1"' in out and "no effect recorded" in out
    code, out = command(tool, capsys, "show", "--json", listed["id"])
    shown = json.loads(out)
    assert shown["facts"] == {"dedup": "no effect recorded"}
    assert shown["parked"]["context"]["partition_id"] == "0"

    code, out = command(tool, capsys, "replay", "--all", "--dry-run")
    assert code == 0 and out.endswith("2 would-replay\n") and w.balance() == 0
    code, out = command(tool, capsys, "replay", "--all")
    assert code == 0 and "2 replayed" in out and "applied: +250 cents" in out
    assert w.drain() == [("orders", big.key, "complete")] and w.balance() == 250
    code, out = command(tool, capsys, "replay", "--json", dlq_id, listed["id"])
    assert [r["status"] for r in json.loads(out)] == ["skipped", "skipped"]
    code, out = command(tool, capsys, "list", "--state", "replayed")
    assert out.count("replayed") == 2
    code, out = command(tool, capsys, "show", listed["id"])
    assert "replayed by alice: applied: +250 cents" in out
    assert w.balance() == 250


def test_failed_replays_exit_1_and_unknown_ids_are_errors(make_world, backend, capsys, monkeypatch):
    w = make_world(backend)
    debit = w.payment(2, amount=5, kind="payment.debit")
    with monkeypatch.context() as patch:
        patch.delitem(domain.payments.EVENT_TYPES, "payment.debit")
        w.process_payments([debit])
        tool = w.tool("simulator")
        [item] = tool.items()
        code, out = command(tool, capsys, "replay", item.id)
    assert code == 1 and "still invalid: UnknownEventType" in out
    from replay.tool import ReplayError

    with pytest.raises(ReplayError, match="unknown id"):
        command(tool, capsys, "show", "nonsense")
    with pytest.raises(ReplayError, match="not in the dead-letter queue"):
        command(tool, capsys, "replay", "dlq:orders/999")
    with pytest.raises(ReplayError, match="not a Service Bus consumer"):
        command(tool, capsys, "replay", "dlq:payments/1")


def test_argument_rules():
    assert duration("90") == 90 and duration("30m") == 1800 and duration("2h") == 7200
    assert duration("1.5d") == 129600
    for argv in (["replay"], ["replay", "x", "--all"], ["discard", "x"],
                 ["list", "--filter", "colour=red"], ["list", "--older-than", "soon"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    args = parse_args(["replay", "--filter", "consumer=payments,older-than=1h"])
    assert (args.consumer, args.older_than) == ("payments", 3600.0)


def test_the_command_runs_on_app_settings_alone(stack, tmp_path):
    """A fresh process builds everything from the app's settings (here a local.settings.json),
    as an operator runs it; the stores are the real ones the app uses."""
    hub = f"payments-{uuid.uuid4().hex[:8]}"
    values = {"DEDUP_BACKEND": "table", "TABLE_CONNECTION_STRING": stack.table_connection_string,
              "NOTIFICATION_API_URL": "http://notifications.test.invalid/send",
              "PAYMENTS_HUB_NAME": hub}
    settings_file = tmp_path / "local.settings.json"
    settings_file.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    settings = Settings.from_env(values)
    parked = real_stores(settings)("parked")
    ParkingLot(parked).park(
        consumer="payments", entry_id=f"{hub}/0/7", reason="UnknownEventType",
        payload='{"specversion":"1.0"}', alert=False, context={"partition_id": "0"})
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SERVICEBUS", "ServiceBus", "DEDUP", "TABLE", "COSMOS"))}

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "replay", *argv, "--settings", str(settings_file)],
                              capture_output=True, text=True, env=clean, timeout=120, check=False)

    listed = cli("list", "--json", "--consumer", "payments")
    assert listed.returncode == 0, listed.stderr
    assert "dead-letter queues not read" in listed.stderr
    assert f"parked:payments/{hub}/0/7" in [i["id"] for i in json.loads(listed.stdout)]
    discarded = cli("discard", f"parked:payments/{hub}/0/7", "--note", "test event", "--operator",
                    "cli-test")
    assert discarded.returncode == 0, discarded.stderr
    shown = json.loads(cli("show", "--json", f"parked:payments/{hub}/0/7").stdout)
    assert (shown["state"], shown["resolvedBy"], shown["note"]) == ("discarded", "cli-test", "test event")


def test_replay_all_reports_each_item_as_it_completes_with_a_running_tally(
        make_world, backend, capsys, monkeypatch):
    w = make_world(backend)
    big = w.order(1, lines=2)
    with monkeypatch.context() as patch:
        patch.setattr(domain.orders, "MAX_LINES", 1)
        w.send(big)
        w.drain()
    first, clash = w.payment(1, amount=250), w.payment(1, amount=999, variant=1, expect="conflict")
    later = w.payment(2, amount=40)
    assert w.process_payments([first]).applied == 1
    assert w.process_payments([clash]).parked == {"IdempotencyKeyConflict": 1}
    w.stores["ledger"].forbidden = True
    w.process_payments([later])
    w.stores["ledger"].forbidden = False
    w.clock.advance(WINDOW + 5)

    # As it goes: when an item is reported, it is done and the ones after it are not started.
    tool = w.tool("simulator", operator="alice")
    seen = []

    def progress(result, done, total):
        states = [i.state for i in tool.items(Filters(state="all"))]
        seen.append((result.status, done, total, states.count("replayed")))

    results = tool.replay(filters=Filters(), options=Options(dry_run=False), progress=progress)
    assert [(s, d, t) for s, d, t, _ in seen] == [(r.status, n, 3) for n, r in enumerate(results, 1)]
    replayed_so_far = [sum(r.status == "replayed" for r in results[:n]) for n in (1, 2, 3)]
    assert [found for *_, found in seen] == replayed_so_far

    # The command: one line per item with the tally so far, then the totals.
    w2 = make_world(backend)
    for n in (1, 2):
        w2.stores["ledger"].forbidden = True
        w2.process_payments([w2.payment(n, amount=10 * n)])
        w2.stores["ledger"].forbidden = False
    code, out = command(w2.tool("sdk", operator="bob"), capsys, "replay", "--all")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3, out
    assert lines[0].startswith("[1/2] replayed ") and lines[0].endswith("(1 replayed)")
    assert lines[1].startswith("[2/2] replayed ") and lines[1].endswith("(2 replayed)")
    assert lines[2] == "2 replayed"

    # --json: stdout stays one JSON document; the progress lines go to stderr.
    w3 = make_world(backend)
    w3.stores["ledger"].forbidden = True
    w3.process_payments([w3.payment(1, amount=5)])
    w3.stores["ledger"].forbidden = False
    code = run(w3.tool("sdk"), parse_args(["replay", "--all", "--json"]))
    captured = capsys.readouterr()
    assert code == 0 and [r["status"] for r in json.loads(captured.out)] == ["replayed"]
    assert captured.err.startswith("[1/1] replayed ") and captured.err.endswith("(1 replayed)\n")
