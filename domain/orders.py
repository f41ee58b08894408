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

from domain.messages import (
    InboundMessage,
    InvalidMessageError,
    message_context,
    parse_json_object,
    settle_outcome,
)
from shared import DedupKey, Idempotency, InvalidKeyError, request_hash, store_safe_id
from shared.payload import exact_integer
from shared.settlement import Decision

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


def parse_order(message: InboundMessage) -> Order:
    data = parse_json_object(message.body, max_bytes=MAX_ORDER_BYTES)
    order_id = data.get("orderId")
    if not isinstance(order_id, str) or not order_id:
        raise InvalidMessageError("InvalidOrder", "orderId must be a non-empty string")
    if order_id != message.message_id:
        raise InvalidMessageError("OrderIdMismatch",
                                  f"MessageId {message.message_id!r} is not orderId {order_id!r}")
    customer, currency = data.get("customerId"), data.get("currency", "EUR")
    if not isinstance(customer, str) or not customer:
        raise InvalidMessageError("InvalidOrder", "customerId must be a non-empty string")
    if not isinstance(currency, str) or len(currency) != 3:
        raise InvalidMessageError("InvalidOrder", "currency must be a 3-letter code")
    lines = data.get("lines")
    if not isinstance(lines, list) or not lines:
        raise InvalidMessageError("InvalidOrder", "lines must be a non-empty list")
    if len(lines) > MAX_LINES:
        raise InvalidMessageError("OrderTooLarge", f"{len(lines)} lines; at most {MAX_LINES}")
    parsed = []
    for n, line in enumerate(lines):
        if not isinstance(line, dict):
            raise InvalidMessageError("InvalidOrder", f"line {n} must be an object")
        sku, qty, price = line.get("sku"), line.get("quantity"), line.get("unitPrice")
        if not isinstance(sku, str) or not sku:
            raise InvalidMessageError("InvalidOrder", f"line {n}: sku must be a string")
        qty = exact_integer(qty, f"line {n}: quantity", reason="InvalidOrder", maximum=MAX_QUANTITY)
        if (not isinstance(price, (int, float)) or isinstance(price, bool) or price < 0
                or not math.isfinite(price) or price > MAX_UNIT_PRICE):
            raise InvalidMessageError("InvalidOrder",
                                      f"line {n}: unitPrice must be a number in [0, {MAX_UNIT_PRICE:g}]")
        parsed.append({"sku": sku, "quantity": qty, "unitPrice": price})
    return Order(order_id, customer, currency, tuple(parsed))


def order_accepted(order: Order) -> dict[str, Any]:
    """The notification body: what notify and audit need, not the whole order."""
    return {"type": ORDER_ACCEPTED, "orderId": order.order_id, "customerId": order.customer_id,
            "currency": order.currency, "total": order.total, "lineCount": len(order.lines)}


class OrderService:
    """Persists each order once; the order document is the dedup marker."""

    def __init__(self, idempotency: Idempotency, *, notifications_topic: str) -> None:
        self.idempotency = idempotency
        self.notifications_topic = notifications_topic

    def handle(self, message: InboundMessage) -> Decision:
        try:
            key = DedupKey.from_message_id(CONSUMER, message.message_id)
            order = parse_order(message)
        except InvalidKeyError as error:
            return Decision.deadletter("InvalidMessageId", str(error))
        except InvalidMessageError as error:
            return Decision.deadletter(error.reason, error.detail)
        digest = request_hash(order.immutable_fields())
        document_id = store_safe_id(order.order_id)
        order_document = {"orderId": order.order_id, "customerId": order.customer_id,
                          "currency": order.currency, "total": order.total,
                          "lineCount": len(order.lines), "status": "accepted", "kind": "order"}

        def build(tx: Any) -> dict[str, Any]:
            for n, line in enumerate(order.lines, start=1):
                tx.create(f"{document_id}:line:{n:03d}",
                          {"orderId": order.order_id, "kind": "line", **line})
            tx.send(self.notifications_topic, order_accepted(order),
                    properties={"type": ORDER_ACCEPTED, "orderId": order.order_id})
            return {"orderId": order.order_id, "total": order.total}

        return settle_outcome(CONSUMER, lambda: self.idempotency.run_atomic(
            key, digest, build, partition=document_id, marker_id=document_id,
            marker_body=order_document, expires=False, context=message_context(message),
            read_first=message.delivery_count > 1), message)
