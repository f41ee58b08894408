"""A durable place for messages that must not be retried blindly nor dropped.

Entries are keyed deterministically (a replay parks the same entry again, not a second one)
and hold the payload, the reason and where the message came from, so a person can resolve and
resubmit it. `mark` appends who did what, when and with which outcome to the entry's history
and, for a final decision, closes it; a closed entry's outcome is never overwritten
(`EntryResolvedError`). Whoever acts on an entry first `claim`s it under its etag, a claim that
expires like a lease, so two people never act on it at once (`EntryClaimedError`). Listing needs
a `lister` (the documents of one partition, or of all when given None).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared._core.exceptions import IdempotencyError
from shared._core.keys import store_safe_id
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import Document, ReadDocument, ReplaceRecordIfUnchanged, WriteDocuments, WriteOp
from shared._core.telemetry import Telemetry
from shared._flows.drivers import Async, Sync, flowmethod
from shared._flows.steps import Flow, OnStore, update_document

MAX_INLINE_PAYLOAD_CHARS = 30_000  # a Table string property holds 32K UTF-16 chars
MAX_HISTORY = 50  # resolution attempts kept on an entry (the newest)
#: Lists the documents of one partition (a store-safe consumer id), or of every partition (None).
EntryLister = Callable[[str | None], Iterable[Document]]


def _same_message(body: Mapping[str, Any], identity: str, payload: bytes | str) -> bool:
    """Whether a stored entry is this message's: same identity, or (parked without one) payload."""
    stored = body.get("identity")
    if stored is not None:
        return stored == identity
    raw = payload if isinstance(payload, bytes) else payload.encode("utf-8")
    return body.get("payloadSha256") == hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class ParkedEntry:
    """One parked message as stored, with what people did about it."""

    consumer: str
    entry_id: str
    reason: str
    error: str
    payload: str
    payload_bytes: int
    payload_sha256: str
    payload_truncated: bool
    context: dict[str, Any]
    parked_at: float
    resolved: bool = False
    resolution: str | None = None  # the final action: e.g. "replayed", "discarded"
    resolved_by: str | None = None
    resolved_at: float | None = None
    outcome: str | None = None  # what the last action led to
    note: str | None = None
    history: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    etag: str | None = None
    claimed_by: str | None = None  # who is acting on it right now
    claimed_at: float | None = None
    claim_expires_at: float | None = None
    claim_token: str | None = None  # one per claim: two runs by the same person stay apart

    def claimed(self, now: float) -> bool:
        """Someone holds an unexpired claim on the entry."""
        return self.claim_token is not None and (self.claim_expires_at or 0.0) > now

    @property
    def payload_intact(self) -> bool:
        """The stored text is byte for byte what was parked (not truncated, not re-decoded)."""
        return (not self.payload_truncated and
                hashlib.sha256(self.payload.encode("utf-8")).hexdigest() == self.payload_sha256)

    @classmethod
    def from_document(cls, document: Document) -> ParkedEntry:
        body = document.body

        def loads(name: str, default: Any) -> Any:
            try:
                value = json.loads(body.get(name) or "null")
            except ValueError:
                return default
            return default if value is None else value

        return cls(
            consumer=str(body.get("consumer", "")), entry_id=str(body.get("entryId", document.id)),
            reason=str(body.get("reason", "")), error=str(body.get("error", "")),
            payload=str(body.get("payload", "")), payload_bytes=int(body.get("payloadBytes", 0)),
            payload_sha256=str(body.get("payloadSha256", "")),
            payload_truncated=bool(body.get("payloadTruncated", False)),
            context=loads("context", {}), parked_at=float(body.get("parkedAt", 0.0)),
            resolved=bool(body.get("resolved", False)), resolution=body.get("resolution"),
            resolved_by=body.get("resolvedBy"), resolved_at=body.get("resolvedAt"),
            outcome=body.get("outcome"), note=body.get("note"),
            history=tuple(loads("history", [])), etag=document.etag,
            claimed_by=body.get("claimedBy"), claimed_at=body.get("claimedAt"),
            claim_expires_at=body.get("claimExpiresAt"), claim_token=body.get("claimToken"))


_CLAIM_FIELDS = ("claimedBy", "claimedAt", "claimExpiresAt", "claimToken")


def _without_claim(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in _CLAIM_FIELDS}


def _open_entry(current: Document | None, consumer: str, entry_id: str
                ) -> tuple[ParkedEntry, dict[str, Any]]:
    """The entry to act on and a copy of its body; KeyError or EntryResolvedError otherwise."""
    if current is None:
        raise KeyError(f"no parked entry {entry_id!r} for {consumer!r}")
    entry = ParkedEntry.from_document(current)
    if entry.resolved:
        raise EntryResolvedError(f"{entry_id} is already {entry.resolution}", entry)
    return entry, dict(current.body)


class ParkedEntryError(IdempotencyError):
    """An action on a parked entry cannot go ahead; `entry` is the entry as found."""

    def __init__(self, message: str, entry: ParkedEntry) -> None:
        super().__init__(message)
        self.entry = entry


class EntryResolvedError(ParkedEntryError):
    """The entry is already resolved: its outcome stands and is not overwritten."""


class EntryClaimedError(ParkedEntryError):
    """Someone else holds an unexpired claim on the entry."""


class BaseParkingLot:
    """Parked entries in a document store, partitioned by consumer; `ParkingLot` and
    `shared.aio.ParkingLot` are its variants."""

    def __init__(self, store: Any, *, telemetry: Telemetry | None = None,
                 clock: Callable[[], float] = time.time, lister: EntryLister | None = None) -> None:
        self.store = store
        self._telemetry = telemetry or Telemetry()
        self._clock = clock
        self._lister = lister

    @flowmethod
    def park(self, *, consumer: str, entry_id: str, reason: str, payload: bytes | str,
             error: str = "", alert: bool = True, context: Mapping[str, Any] | None = None,
             identity: str | None = None) -> Flow[str]:
        """Upsert the entry and raise an alert event; returns the stored id.

        `context` (where the message came from) is kept on the entry. `identity` tells apart
        two messages that can share `entry_id`: when the entry there is another message's, it
        is kept and this one is parked as `entry_id@identity`; the same message parked again
        replaces its own entry. That costs one read.
        """
        if identity is not None:
            existing = yield ReadDocument(store_safe_id(consumer), store_safe_id(entry_id))
            if existing is not None and not _same_message(existing.body, identity, payload):
                entry_id = f"{entry_id}@{identity}"
        partition, write = self._entry(consumer, entry_id, reason, payload, error, context,
                                       identity=identity)
        yield WriteDocuments(partition, (write,))
        if alert:
            self._telemetry.parked(consumer=consumer, reason=reason, context={
                **(context or {}), "entry_id": entry_id, "error": error[:500]})
        return write.id

    def _entry(self, consumer: str, entry_id: str, reason: str, payload: bytes | str, error: str,
               context: Mapping[str, Any] | None, *, identity: str | None = None
               ) -> tuple[str, WriteOp]:
        """The entry's partition and its upsert."""
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
            "context": json.dumps(dict(context or {}), default=str, sort_keys=True)[:8000],
            "parkedAt": float(self._clock()),
            "resolved": False,
        }
        if identity is not None:
            body["identity"] = identity
        return store_safe_id(consumer), WriteOp("upsert", store_safe_id(entry_id), body)

    @flowmethod
    def park_record(self, store: Any, record: IdempotencyRecord, *, reason: str,
                    payload: bytes | str, error: str, now: float,
                    context: Mapping[str, Any] | None = None) -> Flow[IdempotencyRecord]:
        """Park an in-progress record nobody can resolve automatically, then close it in `store`
        (completed with result {"parked": reason}, so no redelivery repeats its effect). Raises
        the store's error when the record changed meanwhile or the store is down."""
        yield from self.park.flow(consumer=record.key.consumer, entry_id=record.key.key,
                                  reason=reason, payload=payload, error=error,
                                  context={**(context or {}), "attempts": record.attempts})
        closed = record.evolve(state=RecordState.COMPLETED, lease_expires_at=None,
                               result={"parked": reason}, updated_at=now)
        return (yield OnStore(store, _replace(closed)))

    @flowmethod
    def entry(self, consumer: str, entry_id: str) -> Flow[ParkedEntry | None]:
        """One entry with its resolution state and etag, or None."""
        document = yield ReadDocument(store_safe_id(consumer), store_safe_id(entry_id))
        return ParkedEntry.from_document(document) if document else None

    def entries(self, consumer: str | None = None, *, include_resolved: bool = False
                ) -> list[ParkedEntry]:
        """Entries of one consumer (or all), oldest first; open ones only unless asked."""
        if self._lister is None:
            raise TypeError("this ParkingLot cannot list entries: build it with a lister")
        partition = None if consumer is None else store_safe_id(consumer)
        found = [ParkedEntry.from_document(d) for d in self._lister(partition)]
        return sorted((e for e in found if include_resolved or not e.resolved),
                      key=lambda e: (e.parked_at, e.consumer, e.entry_id))

    @flowmethod
    def park_if_absent(self, *, consumer: str, entry_id: str, reason: str,
                       payload: bytes | str, error: str = "",
                       context: Mapping[str, Any] | None = None) -> Flow[ParkedEntry]:
        """Create the entry unless it exists (no alert); returns the stored entry either way.
        Unlike `park`, an existing entry keeps its marks, resolution and claim."""
        _, write = self._entry(consumer, entry_id, reason, payload, error, context)
        while True:
            written, current = yield from update_document(
                store_safe_id(consumer), write.id,
                lambda current: write.body if current is None else None)
            found = written or current
            if found is not None:  # None: deleted between the two reads, nothing to keep
                return ParkedEntry.from_document(found)

    @flowmethod
    def claim(self, consumer: str, entry_id: str, *, by: str, lease_seconds: float,
              token: str | None = None) -> Flow[ParkedEntry]:
        """Take the entry for acting on it (who, when, until when) under its etag.

        Raises EntryResolvedError when it is resolved, EntryClaimedError while someone else's
        claim runs, KeyError when there is no such entry. The returned `claim_token` names
        this claim for `mark` and `release`; claiming again with it extends the claim.
        """
        now = float(self._clock())
        token = token or uuid.uuid4().hex

        def change(current: Document | None) -> dict[str, Any]:
            entry, body = _open_entry(current, consumer, entry_id)
            if entry.claimed(now) and entry.claim_token != token:
                raise EntryClaimedError(f"{entry_id} is claimed by {entry.claimed_by}", entry)
            return {**body, "claimedBy": by, "claimedAt": now,
                    "claimExpiresAt": now + lease_seconds, "claimToken": token}

        return (yield from self._rewrite(consumer, entry_id, change))

    @flowmethod
    def release(self, consumer: str, entry_id: str, token: str) -> Flow[None]:
        """Drop this claim without recording anything (nothing was done); a claim that is
        no longer this one (expired and taken, or already dropped) is left alone."""

        def change(current: Document | None) -> dict[str, Any] | None:
            if current is None or current.body.get("claimToken") != token:
                return None
            return _without_claim(current.body)

        yield from update_document(store_safe_id(consumer), store_safe_id(entry_id), change)

    @flowmethod
    def mark(self, consumer: str, entry_id: str, *, action: str, by: str, outcome: str,
             note: str = "", resolved: bool, claim: str | None = None) -> Flow[ParkedEntry]:
        """Record an action on the entry (who, when, outcome, note) under its etag.

        `resolved=True` closes the entry with `action` as its resolution; False keeps it open.
        `claim`, the caller's claim token, is dropped with the mark (a resolution drops any
        claim). Raises KeyError when there is no such entry, EntryResolvedError when it is
        resolved already; retried when someone else changed it meanwhile.
        """
        now = float(self._clock())
        step = {"action": action, "by": by, "at": now, "outcome": outcome[:2000], "note": note[:2000]}

        def change(current: Document | None) -> dict[str, Any]:
            entry, body = _open_entry(current, consumer, entry_id)
            if resolved or (claim is not None and body.get("claimToken") == claim):
                body = _without_claim(body)
            body["history"] = json.dumps([*entry.history, step][-MAX_HISTORY:], default=str)
            body["outcome"] = step["outcome"]
            if note:
                body["note"] = step["note"]
            if resolved:
                body.update(resolved=True, resolution=action, resolvedBy=by, resolvedAt=now)
            return body

        return (yield from self._rewrite(consumer, entry_id, change))

    def _rewrite(self, consumer: str, entry_id: str,
                 change: Callable[[Document | None], dict[str, Any]]) -> Flow[ParkedEntry]:
        """The entry as `change` (which always writes) leaves it, under its etag."""
        written, _ = yield from update_document(store_safe_id(consumer), store_safe_id(entry_id),
                                                change)
        assert written is not None
        return ParkedEntry.from_document(written)


def _replace(record: IdempotencyRecord) -> Flow[IdempotencyRecord]:
    return (yield ReplaceRecordIfUnchanged(record))


class ParkingLot(BaseParkingLot, Sync):
    """Writes parked entries to a document store partitioned by consumer, and resolves them."""


class AsyncParkingLot(BaseParkingLot, Async):
    """`ParkingLot` on an async document store (`shared.aio.ParkingLot`)."""
