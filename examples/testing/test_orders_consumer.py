"""Testing your own consumer with `shared.testing`: in process, no server, each test a delivery
the broker could make (docs/testing.md). Copy it beside your function app's tests and put your
own build function in place of `accept`."""

import asyncio
import json
from typing import Any

from shared import Idempotency, MessageView, ServiceBusConsumer, Transaction, aio
from shared.testing import (
    AsyncInMemoryDispatcher,
    AsyncInMemoryIdempotencyStore,
    FlakyStore,
    InMemoryDispatcher,
    InMemoryIdempotencyStore,
    RecordingMessageActions,
)


def accept(tx: Transaction | aio.Transaction, order: dict[str, Any]) -> dict[str, Any]:
    """The consumer under test: the order and its event, in the marker's transaction."""
    tx.create("order", {"customerId": order["customerId"], "total": order["total"]})
    tx.send("order-events", {"type": "OrderAccepted", "orderId": order["orderId"]})
    return {"orderId": order["orderId"]}


def delivery(order_id: str, *, total: float = 12.5, count: int = 1) -> MessageView:
    """A message as the trigger would hand it over (`count`: the broker's delivery count)."""
    body = json.dumps({"orderId": order_id, "customerId": "C-1", "total": total}).encode()
    return MessageView(message_id=order_id, body=body, delivery_count=count)


def by_order(order: dict[str, Any]) -> str:
    return order["orderId"]


def test_a_redelivered_order_is_written_and_announced_once() -> None:
    store, outbox, actions = InMemoryIdempotencyStore(), InMemoryDispatcher(), RecordingMessageActions()
    orders = ServiceBusConsumer("orders", Idempotency(store, dispatcher=outbox),
                                sends_to=["order-events"])

    orders.run_atomic(delivery("o-1"), actions, accept, partition=by_order)
    orders.run_atomic(delivery("o-1", count=2), actions, accept, partition=by_order)

    assert actions.actions() == ["complete", "complete"]
    assert [message.destination for message in outbox.sent] == ["order-events"]
    order = store.read_document("o-1", "order")
    assert order is not None and order.body["total"] == 12.5


def test_an_order_id_reused_for_other_content_is_dead_lettered_and_changes_nothing() -> None:
    store, actions = InMemoryIdempotencyStore(), RecordingMessageActions()
    orders = ServiceBusConsumer("orders", Idempotency(store, dispatcher=InMemoryDispatcher()),
                                sends_to=["order-events"])

    orders.run_atomic(delivery("o-2"), actions, accept, partition=by_order)
    orders.run_atomic(delivery("o-2", total=99.0), actions, accept, partition=by_order)

    assert actions.actions() == ["complete", "deadletter"]
    assert actions.settled[-1].reason == "IdempotencyKeyConflict"
    order = store.read_document("o-2", "order")
    assert order is not None and order.body["total"] == 12.5


def test_bad_input_is_dead_lettered_on_its_first_delivery_with_a_reason() -> None:
    actions = RecordingMessageActions()
    orders = ServiceBusConsumer("orders", Idempotency(InMemoryIdempotencyStore(),
                                                      dispatcher=InMemoryDispatcher()))

    orders.run_atomic(MessageView(message_id="o-3", body=b"{not json"), actions, accept,
                      partition=by_order)

    assert [(s.action, s.message_id) for s in actions.settled] == [("deadletter", "o-3")]
    assert actions.settled[0].reason


def test_the_async_variant_absorbs_the_redelivery_the_same_way() -> None:
    outbox, actions = AsyncInMemoryDispatcher(), RecordingMessageActions()
    orders = aio.ServiceBusConsumer("orders", aio.Idempotency(AsyncInMemoryIdempotencyStore(),
                                                              dispatcher=outbox),
                                    sends_to=["order-events"])

    async def deliver_twice() -> None:
        await orders.run_atomic(delivery("o-4"), actions, accept, partition=by_order)
        await orders.run_atomic(delivery("o-4", count=2), actions, accept, partition=by_order)

    asyncio.run(deliver_twice())

    assert actions.actions() == ["complete", "complete"]
    assert len(outbox.sent) == 1


def test_a_store_outage_leaves_the_order_to_the_brokers_retry_and_it_is_applied_once() -> None:
    store, outbox, actions = FlakyStore(), InMemoryDispatcher(), RecordingMessageActions()
    orders = ServiceBusConsumer("orders", Idempotency(store, dispatcher=outbox),
                                sends_to=["order-events"])

    store.down = True  # the store answers 503 to every request
    orders.run_atomic(delivery("o-5"), actions, accept, partition=by_order)
    store.down = False  # it is back by the broker's redelivery
    orders.run_atomic(delivery("o-5", count=2), actions, accept, partition=by_order)

    assert actions.actions() == ["abandon", "complete"]
    assert store.failed >= 1 and len(outbox.sent) == 1
    assert store.read_document("o-5", "order") is not None
