"""Order status events: the naturally idempotent path (a versioned upsert), no dedup record.

Each event carries the order's full resulting state and a version. It is
applied as an upsert guarded by the version: create when absent, replace
under the etag only when the incoming version is newer. Replays and
duplicates change nothing; older events arriving late are rejected (dedup
does not order events; versions do). Each result is a point on the
`dedup.messages` metric (processed, duplicate, stale_version); a late older
version is expected reordering, logged at DEBUG only.
"""

from __future__ import annotations

from typing import Any

from domain.messages import InboundMessage, InvalidMessageError, parse_json_object
from shared import Document, DocumentStore, IdempotencyError, run_sync, store_safe_id, update_document
from shared.payload import exact_integer
from shared.settlement import Decision, decision_for_error
from shared.telemetry import Telemetry

MAX_STATUS_BYTES = 64 * 1024
STATUSES = ("accepted", "paid", "packed", "shipped", "delivered", "cancelled")


def parse_status(message: InboundMessage) -> dict[str, Any]:
    data = parse_json_object(message.body, max_bytes=MAX_STATUS_BYTES)
    order_id, version, status = data.get("orderId"), data.get("version"), data.get("status")
    if not isinstance(order_id, str) or not order_id:
        raise InvalidMessageError("InvalidStatusEvent", "orderId must be a non-empty string")
    version = exact_integer(version, "version", reason="InvalidStatusEvent")
    if status not in STATUSES:
        raise InvalidMessageError("InvalidStatusEvent", f"status must be one of {STATUSES}")
    flat = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return {**flat, "orderId": order_id, "version": version, "status": status}


class OrderStatusService:
    """Applies full-state status events by version; no dedup record involved."""

    def __init__(self, store: DocumentStore, *, max_attempts: int = 5,
                 telemetry: Telemetry | None = None, consumer: str = "order_status") -> None:
        self.store = store
        self.max_attempts = max_attempts
        self.telemetry = telemetry or Telemetry()
        self.consumer = consumer
        self.backend: str = getattr(store, "name", "store")  # the record stores name themselves

    def apply(self, state: dict[str, Any], *, delivery_count: int | None = None) -> str:
        """Return 'applied', 'unchanged' (same version again) or 'stale' (older version);
        each is counted on the messages metric."""
        document_id = store_safe_id(state["orderId"])
        verdict, stored_version = "applied", 0

        def change(current: Document | None) -> dict[str, Any] | None:
            nonlocal verdict, stored_version
            stored_version = int(current.body.get("version", 0)) if current is not None else 0
            if current is None or stored_version < state["version"]:
                verdict = "applied"
                return state
            verdict = "unchanged" if stored_version == state["version"] else "stale"
            return None

        run_sync(update_document(document_id, document_id, change, attempts=self.max_attempts),
                 self.store)
        self.telemetry.versioned(
            verdict, consumer=self.consumer, backend=self.backend, delivery_count=delivery_count,
            context={"order_id": state["orderId"], "incoming_version": state["version"],
                     "stored_version": stored_version})
        return verdict

    def handle(self, message: InboundMessage) -> Decision:
        try:
            state = parse_status(message)
        except InvalidMessageError as error:
            return Decision.deadletter(error.reason, error.detail)
        try:
            result = self.apply(state, delivery_count=message.delivery_count)
        except IdempotencyError as error:
            decision = decision_for_error(error, delivery_count=message.delivery_count)
            if decision is None:
                raise
            return decision
        return Decision.complete(result)
