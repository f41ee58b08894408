"""The order audit trail from an Azure Storage queue: each `OrderAccepted` applied once.

Whatever accepts an order puts one `OrderAccepted` on the `order-audit` Storage queue
(`type`, `orderId`, `customerId`, `currency`, `total`, `lineCount`: the body `orders`
publishes). This consumer keeps an audit trail per customer: one entry per order, and a
summary (orders counted, total in cents) that the same transaction updates. The entry
document is the order's dedup marker, kept for good (the key lives in the business
entity); the summary's increments are not idempotent, so the dedup flow is what keeps
each order counted once.

The key is the order id, a business key: a Storage queue gives each message its own id,
so a producer's retry arrives with a new one, and only the order id absorbs it (a
redelivery after a crash before the delete has the same message id and is absorbed too).
Refused on the first delivery, to the poison queue with the reason: an event that cannot
be read (`InvalidOrderAccepted`, or the decoder's reason), an order id already audited
with other content (`IdempotencyKeyConflict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shared import (
    Decision,
    InvalidPayloadError,
    QueueMessageView,
    StorageQueueConsumer,
    exact_integer,
    parse_json_object,
    store_safe_id,
)

CONSUMER = "order_audit"
ORDER_ACCEPTED = "OrderAccepted"
SUMMARY_DOCUMENT = "summary"
MAX_EVENT_BYTES = 48 * 1024  # a queue message's 64 KiB, base64-encoded by the producer
MAX_LINES = 98
MAX_TOTAL = 1e13  # in cents still an exact integer in a double (Cosmos DB) and in Edm.Int64
REASON = "InvalidOrderAccepted"


@dataclass(frozen=True)
class OrderAccepted:
    order_id: str
    customer_id: str
    currency: str
    total_cents: int
    line_count: int

    def content(self) -> dict[str, Any]:
        """What identifies the event's content; hashed to tell a copy from a reused order id."""
        return {"orderId": self.order_id, "customerId": self.customer_id,
                "currency": self.currency, "totalCents": self.total_cents,
                "lineCount": self.line_count}


def parse_order_accepted(view: QueueMessageView) -> OrderAccepted:
    """The event in the message; InvalidPayloadError says what is wrong with it."""
    data = parse_json_object(view.body, max_bytes=MAX_EVENT_BYTES)
    if data.get("type", ORDER_ACCEPTED) != ORDER_ACCEPTED:
        raise InvalidPayloadError(REASON, f"type must be {ORDER_ACCEPTED!r}")
    order_id, customer = data.get("orderId"), data.get("customerId")
    if not isinstance(order_id, str) or not order_id.strip():
        raise InvalidPayloadError(REASON, "orderId must be a non-empty string")
    if not isinstance(customer, str) or not customer.strip():
        raise InvalidPayloadError(REASON, "customerId must be a non-empty string")
    currency = data.get("currency")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        raise InvalidPayloadError(REASON, "currency must be a 3-letter code")
    total = data.get("total")
    if (not isinstance(total, (int, float)) or isinstance(total, bool) or not math.isfinite(total)
            or not 0 <= total <= MAX_TOTAL):
        raise InvalidPayloadError(REASON, f"total must be a number in [0, {MAX_TOTAL:g}]")
    lines = exact_integer(data.get("lineCount"), "lineCount", reason=REASON, maximum=MAX_LINES)
    return OrderAccepted(order_id, customer, currency.upper(), round(total * 100), lines)


def audit_partition(customer_id: str) -> str:
    """One partition per customer: its entries, its summary and their markers commit together."""
    return store_safe_id(f"audit|{customer_id}")


def entry_id(order_id: str) -> str:
    return store_safe_id(f"entry|{order_id}")


def entry(event: OrderAccepted) -> tuple[str, dict[str, Any]]:
    """The order's audit entry: its own dedup marker (id, body), kept for good."""
    return entry_id(event.order_id), {**event.content(), "kind": "audit-entry"}


def count_order(tx: Any, event: OrderAccepted) -> dict[str, Any]:
    """Add the order to its customer's summary (an increment: applied once by the dedup flow)."""
    current = tx.read(SUMMARY_DOCUMENT)
    orders = int(current.body.get("orders", 0)) if current is not None else 0
    cents = int(current.body.get("totalCents", 0)) if current is not None else 0
    body = {"customerId": event.customer_id, "orders": orders + 1,
            "totalCents": cents + event.total_cents, "kind": "audit-summary"}
    if current is None:
        tx.create(SUMMARY_DOCUMENT, body)
    else:
        tx.replace(SUMMARY_DOCUMENT, body, etag=current.etag)
    return {"orderId": event.order_id, "customerOrders": orders + 1}


class OrderAuditTrail:
    """The `order_audit` queue trigger's consumer."""

    def __init__(self, consumer: StorageQueueConsumer) -> None:
        self.consumer = consumer

    def handle(self, message: Any) -> Decision:
        """One delivery: returns (the host deletes it) or raises MessageRetryError."""
        return self.consumer.run_atomic(
            message, count_order, parse=parse_order_accepted,
            key=lambda event: event.order_id, content=lambda event: event.content(),
            partition=lambda event: audit_partition(event.customer_id), marker=entry)

    def summary(self, customer_id: str) -> dict[str, Any] | None:
        """The customer's summary as stored (None: no order audited yet)."""
        document = self.consumer.idempotency.store.read_document(audit_partition(customer_id),
                                                                 SUMMARY_DOCUMENT)
        return None if document is None else dict(document.body)

    def entry(self, customer_id: str, order_id: str) -> dict[str, Any] | None:
        """The order's audit entry as stored (None: not audited)."""
        document = self.consumer.idempotency.store.read_document(audit_partition(customer_id),
                                                                 entry_id(order_id))
        return None if document is None else dict(document.body)
