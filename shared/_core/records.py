"""What the store keeps per key, and what processing a message can yield."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shared._core.exceptions import IdempotencyError, ResultTooLargeError
from shared._core.jsontext import compact_encoder
from shared._core.keys import DedupKey
from shared._core.outbox import EventPosition, OutgoingMessage


class RecordState(enum.StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class OutcomeStatus(enum.StrEnum):
    """Every way one delivery can end for the dedup flow."""

    PROCESSED = "processed"  # first time: the effect happened now
    DUPLICATE = "duplicate"  # seen before with the same content: first result returned
    CONFLICT = "conflict"  # same key, different content: dead-letter/park and alert
    IN_PROGRESS = "in_progress"  # another consumer holds a live lease: retry later
    TAKEN_OVER = "taken_over"  # a stale in-progress record was taken over and processed
    STALE = "stale"  # a stale in-progress record the caller chose to reconcile itself
    LEASE_LOST = "lease_lost"  # our effect ran, but the lease ran out and another consumer
    #                            took the key over: the store keeps its result, not ours


@dataclass(frozen=True)
class IdempotencyRecord:
    """One processed (or in-flight) key. Times are epoch seconds (UTC)."""

    key: DedupKey
    state: RecordState
    request_hash: str
    created_at: float
    updated_at: float
    expires_at: float | None = None  # None: lives as long as the entity it is part of
    lease_expires_at: float | None = None  # in_progress only
    attempts: int = 1
    result: Any = None
    partition: str | None = None  # defaults to the encoded key
    record_id: str | None = None  # defaults to the encoded key
    etag: str | None = field(default=None, compare=False)
    # Messages the committed effect sends, not yet recorded as dispatched: they travel on the
    # marker, so whoever reads it (a duplicate, the sweeper) knows what is still to send.
    outbox: tuple[OutgoingMessage, ...] = ()
    # On a marker of an Event Hubs batch, its event's position: its messages are pending while
    # the partition's mark does not cover it; None: pending until recorded as dispatched.
    outbox_position: EventPosition | None = None
    # The store's clock when it wrote this record, where its answer tells it for free (Cosmos
    # `_ts`, a Table etag). Never stored: compared with `updated_at` to notice clock skew.
    server_time: float | None = field(default=None, compare=False)

    @property
    def id(self) -> str:
        return self.record_id or self.key.encoded

    @property
    def partition_key(self) -> str:
        return self.partition or self.key.encoded

    @property
    def has_pending(self) -> bool:
        return bool(self.outbox)

    def is_expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def is_lease_expired(self, now: float) -> bool:
        return (self.state is RecordState.IN_PROGRESS and self.lease_expires_at is not None
                and self.lease_expires_at <= now)

    def evolve(self, **changes: Any) -> IdempotencyRecord:
        """`dataclasses.replace`, without its per-call field introspection (hot path)."""
        unknown = changes.keys() - _RECORD_FIELDS
        if unknown:
            return replace(self, **changes)  # raises the usual TypeError
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


_RECORD_FIELDS = frozenset(f.name for f in fields(IdempotencyRecord))
_result_json = compact_encoder()


def encode_result(result: Any, max_bytes: int) -> str:
    """The result as JSON text, refused with a clear error when too large to store."""
    try:
        text = _result_json(result)
    except (TypeError, ValueError, RecursionError) as error:
        raise ResultTooLargeError(f"handler result is not JSON-serializable: {error}") from error
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise ResultTooLargeError(
            f"handler result is {size} bytes of JSON; the record keeps at most {max_bytes}. "
            "Store large results elsewhere and return a reference."
        )
    return text


@dataclass(frozen=True)
class Outcome:
    """The result of running one message through the dedup flow."""

    status: OutcomeStatus
    key: DedupKey
    request_hash: str
    result: Any = None
    record: IdempotencyRecord | None = None

    @property
    def stored_hash(self) -> str | None:
        return self.record.request_hash if self.record else None

    @property
    def should_ack(self) -> bool:
        """Safe to settle the message as complete (effect done now or earlier)."""
        return self.status in (OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER,
                               OutcomeStatus.DUPLICATE, OutcomeStatus.LEASE_LOST)


class _OutcomeError(IdempotencyError):
    def __init__(self, message: str, *, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class KeyReusedError(_OutcomeError):
    """The key was processed before with other content (a producer reused an id): the first
    content's effect stands; this call did nothing. `outcome` holds both request hashes."""


class KeyInProgressError(_OutcomeError):
    """Another attempt holds the key under a live lease: retry after it ends (`outcome`)."""
