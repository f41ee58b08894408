"""Event Hubs checkpoint-replay absorption: a per-partition high-water mark.

The mark is the highest sequence number whose effects are all committed (or
durably parked) for one (consumer, hub, consumer group, partition). Events at
or below it are skipped with no per-event store request, so a replayed,
already-processed batch costs one read. Events above it go through the
per-event dedup claim. The mark only moves forward: create-if-absent, then
etag-conditional replace while the new value is higher.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from shared.keys import store_safe_id
from shared.stores.base import (
    UNREAD,
    Document,
    DocumentStep,
    DocumentStore,
    Unread,
    adrive,
    drive,
    update_document_flow,
)


@dataclass(frozen=True)
class Mark:
    sequence_number: int
    document: Document  # as read, with its etag, for the next conditional write


class PartitionWatermark:
    """Reads and advances high-water marks kept as documents in a document store.

    With `remember=True` the mark this instance last read or wrote is answered
    from memory, which saves a read per batch while the instance owns the
    partition. That is safe because a mark only moves up: a remembered mark is
    never above the stored one, so at worst events between the two are
    processed again and absorbed by their keys; and the next advance is
    etag-conditional, so a mark another instance moved meanwhile is re-read.
    """

    def __init__(self, store: DocumentStore, *, consumer: str, event_hub: str,
                 consumer_group: str, max_attempts: int = 10, remember: bool = False) -> None:
        self._store = store
        self._partition = store_safe_id(f"hwm|{consumer}|{event_hub}|{consumer_group}")
        self._max_attempts = max_attempts
        self._known: dict[str, Mark] | None = {} if remember else None

    def read(self, partition_id: str) -> Mark | None:
        if self._known is not None and partition_id in self._known:
            return self._known[partition_id]
        return self._seen(partition_id, self._store.read_document(
            self._partition, store_safe_id(partition_id)))

    def advance(self, partition_id: str, sequence_number: int, *,
                known: Mark | Unread | None = UNREAD) -> int:
        """Move the mark up to `sequence_number` (never down); return the stored mark.

        `known` is the mark the caller read for this batch (None: none yet), which
        saves a read; a lost race re-reads.
        """
        stored = [sequence_number]
        drive(self._advance_flow(partition_id, sequence_number, known, stored),
              lambda step: getattr(self._store, step[0])(*step[1:]))
        return stored[0]

    def _seen(self, partition_id: str, document: Document | None) -> Mark | None:
        """The mark in `document`, remembered when this instance remembers marks."""
        mark = None if document is None else Mark(int(document.body["sequenceNumber"]), document)
        if self._known is not None and mark is not None:
            self._known[partition_id] = mark
        return mark

    def _advance_flow(self, partition_id: str, sequence_number: int,
                      known: Mark | Unread | None, stored: list[int]
                      ) -> Generator[DocumentStep, Any]:
        seen: list[Document | None] = [None]

        def change(current: Document | None) -> dict[str, Any] | None:
            seen[0] = current
            if current is not None and int(current.body["sequenceNumber"]) >= sequence_number:
                stored[0] = int(current.body["sequenceNumber"])
                return None  # already as high: never move it down
            return {"sequenceNumber": int(sequence_number), "partitionId": partition_id}

        hint = known if isinstance(known, Unread) or known is None else known.document
        try:
            written = yield from update_document_flow(
                self._partition, store_safe_id(partition_id), change, known=hint,
                attempts=self._max_attempts)
        except BaseException:
            if self._known is not None:
                self._known.pop(partition_id, None)  # read it again next time
            raise
        self._seen(partition_id, written or seen[0])


class AsyncPartitionWatermark(PartitionWatermark):
    """`PartitionWatermark` on an async document store (`shared.aio`): the same mark, awaited."""

    async def read(self, partition_id: str) -> Mark | None:  # type: ignore[override]
        if self._known is not None and partition_id in self._known:
            return self._known[partition_id]
        return self._seen(partition_id, await self._store.read_document(
            self._partition, store_safe_id(partition_id)))

    async def advance(self, partition_id: str, sequence_number: int, *,  # type: ignore[override]
                      known: Mark | Unread | None = UNREAD) -> int:
        async def perform(step: DocumentStep) -> Any:
            return await getattr(self._store, step[0])(*step[1:])

        stored = [sequence_number]
        await adrive(self._advance_flow(partition_id, sequence_number, known, stored), perform)
        return stored[0]
