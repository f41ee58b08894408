"""A durable place for messages that must not be retried blindly nor dropped.

Parked entries are keyed deterministically (a replay parks the same entry
again, not a second one) and hold the payload, the reason and where the
message came from, so a person can resolve and resubmit it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from shared.keys import store_safe_id
from shared.records import IdempotencyRecord, RecordState
from shared.stores.base import DocumentStore, RecordStore, WriteOp
from shared.telemetry import Telemetry

MAX_INLINE_PAYLOAD_CHARS = 30_000  # a Table string property holds 32K UTF-16 chars


class ParkingLot:
    """Writes parked entries to a store partitioned by consumer."""

    def __init__(self, store: DocumentStore, *, telemetry: Telemetry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._telemetry = telemetry or Telemetry()
        self._clock = clock

    def park(self, *, consumer: str, entry_id: str, reason: str, payload: bytes | str,
             error: str = "", alert: bool = True, context: Mapping[str, Any] | None = None) -> str:
        """Upsert the entry and raise an alert event; returns the stored id.

        `context` (where the message came from: partition, sequence number,
        properties, message id) is kept on the entry for the person resolving it.
        """
        context = dict(context or {})
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
        raw = payload if isinstance(payload, bytes) else payload.encode("utf-8")
        body: dict[str, Any] = {
            "consumer": consumer,
            "entryId": entry_id,
            "reason": reason,
            "error": error[:8000],
            "payload": text[:MAX_INLINE_PAYLOAD_CHARS],
            "payloadBytes": len(raw),
            "payloadSha256": hashlib.sha256(raw).hexdigest(),
            "payloadTruncated": len(text) > MAX_INLINE_PAYLOAD_CHARS,
            "context": json.dumps(context, default=str, sort_keys=True)[:8000],
            "parkedAt": float(self._clock()),
            "resolved": False,
        }
        document_id = store_safe_id(entry_id)
        self._store.write_documents(store_safe_id(consumer), [WriteOp("upsert", document_id, body)])
        if alert:
            self._telemetry.parked(consumer=consumer, reason=reason,
                                   context={**context, "entry_id": entry_id, "error": error[:500]})
        return document_id

    def park_record(self, store: RecordStore, record: IdempotencyRecord, *, reason: str,
                    payload: bytes | str, error: str, now: float,
                    context: Mapping[str, Any] | None = None) -> IdempotencyRecord:
        """Park an in-progress record nobody can resolve automatically, then close it.

        Closed = completed with result {"parked": reason}, so no redelivery repeats
        its effect; a person decides from the parked entry. Raises the store's
        error when the record changed meanwhile or the store is down.
        """
        self.park(consumer=record.key.consumer, entry_id=record.key.key, reason=reason,
                  payload=payload, error=error, context={**(context or {}),
                                                         "attempts": record.attempts})
        closed = record.evolve(state=RecordState.COMPLETED, lease_expires_at=None,
                               result={"parked": reason}, updated_at=now)
        return store.replace_record_if_unchanged(closed)

    def get(self, consumer: str, entry_id: str) -> dict[str, Any] | None:
        document = self._store.read_document(store_safe_id(consumer), store_safe_id(entry_id))
        return document.body if document else None
