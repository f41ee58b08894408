"""Per-process bounded LRUs: completed dedup records, and the documents this process wrote last.

Hot duplicates are answered from memory without a store request. Only completed records are
kept (an in-progress one can still be released or taken over, so it is always re-read).
Correctness does not depend on the cache: a miss falls through to the store, which stays the
arbiter; each entry keeps the stored request hash, so a reused key is still a conflict. An
entry is dropped once older than `max_age` (the cache's monotonic clock) or when the record
expired (the flow's clock); keep `max_age` well below the record TTL. After an operator deletes
a record so a message can be processed again, call `invalidate` (or wait `max_age`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from shared._core.keys import DedupKey
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import Document

DEFAULT_MAX_ENTRIES = 10_000
DEFAULT_MAX_AGE = timedelta(minutes=5)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    evictions: int = 0
    expirations: int = 0


class CompletedKeyCache:
    """Thread-safe LRU of completed records, keyed by (consumer, key); `max_entries` 0 disables
    it, `max_age` bounds how long an entry answers without the store."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *,
                 max_age: timedelta | float = DEFAULT_MAX_AGE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        age = max_age.total_seconds() if isinstance(max_age, timedelta) else float(max_age)
        if age <= 0:
            raise ValueError("max_age must be positive")
        self.max_entries = max_entries
        self.max_age = age
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[float, IdempotencyRecord]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _slot(key: DedupKey) -> tuple[str, str]:
        return (key.consumer, key.key)

    def get(self, key: DedupKey, *, now: float | None = None) -> IdempotencyRecord | None:
        """The completed record for `key`, or None. `now` is the flow's clock, for record expiry."""
        if not self.enabled:
            return None
        slot = self._slot(key)
        with self._lock:
            entry = self._entries.get(slot)
            if entry is None:
                self.stats.misses += 1
                return None
            cached_at, record = entry
            too_old = self._clock() - cached_at >= self.max_age
            if too_old or (now is not None and record.is_expired(now)):
                del self._entries[slot]
                self.stats.expirations += 1
                self.stats.misses += 1
                return None
            self._entries.move_to_end(slot)
            self.stats.hits += 1
            return record

    def put(self, record: IdempotencyRecord) -> bool:
        """Remember a completed record; in-progress records are refused (returns False)."""
        if not self.enabled or record.state is not RecordState.COMPLETED:
            return False
        slot = self._slot(record.key)
        with self._lock:
            self._entries[slot] = (self._clock(), record)
            self._entries.move_to_end(slot)
            self.stats.stores += 1
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.stats.evictions += 1
        return True

    def invalidate(self, key: DedupKey) -> None:
        with self._lock:
            self._entries.pop(self._slot(key), None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class DocumentCache:
    """Business documents this process wrote last, with their etags: a bounded LRU.

    A group commit (`Idempotency(..., documents=DocumentCache())`) takes a document from here
    instead of reading it. The commit's etag condition is the check: when someone else changed
    it since, the transaction fails as a lost race, the entry is dropped and the document read
    again. So an entry is only used for a document the build writes back under the etag it
    read; any other read goes to the store. Only documents with an etag are kept.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], Document] = OrderedDict()

    def get(self, partition: str, document_id: str) -> Document | None:
        with self._lock:
            found = self._entries.get((partition, document_id))
            if found is not None:
                self._entries.move_to_end((partition, document_id))
            return found

    def put(self, document: Document) -> None:
        if document.etag is None:
            return
        with self._lock:
            self._entries[(document.partition, document.id)] = document
            self._entries.move_to_end((document.partition, document.id))
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def forget(self, partition: str, document_id: str) -> None:
        with self._lock:
            self._entries.pop((partition, document_id), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
