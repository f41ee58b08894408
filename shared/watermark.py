"""Event Hubs checkpoint-replay absorption: a per-partition high-water mark.

The mark is the highest sequence number whose effects are all committed (or
durably parked) for one (consumer, hub, consumer group, partition). Events at
or below it are skipped with no per-event store request, so a replayed,
already-processed batch costs one read. Events above it go through the
per-event dedup claim. The mark only moves forward: create-if-absent, then
etag-conditional replace while the new value is higher.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.exceptions import (
    ConcurrencyRetriesExhaustedError,
    OperationFailedError,
)
from shared.keys import store_safe_id
from shared.stores.base import IdempotencyStore, WriteOp

_RACES = frozenset({404, 409, 412})


class _Unread:
    """Marks "the caller has not read the mark"; None means "read: there is none"."""


UNREAD = _Unread()


@dataclass(frozen=True)
class Mark:
    sequence_number: int
    etag: str | None


class PartitionWatermark:
    """Reads and advances high-water marks kept as documents in a dedup store."""

    def __init__(self, store: IdempotencyStore, *, consumer: str, event_hub: str,
                 consumer_group: str, max_attempts: int = 10) -> None:
        self._store = store
        self._partition = store_safe_id(f"hwm|{consumer}|{event_hub}|{consumer_group}")
        self._max_attempts = max_attempts

    def read(self, partition_id: str) -> Mark | None:
        document = self._store.read_document(self._partition, store_safe_id(partition_id))
        if document is None:
            return None
        return Mark(int(document.body["sequenceNumber"]), document.etag)

    def advance(self, partition_id: str, sequence_number: int, *,
                known: Mark | _Unread | None = UNREAD) -> int:
        """Move the mark up to `sequence_number` (never down); return the stored mark.

        `known` is the mark the caller read for this batch (None: none yet), which
        saves a read; a lost race re-reads.
        """
        document_id = store_safe_id(partition_id)
        body = {"sequenceNumber": int(sequence_number), "partitionId": partition_id}
        current = None if isinstance(known, _Unread) else known
        for attempt in range(self._max_attempts):
            if attempt > 0 or isinstance(known, _Unread):
                current = self.read(partition_id)
            if current is not None and current.sequence_number >= sequence_number:
                return current.sequence_number
            op = (WriteOp("create", document_id, body) if current is None
                  else WriteOp("replace", document_id, body, etag=current.etag))
            try:
                self._store.write_documents(self._partition, [op])
                return sequence_number
            except OperationFailedError as error:
                if error.status_code not in _RACES:
                    raise
        raise ConcurrencyRetriesExhaustedError(f"could not advance the mark of {partition_id}")
