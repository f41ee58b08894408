"""Event Hubs checkpoint-replay absorption: a per-partition high-water mark.

The mark is the newest event whose effects, and those of every event before it, are committed
(or durably parked) for one (consumer, hub, consumer group, partition): its sequence number,
enqueued time and offset. Events it covers are skipped with no per-event store request, so a
replayed batch costs one read.

A recreated or failed-over hub restarts sequence numbers at 0, so the mark covers an event only
when it is at or below the mark AND not enqueued after the marked event (`Mark.covers`). The
mark moves to newer events only, in (enqueued time, sequence number) order, by create-if-absent
or etag-conditional writes. A mark or event without a time compares by sequence number alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared._core.keys import store_safe_id
from shared._core.store import Document, ReadDocument
from shared._flows.drivers import Async, Sync, flowmethod
from shared._flows.steps import UNREAD, Flow, Unread, update_document


@dataclass(frozen=True)
class Mark:
    sequence_number: int
    document: Document  # as read, with its etag, for the next conditional write
    enqueued_time: datetime | None = None  # of the marked event; None: a mark stored without it
    offset: str | None = None

    def covers(self, sequence_number: int, enqueued_time: datetime | str | None) -> bool:
        """Whether the event is proven processed: at or below the mark and not newer than it."""
        if sequence_number > self.sequence_number:
            return False
        when = event_time(enqueued_time)
        return when is None or self.enqueued_time is None or when <= self.enqueued_time

    def is_reset(self, sequence_number: int, enqueued_time: datetime | str | None) -> bool:
        """An event at or below the mark yet enqueued after it: the sequence numbers restarted."""
        return sequence_number <= self.sequence_number and not self.covers(
            sequence_number, enqueued_time)


def event_time(value: datetime | str | None) -> datetime | None:
    """An enqueued time as an aware UTC datetime (naive is UTC). Unreadable text is no time,
    not an error that would stall the partition in the host's retries."""
    if value is None or value == "":
        return None
    try:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _newer(sequence_number: int, enqueued_time: datetime | None, current: Document) -> bool:
    """Whether a mark at this event would be newer than the stored one."""
    stored = event_time(current.body.get("enqueuedTime"))
    if enqueued_time is None or stored is None:
        return sequence_number > int(current.body["sequenceNumber"])
    return (enqueued_time, sequence_number) > (stored, int(current.body["sequenceNumber"]))


class BasePartitionWatermark:
    """Reads and advances high-water marks kept as documents in a document store.

    With `remember=True` the mark this instance last read or wrote is answered from memory (a
    read saved per batch). Safe because a mark only moves to newer events: a remembered one is
    never newer than the stored one (events between are absorbed by their keys), and the next
    advance is etag-conditional, so a mark another instance moved is re-read.
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
                known: Mark | Unread | None = UNREAD, enqueued_time: datetime | str | None = None,
                offset: str | None = None) -> Flow[int]:
        """Move the mark to the event at `sequence_number` if it is newer; return the stored mark.
        `known` is the mark the caller read for this batch (None: none yet), which saves a read;
        the write is conditional on its etag, and a lost race re-reads and decides again."""
        when = event_time(enqueued_time)

        def change(current: Document | None) -> dict[str, Any] | None:
            if current is not None and not _newer(sequence_number, when, current):
                return None  # the stored mark is as new: never move it back in time
            body: dict[str, Any] = {"sequenceNumber": int(sequence_number), "partitionId": partition_id}
            if when is not None:
                body["enqueuedTime"] = when.isoformat()
            if offset is not None:
                body["offset"] = str(offset)
            return body

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
        mark = None if document is None else Mark(
            int(document.body["sequenceNumber"]), document,
            event_time(document.body.get("enqueuedTime")),
            None if document.body.get("offset") is None else str(document.body["offset"]))
        if self._known is not None and mark is not None:
            self._known[partition_id] = mark
        return mark


class PartitionWatermark(BasePartitionWatermark, Sync):
    __doc__ = BasePartitionWatermark.__doc__


class AsyncPartitionWatermark(BasePartitionWatermark, Async):
    """`PartitionWatermark` on an async document store (`shared.aio.PartitionWatermark`)."""
