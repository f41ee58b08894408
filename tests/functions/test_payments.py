"""`payments`: CloudEvents batches, checkpoint replay, producer duplicates, parking."""

from __future__ import annotations

import json
import uuid

import pytest

from domain.payments import ACCOUNT_DOCUMENT
from shared import StoreUnavailableError, store_safe_id
from simulator.host_inputs import SentEvent, event_hub_batch
from tests.functions.conftest import function

SOURCE = "/payments/api"


def structured(event_id: str, account: str, cents: int, kind: str = "payment.credit") -> bytes:
    return json.dumps({"specversion": "1.0", "id": event_id, "source": SOURCE, "type": kind,
                       "data": {"accountId": account, "amountCents": cents}}).encode()


def binary(event_id: str, account: str, cents: int, prefix: str = "ce_") -> tuple[bytes, dict]:
    properties = {f"{prefix}specversion": "1.0", f"{prefix}id": event_id, f"{prefix}source": SOURCE,
                  f"{prefix}type": "payment.debit"}
    return json.dumps({"accountId": account, "amountCents": cents}).encode(), properties


def run(events: list[SentEvent], partition: str = "0"):
    function("payments")(events=event_hub_batch(events, partition_id=partition))


def balance(services, account: str) -> int | None:
    document = services.stores["ledger"].read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    return None if document is None else document.body["balanceCents"]


def account_id() -> str:
    return f"acct-{uuid.uuid4().hex[:8]}"


def test_batch_applies_each_event_once(services):
    account = account_id()
    events = [SentEvent(structured(f"e{n}", account, 100), n) for n in range(1, 6)]
    run(events)
    assert balance(services, account) == 500


def test_replayed_batch_is_skipped_by_the_high_water_mark_without_store_lookups(services):
    account = account_id()
    events = [SentEvent(structured(f"e{n}", account, 100), n) for n in range(1, 6)]
    run(events)
    report = services.payments.process_batch(
        [_view(e) for e in events], "0")  # the same batch again after a restart
    assert (report.applied, report.duplicates, report.replay_skipped) == (0, 0, 5)
    assert balance(services, account) == 500


def test_partially_processed_batch_replayed_applies_only_the_rest(services):
    account = account_id()
    events = [SentEvent(structured(f"e{n}", account, 10 ** n), n) for n in range(1, 5)]
    for event in events[:2]:  # the host crashed after two effects, before the mark moved
        services.payments._process_event(_view(event), "0", _report())
    report = services.payments.process_batch([_view(e) for e in events], "0")
    assert (report.applied, report.duplicates) == (2, 2)
    assert balance(services, account) == 10 + 100 + 1000 + 10000


def test_producer_duplicate_at_a_new_sequence_number_is_absorbed_by_the_event_key(services):
    account = account_id()
    run([SentEvent(structured("same", account, 700), 1)])
    run([SentEvent(structured("same", account, 700), 2), SentEvent(structured("next", account, 1), 3)])
    assert balance(services, account) == 701


def test_binary_mode_events_with_either_attribute_prefix(services):
    account = account_id()
    run([SentEvent(structured("c1", account, 1000), 1)])
    body, props = binary("d1", account, 300)
    body2, props2 = binary("d2", account, 200, prefix="cloudEvents:")
    run([SentEvent(body, 2, props), SentEvent(body2, 3, props2)])
    assert balance(services, account) == 500


@pytest.mark.parametrize(("body", "properties", "reason"), [
    (b"{broken", None, "MalformedJson"),
    (json.dumps({"specversion": "1.0", "source": SOURCE, "type": "payment.credit",
                 "data": {"accountId": "a", "amountCents": 1}}).encode(), None,
     "MissingCloudEventAttributes"),
    (json.dumps({"specversion": "1.0", "id": "x", "source": SOURCE, "type": "payment.refund",
                 "data": {"accountId": "a", "amountCents": 1}}).encode(), None, "UnknownEventType"),
    (json.dumps({"specversion": "1.0", "id": "x2", "source": SOURCE, "type": "payment.credit",
                 "data": {"accountId": "a", "amountCents": "12"}}).encode(), None, "InvalidPayment"),
    (b"x" * (1024 * 1024 + 1), None, "PayloadTooLarge"),
])
def test_bad_event_is_parked_with_its_reason_and_the_rest_is_applied(services, body, properties,
                                                                     reason):
    account = account_id()
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("ok1", account, 5), 1), SentEvent(body, 2, properties),
         SentEvent(structured("ok2", account, 7), 3)], partition)
    assert balance(services, account) == 12
    hub = services.settings.payments_hub
    parked = services.parking.get("payments", f"{hub}/{partition}/2")
    assert parked["reason"] == reason
    assert parked["payloadBytes"] == len(body)
    assert services.payments.watermark.read(partition).sequence_number == 3


def test_failing_event_is_retried_then_parked_and_never_blocks_the_partition(services, monkeypatch):
    account, cursed = account_id(), account_id()
    real_apply = services.payments.apply
    attempts = []

    def flaky(payment, context=None):
        if payment.account_id == cursed:
            attempts.append(context["attempt"])
            raise StoreUnavailableError("throttled")
        return real_apply(payment, context)

    monkeypatch.setattr(services.payments, "apply", flaky)
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("a", account, 1), 1), SentEvent(structured("b", cursed, 1), 2),
         SentEvent(structured("c", account, 2), 3)], partition)
    assert attempts == [1, 2, 3]
    assert balance(services, account) == 3
    parked = services.parking.get("payments", f"{services.settings.payments_hub}/{partition}/2")
    assert parked["reason"] == "ProcessingFailed" and "throttled" in parked["error"]


def test_reused_event_id_with_other_content_is_parked_as_a_conflict(services):
    account = account_id()
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("dup", account, 100), 1)], partition)
    run([SentEvent(structured("dup", account, 999), 2)], partition)
    assert balance(services, account) == 100
    parked = services.parking.get("payments", f"{services.settings.payments_hub}/{partition}/2")
    assert parked["reason"] == "IdempotencyKeyConflict"


@pytest.mark.parametrize("backend", ["table"])
def test_missing_key_falls_back_to_partition_and_sequence_when_opted_in(services_for, backend):
    services = services_for(backend, PAYMENTS_MISSING_KEY_POLICY="sequence")
    account = account_id()
    keyless = json.dumps({"type": "payment.credit",
                          "data": {"accountId": account, "amountCents": 40}}).encode()
    run([SentEvent(keyless, 1)], "7")
    # A replay of the same partition+sequence is absorbed, even past the mark:
    services.payments._process_event(_view(SentEvent(keyless, 1)), "7", report := _report())
    assert report.duplicates == 1
    # ...but a producer retry arrives at a new sequence number and is applied again (documented).
    run([SentEvent(keyless, 2)], "7")
    assert balance(services, account) == 80


def test_parking_failure_raises_so_the_host_retries_the_batch(services, monkeypatch):
    def down(**_):
        raise StoreUnavailableError("parking store down")

    monkeypatch.setattr(services.parking, "park", down)
    with pytest.raises(StoreUnavailableError):
        run([SentEvent(b"{broken", 1)], uuid.uuid4().hex[:6])


def _view(event: SentEvent):
    from functions.adapters import event_views

    return event_views(event_hub_batch([event], partition_id="0"))[0]


def _report():
    from domain.payments import BatchReport

    return BatchReport()


def test_an_unexpected_error_parks_the_event_instead_of_stalling_the_partition(services,
                                                                               monkeypatch):
    account, cursed = account_id(), account_id()
    real_apply = services.payments.apply

    def buggy(payment, context=None):
        if payment.account_id == cursed:
            raise KeyError("bug")
        return real_apply(payment, context)

    monkeypatch.setattr(services.payments, "apply", buggy)
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("u1", cursed, 1), 1), SentEvent(structured("u2", account, 4), 2)],
        partition)
    assert balance(services, account) == 4
    parked = services.parking.get("payments", f"{services.settings.payments_hub}/{partition}/1")
    assert parked["reason"] == "UnexpectedError"
