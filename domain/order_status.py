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

from shared import (
    Decision,
    Document,
    InvalidPayloadError,
    MessageView,
    Telemetry,
    aio,
    exact_integer,
    parse_json_object,
    store_safe_id,
)

MAX_STATUS_BYTES = 64 * 1024
STATUSES = ("accepted", "paid", "packed", "shipped", "delivered", "cancelled")


def parse_status(message: MessageView) -> dict[str, Any]:
    data = parse_json_object(message.body, max_bytes=MAX_STATUS_BYTES)
    order_id, version, status = data.get("orderId"), data.get("version"), data.get("status")
    if not isinstance(order_id, str) or not order_id:
        raise InvalidPayloadError("InvalidStatusEvent", "orderId must be a non-empty string")
    version = exact_integer(version, "version", reason="InvalidStatusEvent")
    if status not in STATUSES:
        raise InvalidPayloadError("InvalidStatusEvent", f"status must be one of {STATUSES}")
    flat = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return {**flat, "orderId": order_id, "version": version, "status": status}


class OrderStatusService:
    """Applies full-state status events by version; no dedup record involved."""

    def __init__(self, consumer: aio.ServiceBusConsumer, store: aio.AsyncStore, *,
                 max_attempts: int = 5, telemetry: Telemetry | None = None) -> None:
        self.consumer = consumer
        self.store = store
        self.max_attempts = max_attempts
        self.telemetry = telemetry or consumer.telemetry

    async def apply(self, state: dict[str, Any], *, delivery_count: int | None = None) -> str:
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

        await aio.update_document(self.store, document_id, document_id, change,
                                  attempts=self.max_attempts)
        self.telemetry.versioned(
            verdict, consumer=self.consumer.name, backend=self.store.name,
            delivery_count=delivery_count,
            context={"order_id": state["orderId"], "incoming_version": state["version"],
                     "stored_version": stored_version})
        return verdict

    async def handle(self, message: Any, actions: Any = None) -> Decision:
        async def apply(view: MessageView) -> Decision:
            state = parse_status(view)
            return Decision.complete(await self.apply(state, delivery_count=view.delivery_count))

        return await self.consumer.process(message, actions, apply)
