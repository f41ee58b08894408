"""What one atomic commit writes, and what a group commit already read.

`Writes` collects the business writes a build adds (one partition, committed
after the marker) and the messages it sends (`send`: recorded on the marker in
the same transaction, dispatched after the commit). `Reads` lets a group commit read each document once across
its attempts and chunks, and take documents this process wrote last from a
`DocumentCache` instead of reading them (the commit's etag condition checks them).
Both are plain state: the flows in `shared.flow` and `shared.idempotency` do the I/O.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from shared.cache import DocumentCache
from shared.keys import DedupKey
from shared.outbox import OutgoingMessage, PropertyValue, check_pending_size, outgoing
from shared.stores.base import Document, WriteOp


class Writes:
    """The business writes of one atomic commit, in order, and the messages it sends.

    `key` is the dedup key the messages' default ids derive from (in a group commit, the
    first message's: the marker that carries them); `correlation_id` the incoming
    message's, propagated unless `send` is given another.
    """

    def __init__(self, partition: str, *, key: DedupKey | None = None,
                 correlation_id: str | None = None) -> None:
        self.partition = partition
        self.operations: list[WriteOp] = []
        self.outgoing: list[OutgoingMessage] = []
        self._key = key
        self._correlation_id = correlation_id
        self._ordinals: Counter[str] = Counter()

    def send(self, destination: str, body: bytes | str | Mapping[str, Any] | Sequence[Any], *,
             message_id: str | None = None, content_type: str | None = None,
             properties: Mapping[str, PropertyValue] | None = None,
             correlation_id: str | None = None, session_id: str | None = None,
             partition_key: str | None = None,
             scheduled_enqueue_time: datetime.datetime | None = None) -> OutgoingMessage:
        """Record a message to send once this transaction has committed (see `shared.outbox`).

        Its id defaults to one derived from the key, the destination and its ordinal there,
        so a rebuilt transaction yields the same ids. Too large a body, or too many bytes
        for one marker, raises OutgoingMessageTooLargeError here, before anything commits.
        """
        if self._key is None:
            raise TypeError("this transaction has no dedup key to send for (use an atomic commit)")
        ordinal = self._ordinals[destination]
        message = outgoing(self._key, destination, body, ordinal=ordinal, message_id=message_id,
                           content_type=content_type,
                           correlation_id=correlation_id or self._correlation_id,
                           properties=properties, session_id=session_id,
                           partition_key=partition_key,
                           scheduled_enqueue_time=scheduled_enqueue_time)
        check_pending_size([*self.outgoing, message])
        self._ordinals[destination] = ordinal + 1
        self.outgoing.append(message)
        return message

    def create(self, document_id: str, body: dict[str, Any]) -> None:
        self.operations.append(WriteOp("create", document_id, body))

    def replace(self, document_id: str, body: dict[str, Any], *, etag: str | None) -> None:
        self.operations.append(WriteOp("replace", document_id, body, etag))

    def upsert(self, document_id: str, body: dict[str, Any]) -> None:
        self.operations.append(WriteOp("upsert", document_id, body))

    def patch(self, document_id: str, operations: list[dict[str, Any]], *,
              etag: str | None = None) -> None:
        self.operations.append(WriteOp("patch", document_id, etag=etag, patch=tuple(operations)))

    def delete(self, document_id: str, *, etag: str | None = None) -> None:
        self.operations.append(WriteOp("delete", document_id, etag=etag))


class Reads:
    """What one group commit read, across its attempts and chunks, so it reads each document
    once and again only after losing a race on it; and, with a `DocumentCache`, documents
    this process wrote last, taken instead of a read (the commit's etag checks them)."""

    def __init__(self, partition: str, cache: DocumentCache | None = None) -> None:
        self.partition = partition
        self.cache = cache
        self.documents: dict[str, Document | None] = {}
        self.cached: dict[str, Document] = {}  # taken from the cache: must be written back

    def known(self, document_id: str) -> tuple[bool, Document | None]:
        """(True, the document) when it needs no read; (False, None) otherwise."""
        if document_id in self.documents:
            return True, self.documents[document_id]
        found = self.cache.get(self.partition, document_id) if self.cache is not None else None
        if found is None:
            return False, None
        self.documents[document_id] = self.cached[document_id] = found
        return True, found

    def remember(self, document_id: str, document: Document | None) -> None:
        self.documents[document_id] = document

    def unchecked(self, operations: Sequence[WriteOp]) -> list[str]:
        """Cached documents the writes do not write back under the etag taken: read them."""
        checked = {op.id for op in operations
                   if op.kind in ("replace", "patch", "delete") and op.id in self.cached
                   and op.etag == self.cached[op.id].etag}
        unchecked = [document_id for document_id in self.cached if document_id not in checked]
        self.forget(unchecked)
        return unchecked

    def forget(self, document_ids: Sequence[str]) -> None:
        for document_id in document_ids:
            self.documents.pop(document_id, None)
            self.cached.pop(document_id, None)
            if self.cache is not None:
                self.cache.forget(self.partition, document_id)

    def lost_race(self) -> None:
        """A business write failed its condition: read everything again."""
        self.forget(list(self.cached))
        self.documents.clear()

    def committed(self, operations: Sequence[WriteOp], written: Sequence[Document]) -> None:
        """After a commit: remember what it wrote; the next chunk builds on that."""
        self.forget([op.id for op in operations])
        self.documents.clear()
        if self.cache is not None:
            for document in written:
                self.cache.put(document)
