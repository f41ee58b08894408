"""An in-process store: the fast test double, and the contract written out plainly.

It passes the Cosmos and Table backends' conformance suite (conditional creates,
etag-conditional replace/delete, all-or-nothing transactions with the marker first, flat
business bodies); prove the real thing against Azurite and the Cosmos server.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from shared._core.codec import (
    bound_millis,
    check_flat,
    is_record,
    pending_names,
    record_fields,
    record_from_fields,
)
from shared._core.exceptions import RecordChangedError
from shared._core.outbox import PENDING_SINCE
from shared._core.records import IdempotencyRecord
from shared._core.store import (
    Document,
    IdempotencyStore,
    WriteOp,
    check_transaction_size,
    transaction_failure,
    written_documents,
)
from shared._core.sweep import is_expired, is_stale

Row = tuple[dict[str, Any], str]  # (properties, etag)


class InMemoryIdempotencyStore(IdempotencyStore):
    """Records and documents in a dict, guarded by one lock; thread-safe."""

    name = "memory"

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], Row] = {}
        self._lock = threading.Lock()
        self._etags = itertools.count(1)

    def _etag(self) -> str:
        return f'W/"{next(self._etags)}"'

    def _unchanged(self, location: tuple[str, str], record: IdempotencyRecord) -> Row:
        """The row at `location` if its etag is `record`'s (call under the lock)."""
        row = self._rows.get(location)
        if row is None or row[1] != record.etag:
            raise RecordChangedError(record.id)
        return row

    def _records(self, keep: Callable[[dict[str, Any]], bool]) -> Iterator[IdempotencyRecord]:
        """A snapshot of the records whose properties `keep` accepts."""
        with self._lock:
            rows = [(location, copy.deepcopy(row)) for location, row in self._rows.items()
                    if is_record(row[0]) and keep(row[0])]
        for (partition, record_id), (properties, etag) in rows:
            yield record_from_fields(properties, record_id=record_id, partition=partition, etag=etag)

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        with self._lock:
            row = self._rows.get((partition, record_id))
        if row is None or not is_record(row[0]):
            return None
        return record_from_fields(copy.deepcopy(row[0]), record_id=record_id, partition=partition,
                                  etag=row[1])

    def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self.commit(record.evolve(etag=None), [])

    def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        if record.etag is None:
            raise RecordChangedError(record.id)
        return self.commit(record, [])

    def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        location = (record.partition_key, record.id)
        with self._lock:
            self._unchanged(location, record)
            del self._rows[location]

    def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        location = (marker.partition_key, marker.id)
        with self._lock:
            row = self._unchanged(location, marker)
            drop = set(pending_names(marker))
            body = {name: value for name, value in row[0].items() if name not in drop}
            etag = self._etag()
            self._rows[location] = (body, etag)
        return marker.evolve(etag=etag, outbox=())

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        before = bound_millis(since_before)
        yield from self._records(lambda row: 0 < int(row.get(PENDING_SINCE) or 0) < before)

    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        for record in self._records(lambda _: True):
            if ((in_progress_before is None or is_stale(record, in_progress_before))
                    and (expired_before is None or is_expired(record, expired_before))):
                yield record

    def read_document(self, partition: str, document_id: str) -> Document | None:
        with self._lock:
            row = self._rows.get((partition, document_id))
        if row is None:
            return None
        return Document(document_id, partition, copy.deepcopy(row[0]), row[1])

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        etags = self._transact(partition, None, None, operations)
        return [Document(op.id, partition, op.body, etag)
                for op, etag in zip(operations, etags, strict=True)]

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        if marker_body:
            check_flat(marker_body)
        etags = self._transact(marker.partition_key, marker, marker_body, operations)
        if written is not None:
            written += written_documents(marker.partition_key, operations, etags[1:])
        return marker.evolve(etag=etags[0])

    def _transact(self, partition: str, marker: IdempotencyRecord | None,
                  marker_body: dict[str, Any] | None, operations: Sequence[WriteOp]) -> list[str]:
        """Apply every write or none: work on a copy, swap it in at the end."""
        for op in operations:
            if op.record is None:
                check_flat(op.body)
        operations = [replace(op, body=record_fields(op.record, written_id=op.id))
                      if op.record is not None else op
                      for op in operations]  # further markers of a group commit
        check_transaction_size(len(operations) + (marker is not None))
        with self._lock:
            rows = dict(self._rows)
            etags: list[str] = []
            writes: list[WriteOp] = []
            if marker is not None:
                body = {**(marker_body or {}), **record_fields(marker)}
                writes.append(WriteOp("replace" if marker.etag else "create", marker.id, body,
                                      etag=marker.etag))
            writes.extend(operations)
            for index, op in enumerate(writes):
                status = self._apply(rows, partition, op)
                if status is not None:
                    raise transaction_failure(index, status,
                                              marker_id=marker.id if marker else None)
                etags.append(rows[(partition, op.id)][1] if op.kind != "delete" else "")
            self._rows = rows
            return etags

    def _apply(self, rows: dict[tuple[str, str], Row], partition: str, op: WriteOp) -> int | None:
        """Apply one write to `rows`; the HTTP status it would fail with, or None."""
        location = (partition, op.id)
        current = rows.get(location)
        if op.kind == "create":
            if current is not None:
                return 409
        elif op.kind in ("replace", "delete", "patch"):
            if current is None:
                return 404
            if op.etag is not None and current[1] != op.etag:
                return 412
        if op.kind == "delete":
            del rows[location]
            return None
        body = copy.deepcopy(op.body)
        if op.kind == "patch":
            assert current is not None
            body = copy.deepcopy(current[0])
            for change in op.patch:
                if change.get("op") not in ("set", "replace", "add", "incr"):
                    return 400
                name = str(change["path"]).lstrip("/")
                if change["op"] == "incr":
                    body[name] = body.get(name, 0) + change["value"]
                else:
                    body[name] = change["value"]
        rows[location] = (body, self._etag())
        return None
