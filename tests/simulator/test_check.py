"""The invariant checker against the local stores: a clean run passes, tampering is caught."""

from __future__ import annotations

import json

import pytest
from azure.data.tables import TableClient

from shared import store_safe_id
from simulator.check import Checker, Evidence, main, read_dead_letters, scan
from simulator.scenario import Endpoints, ScenarioConfig, app_settings, run_scenario
from simulator.workload import generate

_runs: dict[str, object] = {}


@pytest.fixture
def stack(sim_endpoints):
    """The harness's own servers (see conftest), in place of the session stack."""
    return sim_endpoints


def endpoints_of(stack) -> Endpoints:
    return Endpoints(table_connection_string=stack.table_connection_string,
                     cosmos_endpoint=stack.cosmos_endpoint, cosmos_key=stack.cosmos_key,
                     cosmos_verify=stack.cosmos_verify)


def clean_run(stack, backend: str, tag: str):
    """A small fault-free scenario (duplicates on), run once per backend and tag."""
    if (backend, tag) not in _runs:
        config = ScenarioConfig(backend=backend, seed=21, messages=120, events=120,
                                fault_rate=0, duplicate_rate=0.3, tag=tag)
        _runs[(backend, tag)] = run_scenario(config, endpoints_of(stack))
    return _runs[(backend, tag)]


@pytest.fixture
def app_env(monkeypatch, stack):
    def install(result):
        for name, value in app_settings(result.config, endpoints_of(stack)).items():
            monkeypatch.setenv(name, value)
    return install


def ledger_file(tmp_path, result) -> str:
    path = tmp_path / "sent.json"
    path.write_text(json.dumps(result.workload.ledger(hub=f"payments-{result.config.run_id}")))
    return str(path)


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_clean_run_passes_every_invariant(stack, backend):
    result = clean_run(stack, backend, "a")
    assert result.ok, [i for i in result.check.invariants if not i.ok]
    assert sum(result.stats.duplicates.values()) > 0
    assert result.check.effects["order"] > 0 and result.check.effects["payment"] > 0


def test_cli_reads_the_stores_from_app_settings_and_passes(stack, app_env, tmp_path, capsys):
    result = clean_run(stack, "table", "a")
    app_env(result)
    assert main(["--sent", ledger_file(tmp_path, result), "--in-progress",
                 "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "[PASS] exactly one effect per message" in out
    assert "meant to be dead-lettered, not verified" in out  # the DLQs were not read
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True


def test_a_duplicated_order_document_is_a_double_effect(stack, app_env, tmp_path, capsys):
    result = clean_run(stack, "table", "b")
    item = next(i for i in result.workload.items if i.kind == "order" and i.expect == "effect")
    table = TableClient.from_connection_string(stack.table_connection_string, "orders")
    pk = store_safe_id(item.key)
    entity = dict(table.get_entity(pk, pk))
    table.create_entity({**entity, "RowKey": pk + "-copy"})
    app_env(result)
    assert main(["--sent", ledger_file(tmp_path, result)]) == 1
    assert "[FAIL] exactly one effect per message" in capsys.readouterr().out


def test_a_missing_order_is_lost_and_a_wrong_balance_is_caught(stack, app_env, tmp_path, capsys):
    result = clean_run(stack, "table", "c")
    items = [i for i in result.workload.items if i.kind == "order" and i.expect == "effect"]
    orders = TableClient.from_connection_string(stack.table_connection_string, "orders")
    pk = store_safe_id(items[0].key)
    orders.delete_entity(pk, pk)
    ledger = TableClient.from_connection_string(stack.table_connection_string, "ledger")
    account = next(r for r in scan_table(ledger, result.config.run_id) if r.get("kind") == "account")
    ledger.update_entity({"PartitionKey": account["PartitionKey"], "RowKey": account["RowKey"],
                          "balanceCents": int(account["balanceCents"]) + 1})
    app_env(result)
    assert main(["--sent", ledger_file(tmp_path, result)]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] nothing lost" in out and "[FAIL] each account balance" in out
    assert items[0].key in out


def scan_table(table, prefix):
    return list(table.query_entities("PartitionKey ge @lo and PartitionKey lt @hi",
                                     parameters={"lo": prefix, "hi": prefix + "~"}))


def test_a_record_left_in_progress_is_reported(stack, tmp_path):
    from shared import DedupKey, Idempotency, request_hash
    from simulator.check import stores_from_settings

    result = clean_run(stack, "table", "a")
    env = app_settings(result.config, endpoints_of(stack))
    stores, _ = stores_from_settings(env)
    Idempotency(stores.notifications).claim(
        DedupKey("notify", f"{result.config.run_id}-NTF-stuck"), request_hash("x"))
    check = Checker(result.workload.items, stores, run_id=result.config.run_id,
                    hub=env["PAYMENTS_HUB_NAME"], evidence=Evidence(dead_letters=[])).run()
    assert check.in_progress == 1
    assert not next(i for i in check.invariants if i.name.startswith("no record")).ok


def test_nothing_processed_means_everything_lost(stack, tmp_path):
    workload = generate(seed=3, messages=40, events=40, run_id="never1")
    env = app_settings(ScenarioConfig(backend="table", tag="never1"), endpoints_of(stack))
    from simulator.check import stores_from_settings

    stores, _ = stores_from_settings(env)
    check = Checker(workload.items, stores, run_id="never1", hub="payments",
                    evidence=Evidence(dead_letters=[], api_calls=[])).run()
    assert not check.ok and sum(check.lost.values()) >= 70


class FakeDeadLetter:
    def __init__(self, item, seq, reason):
        self.message_id = item.message_id
        self.body = iter([item.body_bytes])
        self.sequence_number = seq
        self.dead_letter_reason = reason
        self.dead_letter_error_description = "why"


class FakeReceiver:
    def __init__(self, messages):
        self.messages = messages

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def peek_messages(self, max_message_count, sequence_number):
        return [m for m in self.messages if m.sequence_number >= sequence_number][:max_message_count]


def test_dead_letter_queues_are_peeked_and_matched_to_the_ledger():
    workload = generate(seed=4, messages=200, events=0, run_id="dlq1")
    bad = [i for i in workload.items if i.expect.startswith("deadletter")]
    notification = next(i for i in workload.items if i.kind == "notification")

    class Client:
        def get_queue_receiver(self, name, sub_queue):
            return FakeReceiver([FakeDeadLetter(i, n, i.expect.split(":")[1])
                                 for n, i in enumerate(bad)] if name == "orders" else [])

        def get_subscription_receiver(self, topic, subscription, sub_queue):
            return FakeReceiver([FakeDeadLetter(notification, 7, "MaxDeliveryCountExceeded")]
                                if subscription == "audit" else [])

    letters = read_dead_letters(Client(), workload.items)
    assert {(letter.consumer, letter.logical) for letter in letters} == \
        {("orders", i.logical) for i in bad} | {("audit", notification.logical)}
    assert all(letter.reason for letter in letters)


def test_scan_filters_by_partition_prefix(stack):
    result = clean_run(stack, "cosmos", "a")
    env = app_settings(result.config, endpoints_of(stack))
    from simulator.check import stores_from_settings

    stores, _ = stores_from_settings(env)
    rows = scan(stores.orders, result.config.run_id)
    assert rows and all(str(r["_partition"]).startswith(result.config.run_id) for r in rows)
