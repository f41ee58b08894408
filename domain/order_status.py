"""Order status events: the naturally idempotent path (spec requirement 7), no dedup record.

Each event carries the order's full resulting state and a version. It is
applied as an upsert guarded by the version: create when absent, replace
under the etag only when the incoming version is newer. Replays and
duplicates change nothing; older events arriving late are rejected and
logged (requirement 10: dedup does not order, versions do).
"""

from __future__ import annotations

import logging
from typing import Any

from domain.messages import InboundMessage, InvalidMessageError, parse_json_object
from shared import IdempotencyStore, StoreRequestError, StoreUnavailableError, WriteOp, store_safe_id
from shared.exceptions import OperationFailedError
from shared.settlement import Decision

MAX_STATUS_BYTES = 64 * 1024
STATUSES = ("accepted", "paid", "packed", "shipped", "delivered", "cancelled")
logger = logging.getLogger(__name__)


def parse_status(message: InboundMessage) -> dict[str, Any]:
    data = parse_json_object(message.body, max_bytes=MAX_STATUS_BYTES)
    order_id, version, status = data.get("orderId"), data.get("version"), data.get("status")
    if not isinstance(order_id, str) or not order_id:
        raise InvalidMessageError("InvalidStatusEvent", "orderId must be a non-empty string")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidMessageError("InvalidStatusEvent", "version must be a positive integer")
    if status not in STATUSES:
        raise InvalidMessageError("InvalidStatusEvent", f"status must be one of {STATUSES}")
    flat = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return {**flat, "orderId": order_id, "version": version, "status": status}


class OrderStatusService:
    """Applies full-state status events by version; no dedup store involved."""

    def __init__(self, store: IdempotencyStore, *, max_attempts: int = 5) -> None:
        self.store = store
        self.max_attempts = max_attempts

    def apply(self, state: dict[str, Any]) -> str:
        """Return 'applied', 'unchanged' (same version again) or 'stale' (older version)."""
        document_id = store_safe_id(state["orderId"])
        for _ in range(self.max_attempts):
            current = self.store.read_document(document_id, document_id)
            if current is not None:
                stored_version = int(current.body.get("version", 0))
                if stored_version == state["version"]:
                    return "unchanged"
                if stored_version > state["version"]:
                    logger.warning("stale status event rejected", extra={
                        "event": "StaleStatusRejected", "order_id": state["orderId"],
                        "incoming_version": state["version"], "stored_version": stored_version})
                    return "stale"
            op = (WriteOp("create", document_id, state) if current is None
                  else WriteOp("replace", document_id, state, etag=current.etag))
            try:
                self.store.write_documents(document_id, [op])
                return "applied"
            except OperationFailedError as error:
                if error.status_code not in (404, 409, 412):
                    raise
        raise StoreUnavailableError(f"order {state['orderId']}: too many concurrent updates")

    def handle(self, message: InboundMessage) -> Decision:
        try:
            state = parse_status(message)
        except InvalidMessageError as error:
            return Decision.deadletter(error.reason, error.detail)
        try:
            result = self.apply(state)
        except StoreUnavailableError as error:
            return Decision.abandon("StoreUnavailable", str(error))
        except StoreRequestError as error:
            return Decision.deadletter("StoreRejected", str(error))
        return Decision.complete(result)
