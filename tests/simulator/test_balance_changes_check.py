"""The checks of the second outbox hop (payments -> balance_projection), fed by hand.

The evidence is what the real code writes on the in-memory store: the payments batch
processor commits two batches (two accounts, two transactions each) and dispatches their
`BalanceChanged`; balance_projection applies what the test delivers. A clean hop passes;
a message applied twice, one never applied, one no transaction committed, a transaction
its partition's mark does not cover, and a view that differs from its balance each fail.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field

import pytest

from domain.balance_projection import VIEW_DOCUMENT, BalanceProjection, view_partition
from domain.payments import PaymentRules, payment_processor
from shared import Idempotency, aio
from shared._backends.memory import InMemoryIdempotencyStore
from shared._core.keys import store_safe_id
from shared._core.outbox import OutgoingMessage
from shared._core.store import WriteOp
from shared._flows.parking import ParkingLot
from shared._flows.watermark import PartitionWatermark
from shared._triggers.eventhubs import EventView
from shared._triggers.servicebus import MessageView
from shared.testing import AsyncInMemoryIdempotencyStore, InMemoryDispatcher
from simulator.check import CheckResult, DeadLetter, Evidence, Invariant, balance_changes, shared_invariants
from simulator.check.stores import Stores

RUN = "hop1"
HUB = f"payments-{RUN}"
GROUP = "payments-processor"
QUEUE = "balance-changes"
ACCOUNTS = (f"{RUN}-ACC-A", f"{RUN}-ACC-B")
PHANTOM = "no BalanceChanged for a transaction that did not commit"
PENDING = "no BalanceChanged left pending"
VIEWS = "each account's view == its balance document"
DOUBLE = "exactly one effect per message"
LOST = "nothing lost"
VALID = "every valid message effected"


def event(n: int) -> EventView:
    body = json.dumps({"specversion": "1.0", "id": f"pay-{n}", "source": f"/sim/{RUN}",
                       "type": "payment.credit",
                       "data": {"accountId": ACCOUNTS[n % 2], "amountCents": 100 + n}}).encode()
    return EventView(n, body, content_type="application/cloudevents+json", offset=str(n * 10),
                        enqueued_time=f"2026-01-01T00:00:{n:02d}+00:00")


@dataclass
class Hop:
    """The two hops on in-memory stores: what payments committed and sent, and what
    balance_projection applied."""

    ledger: InMemoryIdempotencyStore = field(default_factory=InMemoryIdempotencyStore)
    dedup: InMemoryIdempotencyStore = field(default_factory=InMemoryIdempotencyStore)
    parked: InMemoryIdempotencyStore = field(default_factory=InMemoryIdempotencyStore)
    dispatcher: InMemoryDispatcher = field(default_factory=InMemoryDispatcher)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    extra_sent: dict[str, tuple[str, bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        processor = payment_processor(
            Idempotency(self.ledger, dispatcher=self.dispatcher),
            PartitionWatermark(self.dedup, consumer="payments", event_hub=HUB, consumer_group=GROUP),
            ParkingLot(self.parked), rules=PaymentRules(HUB, balance_changes_queue=QUEUE))
        processor.process_batch([event(n) for n in range(6)], "0")
        processor.process_batch([event(n) for n in range(6, 10)], "0")
        self.projection = BalanceProjection(aio.ServiceBusConsumer(
            "balance_projection", aio.Idempotency(AsyncInMemoryIdempotencyStore(self.dedup))))

    @property
    def sent(self) -> list[OutgoingMessage]:
        return list(self.dispatcher.sent)

    def deliver(self, message: OutgoingMessage, *, message_id: str | None = None,
                body: bytes | None = None) -> None:
        decision = asyncio.run(self.projection.handle(MessageView(
            message_id or message.message_id, body or message.body)))
        assert decision.action == "complete", decision

    def deliver_all(self) -> None:
        for message in self.sent:
            self.deliver(message)

    def check(self) -> tuple[CheckResult, list[Invariant]]:
        published = {m.message_id: (m.destination, m.body) for m in self.sent} | self.extra_sent
        return check(self.ledger, self.dedup, published=published, dead_letters=self.dead_letters)


def check(ledger: InMemoryIdempotencyStore, dedup: InMemoryIdempotencyStore, *,
          published: dict[str, tuple[str, bytes]], dead_letters: list[DeadLetter],
          delivered: bool = True) -> tuple[CheckResult, list[Invariant]]:
    """The hop's checks over the stores, and the shared invariants on what they tallied."""
    memory = InMemoryIdempotencyStore()
    stores = Stores(orders=memory, order_status=memory, ledger=ledger, notifications=memory,
                    parked=memory, records={"dedup": dedup}, by_role={"dedup": dedup, "ledger": ledger})
    evidence = Evidence(stores=stores, run_id=RUN, hub=HUB, published=published,
                        dead_letters=list(dead_letters), outbox_delivered=delivered)
    result = CheckResult()
    own = balance_changes.check(evidence, result)
    return result, shared_invariants(result) + own


def verdict(invariants: list[Invariant], name: str) -> Invariant:
    return next(i for i in invariants if i.name.startswith(name))


def failed(invariants: list[Invariant]) -> set[str]:
    names = (PHANTOM, PENDING, VIEWS, DOUBLE, LOST, VALID)
    return {name for name in names if not verdict(invariants, name).ok}


def by_account(messages: list[OutgoingMessage], account: str) -> list[OutgoingMessage]:
    return sorted((m for m in messages if json.loads(m.body)["accountId"] == account),
                  key=lambda m: json.loads(m.body)["version"])


@pytest.fixture
def hop() -> Hop:
    made = Hop()
    assert len(made.sent) == 4  # one per account per batch
    return made


def test_a_clean_hop_passes(hop):
    hop.deliver_all()
    hop.deliver(hop.sent[0])  # a copy of a message is a duplicate: no second effect
    result, invariants = hop.check()
    assert failed(invariants) == set(), invariants
    assert result.effects["BalanceChanged"] == 4 and result.logical["BalanceChanged"] == 4
    assert result.views_checked == 2
    assert result.hops()["payments -> balance_projection"] == {
        "double": 0, "lost": 0, "phantom": 0, "pending": 0, "effected": 4}


def test_a_transaction_applied_twice_is_a_double_effect(hop):
    hop.deliver_all()
    hop.deliver(hop.sent[0], message_id=str(uuid.uuid4()))  # the same content under a new id
    result, invariants = hop.check()
    assert result.double_effects == {"BalanceChanged": 1}
    assert failed(invariants) == {DOUBLE}


def test_a_message_never_applied_is_lost_though_a_later_one_heals_the_view(hop):
    first = by_account(hop.sent, ACCOUNTS[0])[0]
    for message in hop.sent:
        if message is not first:
            hop.deliver(message)
    result, invariants = hop.check()
    assert result.lost == {"BalanceChanged": 1}
    assert failed(invariants) == {LOST}  # the view alone would not have shown it
    assert first.message_id in result.examples["lost"][0]


def test_the_last_message_never_applied_leaves_the_view_behind(hop):
    last = by_account(hop.sent, ACCOUNTS[1])[-1]
    for message in hop.sent:
        if message is not last:
            hop.deliver(message)
    _, invariants = hop.check()
    assert failed(invariants) == {LOST, VIEWS}


def test_a_message_the_broker_dead_lettered_is_a_valid_message_not_effected(hop):
    first = by_account(hop.sent, ACCOUNTS[0])[0]
    for message in hop.sent:
        if message is not first:
            hop.deliver(message)
    hop.dead_letters.append(DeadLetter("balance_projection", f"outbox:{first.message_id}", 0,
                                       "MaxDeliveryCountExceeded", "", 10))
    result, invariants = hop.check()
    assert result.valid_not_effected == {"BalanceChanged: dead-lettered MaxDeliveryCountExceeded": 1}
    assert not result.lost and failed(invariants) == {VALID}


def test_a_message_no_transaction_committed_is_a_phantom(hop):
    hop.deliver_all()
    last = by_account(hop.sent, ACCOUNTS[0])[-1]
    body = json.loads(last.body)
    invented = json.dumps({**body, "version": body["version"] + 1,
                           "balanceCents": body["balanceCents"] + 1}).encode()
    hop.deliver(last, message_id=str(uuid.uuid4()), body=invented)
    result, invariants = hop.check()
    assert result.phantoms == {"BalanceChanged": 1}
    assert failed(invariants) == {PHANTOM, VIEWS}  # the view now shows what never committed


def test_a_phantom_sent_but_never_applied_is_still_a_phantom(hop):
    hop.deliver_all()
    body = json.loads(hop.sent[0].body)
    hop.extra_sent["not-committed"] = (QUEUE, json.dumps({**body, "version": 999}).encode())
    result, invariants = hop.check()
    assert result.phantoms == {"BalanceChanged": 1}
    assert failed(invariants) == {PHANTOM}


def test_a_transaction_above_its_partitions_mark_is_pending(hop):
    hop.deliver_all()
    partition = store_safe_id(f"hwm|payments|{HUB}|{GROUP}")
    mark = hop.dedup.read_document(partition, store_safe_id("0"))
    assert mark is not None and mark.body["sequenceNumber"] == 9
    hop.dedup.write_documents(partition, [WriteOp("replace", mark.id, {
        **mark.body, "sequenceNumber": 5, "enqueuedTime": "2026-01-01T00:00:05+00:00"},
        etag=mark.etag)])
    result, invariants = hop.check()
    assert result.pending == {"BalanceChanged": 2}  # the second batch's two transactions
    assert failed(invariants) == {PENDING}


def test_a_view_that_differs_from_its_balance_fails(hop):
    hop.deliver_all()
    partition = view_partition(ACCOUNTS[1])
    view = hop.dedup.read_document(partition, VIEW_DOCUMENT)
    assert view is not None
    hop.dedup.write_documents(partition, [WriteOp("replace", VIEW_DOCUMENT, {
        **view.body, "balanceCents": view.body["balanceCents"] - 1}, etag=view.etag)])
    result, invariants = hop.check()
    assert [m["account"] for m in result.view_mismatches] == [ACCOUNTS[1]]
    assert failed(invariants) == {VIEWS}


def test_no_balance_changed_anywhere_means_the_hop_is_off():
    result, invariants = check(InMemoryIdempotencyStore(), InMemoryIdempotencyStore(),
                               published={}, dead_letters=[])
    assert not [i for i in invariants if "BalanceChanged" in i.name or "view" in i.name]
    assert not result.logical


def test_messages_a_test_dispatcher_kept_are_owed_no_effect_but_may_not_stay_pending(hop):
    """`outbox_delivered` false (a test's own dispatcher, no broker to balance_projection):
    nothing downstream is expected, so nothing is lost and no view compared; the marks still
    must cover every committed transaction."""
    result, invariants = check(hop.ledger, hop.dedup, published={}, dead_letters=[],
                               delivered=False)
    assert all(i.ok for i in invariants), invariants
    assert not any(i.name.startswith(VIEWS) for i in invariants)
    assert verdict(invariants, PENDING).ok and not result.lost and not result.logical
