"""`payments` publishes `BalanceChanged` through its outbox; `balance_projection` applies it.

The two hops on both backends, through the registered functions: one message per account
per transaction, with its deterministic id and the propagated key, dispatched before the
partition's mark moves and at no store request of its own; a failed dispatch fails the
batch and leaves the mark; the consumer's view follows the balances whatever the order
and the copies the queue delivers.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from domain.balance_projection import CONSUMER as PROJECTION
from domain.balance_projection import read_view, view_partition
from domain.payments import BALANCE_CHANGED, CONSUMER
from functions.services import Services
from shared import DedupKey
from shared._core.exceptions import DispatchUnavailableError
from shared._core.outbox import OutgoingMessage, outgoing_message_id
from simulator.host_inputs import RecordingActions, SentEvent, SentMessage, service_bus_message
from tests.functions.conftest import function
from tests.functions.test_payments import (  # noqa: F401 - fixtures
    SOURCE,
    account_id,
    balance,
    counted_services,
    run,
    structured,
)

QUEUE = "balance-changes"


def key_of(event_id: str) -> DedupKey:
    return DedupKey.from_cloudevent(CONSUMER, SOURCE, event_id)


def sent(services: Services) -> list[OutgoingMessage]:
    return list(services.dispatcher.sent)


def deliver(message: OutgoingMessage, *, delivery_count: int = 1) -> tuple[str, str | None, str | None]:
    """`message` as Service Bus delivers it to `balance_projection`; the settlement."""
    received = service_bus_message(SentMessage(
        message.body, message_id=message.message_id, correlation_id=message.correlation_id,
        content_type=message.content_type, application_properties=dict(message.properties)),
        delivery_count=delivery_count)
    actions = RecordingActions()
    function("balance_projection")(message=received, message_actions=actions)
    return actions.last


def view(services: Services, account: str) -> dict[str, Any] | None:
    return read_view(services.stores["dedup"], account)


# -- the first hop: payments publishes ------------------------------------------------------------
def test_one_balance_changed_per_account_per_batch_with_its_id_key_and_state(services):
    accounts = [account_id() for _ in range(3)]
    events = [SentEvent(structured(f"b{n}", accounts[n % 3], 100 + n), n,
                        properties={"X-Correlation-Id": f"corr-{n}"}) for n in range(1, 10)]
    run(events)
    messages = sent(services)
    assert len(messages) == 3  # one per account, not one per event
    by_account = {json.loads(m.body)["accountId"]: m for m in messages}
    for index, account in enumerate(accounts):
        mine = [n for n in range(1, 10) if n % 3 == index]
        message = by_account[account]
        first = key_of(f"b{mine[0]}")  # the transaction's first marker carries it
        assert message.destination == QUEUE
        assert message.message_id == outgoing_message_id(first, QUEUE, 0)
        assert str(message.properties["Idempotency-Key"]).startswith(first.encoded)
        assert message.properties["type"] == BALANCE_CHANGED
        assert message.correlation_id == f"corr-{mine[0]}"  # the first event's, carried on
        body = json.loads(message.body)
        assert body == {"type": BALANCE_CHANGED, "accountId": account,
                        "balanceCents": sum(100 + n for n in mine), "version": len(mine),
                        "eventIds": [f"b{n}" for n in mine]}
        assert body["balanceCents"] == balance(services, account)


def test_versions_count_the_payments_posted_so_far_across_batches(services):
    account = account_id()
    run([SentEvent(structured(f"v{n}", account, 10), n) for n in range(1, 4)])
    run([SentEvent(structured(f"v{n}", account, 10), n) for n in range(4, 6)])
    versions = [json.loads(m.body)["version"] for m in sent(services)]
    assert versions == [3, 5]


def test_a_failed_dispatch_fails_the_batch_keeps_the_mark_and_the_retry_sends_the_same_ids(services):
    account, other = account_id(), account_id()
    events = [SentEvent(structured(f"f{n}", (account, other)[n % 2], 100), n) for n in range(1, 5)]
    services.dispatcher.fail_next()
    with pytest.raises(DispatchUnavailableError):
        run(events)
    assert services.payments.watermark.read("0") is None  # committed, not marked
    assert balance(services, account) == 200 and sent(services) == []
    run(events)  # the host's retry policy: the same batch
    expected = {outgoing_message_id(key_of("f1"), QUEUE, 0), outgoing_message_id(key_of("f2"), QUEUE, 0)}
    assert {m.message_id for m in sent(services)} == expected
    assert services.payments.watermark.read("0").sequence_number == 4
    assert balance(services, account) == 200  # applied once
    run(events)  # a checkpoint replay: covered by the mark, nothing sent again
    assert len(sent(services)) == 2


def test_a_group_applied_event_by_event_still_sends_before_the_mark_moves(services):
    """A group the build refuses as a whole (one event would take the balance past what the
    stores hold exactly) is applied event by event: each commit sends its own BalanceChanged,
    dispatched with the batch before the mark moves; the refused event is parked."""
    account, big = account_id(), 10**15
    events = [SentEvent(structured(f"g{n}", account, big), n) for n in range(1, 11)]
    run(events)
    assert balance(services, account) == 9 * big
    versions = [json.loads(m.body)["version"] for m in sent(services)]
    assert versions == list(range(1, 10))  # one per event applied, in order; none for the tenth
    assert {m.message_id for m in sent(services)} == {
        outgoing_message_id(key_of(f"g{n}"), QUEUE, 0) for n in range(1, 10)}
    assert services.payments.watermark.read("0").sequence_number == 10
    run(events)  # replayed: nothing sent again
    assert len(sent(services)) == 9


def test_publishing_off_sends_nothing(services_for, backend):
    services = services_for(backend, BALANCE_CHANGES_QUEUE="")
    account = account_id()
    run([SentEvent(structured(f"o{n}", account, 100), n) for n in range(1, 4)])
    assert balance(services, account) == 300 and sent(services) == []


@pytest.mark.parametrize("backend", ["table", "cosmos"])
@pytest.mark.parametrize("queue", [QUEUE, ""], ids=["publishing", "not-publishing"])
def test_publishing_adds_no_store_request_at_20_accounts_and_100_event_batches(
        counted_services, backend, queue):  # noqa: F811 - the fixture
    """2,000 events in 100-event batches over 20 accounts through the function, on one instance:
    a mark read and a balance read per account in the first batch, then one transaction per
    account and one mark write per batch. 441 requests, 0.2205 per event, with or without
    BalanceChanged: the batch's mark records the dispatch."""
    counted = counted_services(backend, BALANCE_CHANGES_QUEUE=queue)
    accounts = [account_id() for _ in range(20)]
    events = [SentEvent(structured(f"r{n}", accounts[n % 20], 100), n) for n in range(2000)]
    for start in range(0, 2000, 100):
        run(events[start:start + 100])
    requests = counted.requests()
    assert requests == 1 + 20 + 20 * 20 + 20
    assert requests / len(events) == pytest.approx(0.2205)
    assert len(sent(counted.services)) == (20 * 20 if queue else 0)
    assert balance(counted.services, accounts[0]) == 100 * 100


# -- the second hop: balance_projection ------------------------------------------------------------
def test_the_projection_follows_each_accounts_balance_through_both_hops(services):
    accounts = [account_id() for _ in range(2)]
    run([SentEvent(structured(f"c{n}", accounts[n % 2], 100 + n), n) for n in range(1, 7)])
    run([SentEvent(structured(f"c{n}", accounts[n % 2], 100 + n), n) for n in range(7, 9)])
    for message in sent(services):
        assert deliver(message) == ("complete", None, None)
    for account in accounts:
        stored = view(services, account)
        assert stored is not None
        assert stored["balanceCents"] == balance(services, account)
        assert stored["version"] == 4


def test_copies_and_late_older_versions_never_overwrite_and_count_once(services):
    account = account_id()
    run([SentEvent(structured(f"d{n}", account, 100), n) for n in range(1, 3)])
    run([SentEvent(structured(f"d{n}", account, 100), n) for n in range(3, 4)])
    older, newer = sent(services)
    assert deliver(newer) == ("complete", None, None)  # out of order: competing consumers
    assert deliver(older) == ("complete", None, None)  # older: recorded, not written
    assert deliver(newer, delivery_count=2) == ("complete", None, None)  # a redelivered copy
    assert deliver(older) == ("complete", None, None)  # a re-sent copy (same MessageId)
    stored = view(services, account)
    assert stored is not None and (stored["balanceCents"], stored["version"]) == (300, 3)
    store = services.stores["dedup"]
    verdicts = {}
    for message in (older, newer):
        record = store.get_record(view_partition(account),
                                  DedupKey(PROJECTION, message.message_id).encoded)
        assert record is not None
        verdicts[json.loads(message.body)["version"]] = record.result["verdict"]
    assert verdicts == {2: "stale", 3: "applied"}  # each message's effect counted once


@pytest.mark.parametrize(("body", "reason"), [
    (b"{broken", "MalformedJson"),
    (json.dumps({"type": BALANCE_CHANGED, "balanceCents": 1, "version": 1}).encode(),
     "InvalidBalanceChanged"),
    (json.dumps({"type": BALANCE_CHANGED, "accountId": "A", "balanceCents": 1.5,
                 "version": 1}).encode(), "InvalidBalanceChanged"),
    (json.dumps({"type": BALANCE_CHANGED, "accountId": "A", "balanceCents": 1,
                 "version": 0}).encode(), "InvalidBalanceChanged"),
    (json.dumps({"type": "Other", "accountId": "A", "balanceCents": 1, "version": 1}).encode(),
     "InvalidBalanceChanged"),
    (json.dumps({"type": BALANCE_CHANGED, "accountId": "A", "balanceCents": 1, "version": 1,
                 "eventIds": [1]}).encode(), "InvalidBalanceChanged"),
])
def test_bad_input_is_dead_lettered_with_its_reason_on_the_first_delivery(services, body, reason):
    message = service_bus_message(SentMessage(body, message_id=str(uuid.uuid4())))
    actions = RecordingActions()
    function("balance_projection")(message=message, message_actions=actions)
    action, got, description = actions.last
    assert (action, got) == ("deadletter", reason) and description


def test_a_message_id_reused_for_another_state_is_dead_lettered_as_a_conflict(services):
    account = account_id()
    first = {"type": BALANCE_CHANGED, "accountId": account, "balanceCents": 100, "version": 1,
             "eventIds": ["x"]}
    message_id = str(uuid.uuid4())

    def send(body: dict[str, Any]) -> tuple[str, str | None, str | None]:
        actions = RecordingActions()
        function("balance_projection")(message=service_bus_message(SentMessage(
            json.dumps(body).encode(), message_id=message_id)), message_actions=actions)
        return actions.last

    assert send(first)[0] == "complete"
    action, reason, _ = send({**first, "balanceCents": 999})
    assert (action, reason) == ("deadletter", "IdempotencyKeyConflict")
    assert view(services, account)["balanceCents"] == 100
