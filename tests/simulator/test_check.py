"""The invariant checker against the local stores: a clean run passes, tampering is caught."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest
from azure.data.tables import TableClient

from shared._core.keys import store_safe_id
from shared._flows.parking import ParkingLot
from simulator.check import (
    CONSUMERS,
    Checker,
    DeadLetter,
    Evidence,
    format_result,
    is_operational,
    main,
    read_dead_letters,
    scan,
    valid_line,
)
from simulator.scenario import Endpoints, ScenarioConfig, ScenarioResult, app_settings, run_scenario
from simulator.workload import generate

_runs: dict[tuple[str, str], ScenarioResult] = {}


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


def evidence_of(result: ScenarioResult) -> Evidence:
    """What a finished scenario gave its checker (every run here has it)."""
    assert result.evidence is not None
    return result.evidence


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


# -- every valid message effected; invalid input rejected on its first delivery -----------
def checker_for(stack, result, evidence):
    from simulator.check import stores_from_settings

    env = app_settings(result.config, endpoints_of(stack))
    stores, _ = stores_from_settings(env)
    return Checker(result.workload.items, stores, run_id=result.config.run_id,
                   hub=env["PAYMENTS_HUB_NAME"], evidence=evidence)


def invariant(check, prefix):
    return next(i for i in check.invariants if i.name.startswith(prefix))


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_hostile_input_is_rejected_with_a_reason_on_its_first_delivery(stack, backend):
    result = clean_run(stack, backend, "a")
    check = result.check
    hostile = [i for i in result.workload.items if i.case]
    assert len(hostile) >= 35 and any(i.case == "oversize" for i in hostile)
    assert check.invalid_not_rejected == {}, check.invalid_not_rejected
    assert check.rejection_reasons and not any(is_operational(r) for r in check.rejection_reasons)
    # Each hostile message was refused by its consumer(s) with a reason on the first delivery
    # (a later one only after the host crashed before settling: the duplicate-provoking faults
    # are on); none reached the host as an exception and no Event Hubs batch was retried.
    evidence = evidence_of(result)
    for item in (i for i in hostile if i.kind != "payment"):
        if (item.logical, item.variant) in evidence.broker_dropped:
            continue
        letters = [d for d in evidence.dead_letters
                   if (d.logical, d.variant) == (item.logical, item.variant)]
        assert {d.consumer for d in letters} == set(CONSUMERS[item.kind]), item.case
        for letter in letters:
            crashes = evidence.outcomes[(letter.consumer, item.logical, 0)]["crash"]
            assert letter.delivery_count <= 1 + crashes, (item.case, letter)
    assert check.host_exceptions == {} and result.stats.host_retries == 0
    assert result.stats.gave_up == 0 and check.stalled_batches == 0
    assert sum(check.valid_not_effected.values()) == 0 and not check.valid_also_refused


def test_a_valid_notification_dead_lettered_is_not_effected_although_nothing_is_lost(stack):
    result = clean_run(stack, "table", "a")
    item = next(i for i in result.workload.items if i.kind == "notification" and not i.invalid)
    evidence = replace(
        evidence_of(result),
        api_calls=[c for c in evidence_of(result).api_calls
                   if (c.channel, c.notification_id) != ("audit", item.key)],
        dead_letters=[*evidence_of(result).dead_letters,
                      DeadLetter("audit", item.logical, 0, "MaxDeliveryCountExceeded", "", 10)])
    check = checker_for(stack, result, evidence).run()
    assert check.valid_not_effected == {"notification: dead-lettered: MaxDeliveryCountExceeded": 1}
    assert sum(check.lost.values()) == 0  # "nothing lost" alone would have passed this
    assert not invariant(check, "every valid message effected").ok
    assert "valid messages not effected: 1" in format_result(check)


def test_a_copy_run_out_by_injected_faults_alone_is_listed_not_counted(stack):
    """Effected, and a redundant copy dead-lettered by the broker after all ten of its
    deliveries drew a fault from the harness: no decision of the app; one clean delivery
    among them and it counts."""
    result = clean_run(stack, "table", "a")
    item = next(i for i in result.workload.items if i.kind == "notification" and not i.invalid)
    letter = DeadLetter("audit", item.logical, 0, "MaxDeliveryCountExceeded", "", 10, copy=0)
    evidence = replace(evidence_of(result), dead_letters=[*evidence_of(result).dead_letters, letter])
    sabotaged = {**(evidence_of(result).faulted_deliveries or {}), ("audit", item.logical, 0, 0): (10, 10)}
    check = checker_for(stack, result, replace(evidence, faulted_deliveries=sabotaged)).run()
    assert check.fault_exhausted == {"notification: dead-lettered: MaxDeliveryCountExceeded": 1}
    assert not check.valid_also_refused and invariant(check, "every valid message effected").ok
    one_clean = {**sabotaged, ("audit", item.logical, 0, 0): (10, 9)}
    check = checker_for(stack, result, replace(evidence, faulted_deliveries=one_clean)).run()
    assert check.valid_also_refused == {"notification: dead-lettered: MaxDeliveryCountExceeded": 1}
    assert not check.fault_exhausted and not invariant(check, "every valid message effected").ok


def test_a_valid_payment_parked_after_its_effect_landed_fails_the_run(stack):
    result = clean_run(stack, "table", "c")
    item = next(i for i in result.workload.items if i.kind == "payment" and i.expect == "effect"
                and not i.copies)
    hub = f"payments-{result.config.run_id}"
    checker = checker_for(stack, result, evidence_of(result))
    ParkingLot(checker.stores.parked).park(consumer="payments", entry_id=f"{hub}/0/999999",
                                           reason="ProcessingFailed", payload=item.body)
    check = checker_for(stack, result, evidence_of(result)).run()
    assert check.valid_also_refused == {"payment: parked: ProcessingFailed": 1}
    assert not invariant(check, "every valid message effected").ok


def test_outcome_unknown_counts_unless_the_api_ignores_idempotency_keys(stack):
    result = clean_run(stack, "table", "d")
    sent, unsent = [i for i in result.workload.items
                    if i.kind == "notification" and not i.invalid][1:3]
    checker = checker_for(stack, result, evidence_of(result))
    for item in (sent, unsent):
        ParkingLot(checker.stores.parked).park(consumer="notify", entry_id=item.key,
                                               reason="OutcomeUnknown", payload=item.body)
    calls = [c for c in evidence_of(result).api_calls
             if (c.channel, c.notification_id) != ("notify", unsent.key)]
    honoured = checker_for(stack, result, replace(evidence_of(result), api_calls=calls)).run()
    assert honoured.valid_not_effected == {"notification: parked: OutcomeUnknown": 1}
    assert honoured.valid_also_refused == {"notification: parked: OutcomeUnknown": 1}
    assert not invariant(honoured, "every valid message effected").ok
    ignored = checker_for(stack, result, replace(evidence_of(result), api_calls=calls,
                                                 api_honours_key=False)).run()
    assert not ignored.valid_not_effected and not ignored.valid_also_refused
    assert ignored.outcome_unknown == {"parked OutcomeUnknown, no effect found": 1,
                                       "parked OutcomeUnknown, the effect landed": 1}
    assert invariant(ignored, "every valid message effected").ok
    assert "not counted: 2 OutcomeUnknown" in valid_line(ignored, api_honours_key=False)


def test_invalid_input_refused_for_a_processing_reason_or_late_is_not_rejected(stack):
    result = clean_run(stack, "table", "a")
    evidence = evidence_of(result)
    deep, nan, missing = (next(i for i in result.workload.items
                               if i.kind == "order" and i.case == case
                               and (i.logical, 0) not in evidence.broker_dropped)
                          for case in ("deep-nesting", "nan", "missing-keys"))
    letters = []
    for letter in evidence.dead_letters:
        if letter.logical == deep.logical:  # the poison pill: retried until the broker gave up
            letter = replace(letter, reason="MaxDeliveryCountExceeded", delivery_count=10)
        letters.append(letter)
    outcomes = dict(evidence.outcomes or {})
    outcomes[("orders", nan.logical, 0)] = Counter({"raised RecursionError": 1, "abandon": 1,
                                                    "deadletter (InvalidNumber)": 1})
    check = checker_for(stack, result, replace(evidence, dead_letters=letters,
                                               outcomes=outcomes)).run()
    assert check.invalid_not_rejected == {
        "order deep-nesting: refused as MaxDeliveryCountExceeded, not as invalid input": 1,
        "order nan: delivered again after: abandon, raised RecursionError": 1}
    assert not invariant(check, "invalid input rejected").ok
    assert check.host_exceptions == {"orders: RecursionError": 1}
    assert not invariant(check, "no exception reached the host").ok
    # Without the host's view (real brokers), the dead letter's delivery count tells.
    late = [replace(d, delivery_count=3) if d.logical == missing.logical else d
            for d in evidence.dead_letters]
    check = checker_for(stack, result, replace(evidence, dead_letters=late, outcomes=None)).run()
    assert check.invalid_not_rejected["order missing-keys: dead-lettered at delivery 3"] == 1


def test_transient_failures_may_reach_the_host_but_a_stalled_partition_may_not(stack):
    result = clean_run(stack, "table", "a")
    payment = next(i for i in result.workload.items if i.kind == "payment" and not i.invalid)
    outcomes = {**(evidence_of(result).outcomes or {}),
                ("payments", payment.logical, 0): Counter({"raised StoreUnavailableError": 2,
                                                           "ok": 1})}
    check = checker_for(stack, result, replace(evidence_of(result), outcomes=outcomes)).run()
    assert invariant(check, "no exception reached the host").ok
    check = checker_for(stack, result, replace(evidence_of(result), outcomes=outcomes,
                                               stalled_batches=1)).run()
    assert not invariant(check, "no exception reached the host").ok


@pytest.mark.parametrize(("reason", "operational"), [
    ("MalformedJson", False), ("TooDeeplyNested", False), ("InvalidPayment", False),
    ("NumberOutOfRange", False), ("UnknownEventType", False), ("IdempotencyKeyConflict", False),
    ("MaxDeliveryCountExceeded", True), ("StaleInProgress", True), ("ProcessingFailed", True),
    ("OutcomeUnknown", True), ("Transient", True), ("UnexpectedError", True), ("", True),
    ("StoreRejected", True), ("RecursionError", True)])
def test_which_reasons_reject_input(reason, operational):
    assert is_operational(reason) is operational
