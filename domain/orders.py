"""Orders from Service Bus into Cosmos DB: the order document is its own dedup marker.

MessageId is the order id. The order document's id is the order id and the
container is partitioned by /orderId, so the document itself is the dedup
marker; the order lines go into the same transactional batch, and so does an
`OrderAccepted` message to the notifications topic (the outbox: it rides on
the order document until it is dispatched, after the commit). 409 on the
order document means a copy was processed: equal request hash = duplicate
(complete, once whatever is still pending is dispatched), different = the id
was reused (dead-letter + alert). A redelivery reads the order first: most
are duplicates, and a read costs one request where a failed commit costs two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shared import (
    InvalidPayloadError,
    MessageView,
    ServiceBusConsumer,
    Transaction,
    aio,
    exact_integer,
    parse_json_object,
    store_safe_id,
)

CONSUMER = "orders"
ORDER_ACCEPTED = "OrderAccepted"
MAX_ORDER_BYTES = 256 * 1024  # a Standard-tier Service Bus message
MAX_LINES = 98  # one batch: order document + lines <= 100 operations
MAX_QUANTITY = 1_000_000
MAX_UNIT_PRICE = 1e9  # with MAX_QUANTITY and MAX_LINES, a total far inside a double's exact range


@dataclass(frozen=True)
class Order:
    order_id: str
    customer_id: str
    currency: str
    lines: tuple[dict[str, Any], ...]

    @property
    def total(self) -> float:
        return round(sum(line["quantity"] * line["unitPrice"] for line in self.lines), 2)

    def immutable_fields(self) -> dict[str, Any]:
        """What identifies the order's content; hashed to detect a reused id."""
        return {"orderId": self.order_id, "customerId": self.customer_id,
                "currency": self.currency, "lines": list(self.lines)}

    @property
    def document_id(self) -> str:
        """The order document's id and partition: the order id, store-safe."""
        return store_safe_id(self.order_id)

    def document(self) -> tuple[str, dict[str, Any]]:
        """The order document, which is also the dedup marker (kept for good): its id is the
        order id (stored escaped, as `document_id`)."""
        return self.order_id, {
            "orderId": self.order_id, "customerId": self.customer_id, "currency": self.currency,
            "total": self.total, "lineCount": len(self.lines), "status": "accepted",
            "kind": "order"}


def parse_order(message: MessageView) -> Order:
    data = parse_json_object(message.body, max_bytes=MAX_ORDER_BYTES)
    order_id = data.get("orderId")
    if not isinstance(order_id, str) or not order_id:
        raise InvalidPayloadError("InvalidOrder", "orderId must be a non-empty string")
    if order_id != message.message_id:
        raise InvalidPayloadError("OrderIdMismatch",
                                  f"MessageId {message.message_id!r} is not orderId {order_id!r}")
    customer, currency = data.get("customerId"), data.get("currency", "EUR")
    if not isinstance(customer, str) or not customer:
        raise InvalidPayloadError("InvalidOrder", "customerId must be a non-empty string")
    if not isinstance(currency, str) or len(currency) != 3:
        raise InvalidPayloadError("InvalidOrder", "currency must be a 3-letter code")
    lines = data.get("lines")
    if not isinstance(lines, list) or not lines:
        raise InvalidPayloadError("InvalidOrder", "lines must be a non-empty list")
    if len(lines) > MAX_LINES:
        raise InvalidPayloadError("OrderTooLarge", f"{len(lines)} lines; at most {MAX_LINES}")
    parsed = []
    for n, line in enumerate(lines):
        if not isinstance(line, dict):
            raise InvalidPayloadError("InvalidOrder", f"line {n} must be an object")
        sku, qty, price = line.get("sku"), line.get("quantity"), line.get("unitPrice")
        if not isinstance(sku, str) or not sku:
            raise InvalidPayloadError("InvalidOrder", f"line {n}: sku must be a string")
        qty = exact_integer(qty, f"line {n}: quantity", reason="InvalidOrder", maximum=MAX_QUANTITY)
        if (not isinstance(price, (int, float)) or isinstance(price, bool) or price < 0
                or not math.isfinite(price) or price > MAX_UNIT_PRICE):
            raise InvalidPayloadError("InvalidOrder",
                                      f"line {n}: unitPrice must be a number in [0, {MAX_UNIT_PRICE:g}]")
        parsed.append({"sku": sku, "quantity": qty, "unitPrice": price})
    return Order(order_id, customer, currency, tuple(parsed))


def order_accepted(order: Order) -> dict[str, Any]:
    """The notification body: what notify and audit need, not the whole order."""
    return {"type": ORDER_ACCEPTED, "orderId": order.order_id, "customerId": order.customer_id,
            "currency": order.currency, "total": order.total, "lineCount": len(order.lines)}


class OrderService[C: (ServiceBusConsumer, aio.ServiceBusConsumer)]:
    """Persists each order once: the order document is the dedup marker (its id is the order
    id, in its own partition); its lines and an `OrderAccepted` to the notifications topic
    commit with it (the outbox). A copy finds the document: the same content is a duplicate,
    other content under the same id is dead-lettered (and alerted).

    On either variant: `handle` returns the consumer's Decision, awaitable on the async one
    (the function's); the sync one serves tools and the profiler's comparison.
    """

    def __init__(self, consumer: C, *, notifications_topic: str) -> None:
        self.consumer = consumer
        self.notifications_topic = notifications_topic

    def handle(self, message: Any, actions: Any = None):  # noqa: ANN201 - Decision, or awaitable on the async variant
        return self.consumer.run_atomic(
            message, actions, self.accept, parse=parse_order, content=Order.immutable_fields,
            partition=lambda order: order.order_id, document=Order.document)

    def accept(self, tx: Transaction | aio.Transaction, order: Order) -> dict[str, Any]:
        """The order's lines and its notification, in the order document's transaction."""
        for n, line in enumerate(order.lines, start=1):
            tx.create(f"{order.document_id}:line:{n:03d}",
                      {"orderId": order.order_id, "kind": "line", **line})
        tx.send(self.notifications_topic, order_accepted(order),
                properties={"type": ORDER_ACCEPTED, "orderId": order.order_id})
        return {"orderId": order.order_id, "total": order.total}
