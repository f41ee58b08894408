"""Event Hubs checkpoint-replay absorption: a per-partition high-water mark.

The mark is the highest sequence number whose effects are all committed (or
durably parked) for one (consumer, hub, consumer group, partition). Events at
or below it are skipped with no per-event store request, so a replayed,
already-processed batch costs one read. Events above it go through the
per-event dedup claim. The mark only moves forward: create-if-absent, then
etag-conditional replace while the new value is higher.

Written once as flows: `PartitionWatermark` runs them on a sync document store,
`shared.aio.PartitionWatermark` awaits them on an async one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.flow import UNREAD, Async, Flow, ReadDocument, Sync, Unread, flowmethod, update_document
from shared.keys import store_safe_id
from shared.stores.base import Document


@dataclass(frozen=True)
class Mark:
    sequence_number: int
    document: Document  # as read, with its etag, for the next conditional write


class BasePartitionWatermark:
    """Reads and advances high-water marks kept as documents in a document store.

    With `remember=True` the mark this instance last read or wrote is answered from
    memory, which saves a read per batch while the instance owns the partition. That is
    safe because a mark only moves up: a remembered mark is never above the stored one, so
    at worst events between the two are processed again and absorbed by their keys; and
    the next advance is etag-conditional, so a mark another instance moved meanwhile is
    re-read.
    """

    def __init__(self, store: Any, *, consumer: str, event_hub: str, consumer_group: str,
                 max_attempts: int = 10, remember: bool = False) -> None:
        self.store = store
        self._partition = store_safe_id(f"hwm|{consumer}|{event_hub}|{consumer_group}")
        self._max_attempts = max_attempts
        self._known: dict[str, Mark] | None = {} if remember else None

    @flowmethod
    def read(self, partition_id: str) -> Flow[Mark | None]:
        """The partition's mark (None: no event of it was committed yet)."""
        if self._known is not None and partition_id in self._known:
            return self._known[partition_id]
        document = yield ReadDocument(self._partition, store_safe_id(partition_id))
        return self._seen(partition_id, document)

    @flowmethod
    def advance(self, partition_id: str, sequence_number: int, *,
                known: Mark | Unread | None = UNREAD) -> Flow[int]:
        """Move the mark up to `sequence_number` (never down); return the stored mark.

        `known` is the mark the caller read for this batch (None: none yet), which saves a
        read; a lost race re-reads.
        """
        def change(current: Document | None) -> dict[str, Any] | None:
            if current is not None and int(current.body["sequenceNumber"]) >= sequence_number:
                return None  # already as high: never move it down
            return {"sequenceNumber": int(sequence_number), "partitionId": partition_id}

        hint = known if isinstance(known, Unread) or known is None else known.document
        try:
            written, seen = yield from update_document(
                self._partition, store_safe_id(partition_id), change, known=hint,
                attempts=self._max_attempts)
        except BaseException:
            if self._known is not None:
                self._known.pop(partition_id, None)  # read it again next time
            raise
        mark = self._seen(partition_id, written or seen)
        return sequence_number if mark is None else mark.sequence_number

    def _seen(self, partition_id: str, document: Document | None) -> Mark | None:
        """The mark in `document`, remembered when this instance remembers marks."""
        mark = None if document is None else Mark(int(document.body["sequenceNumber"]), document)
        if self._known is not None and mark is not None:
            self._known[partition_id] = mark
        return mark


class PartitionWatermark(BasePartitionWatermark, Sync):
    __doc__ = BasePartitionWatermark.__doc__


class AsyncPartitionWatermark(BasePartitionWatermark, Async):
    """`PartitionWatermark` on an async document store (`shared.aio.PartitionWatermark`)."""
