"""The persistence interface every dedup backend implements.

Backends know how to store records and documents atomically; they know
nothing about the dedup flow, which lives in `shared.handler`. Business
documents are backend-neutral: an id, a partition and a flat body, mapped to
a Cosmos document (`id` + partition key field) or a Table entity
(`PartitionKey` + `RowKey`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.exceptions import (
    RETRIABLE_STATUS,
    IdempotencyError,
    OperationFailedError,
    RecordChangedError,
    RecordExistsError,
    StoreUnavailableError,
)
from shared.records import IdempotencyRecord

OperationKind = Literal["create", "replace", "upsert", "patch", "delete"]


@dataclass(frozen=True)
class Document:
    """A business document read from the store, with its etag for conditional writes."""

    id: str
    partition: str
    body: dict[str, Any]
    etag: str | None = None


@dataclass(frozen=True)
class WriteOp:
    """One business write inside an atomic commit (same partition as the marker)."""

    kind: OperationKind
    id: str
    body: dict[str, Any] = field(default_factory=dict)
    etag: str | None = None  # replace/patch/delete only when the document is unchanged
    patch: tuple[dict[str, Any], ...] = ()  # Cosmos patch operations


def transaction_failure(index: int, status: int | None, *, marker_id: str | None,
                        detail: str = "") -> IdempotencyError:
    """The store-contract error for a failed transaction (the marker, if any, at index 0).

    Both backends report the failing operation's index and status; this maps
    them the same way: marker 409 = exists, marker 404/412 = changed, throttling
    or timeouts = retriable, anything else = the business operation failed.
    """
    if marker_id is not None and index == 0:
        if status == 409:
            return RecordExistsError(marker_id)
        if status in (404, 412):
            return RecordChangedError(marker_id)
    if status in RETRIABLE_STATUS:
        return StoreUnavailableError(f"transaction failed with {status}", status_code=status)
    return OperationFailedError(index - (marker_id is not None), status, detail)


class IdempotencyStore(abc.ABC):
    """Records (markers) plus the business documents that commit with them."""

    #: Store requests issued by this instance (for tests and benchmarks).
    name: str = "store"

    # -- records ------------------------------------------------------------
    @abc.abstractmethod
    def create_record(self, record: IdempotencyRecord) -> IdempotencyRecord:
        """Insert if absent (one request). Raises RecordExistsError on 409."""

    @abc.abstractmethod
    def get_record(self, record: IdempotencyRecord) -> IdempotencyRecord | None:
        """Read the stored record at `record`'s id/partition, or None."""

    @abc.abstractmethod
    def replace_record(self, record: IdempotencyRecord) -> IdempotencyRecord:
        """Replace when the stored etag equals `record.etag`. RecordChangedError otherwise."""

    @abc.abstractmethod
    def delete_record(self, record: IdempotencyRecord) -> None:
        """Delete when the etag still matches. RecordChangedError otherwise."""

    @abc.abstractmethod
    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None) -> IdempotencyRecord:
        """Write the marker first and `operations` in one transaction (one partition).

        The marker is created, or replaced when it carries an etag (taking over
        an expired record). RecordExistsError / RecordChangedError when the
        marker write fails; OperationFailedError when a business write fails.
        Nothing is written in either case.
        """

    @abc.abstractmethod
    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        """Records whose lease ran out before a time, or which expired before a time."""

    @abc.abstractmethod
    def purge_expired(self, now: float, *, batch_size: int = 100) -> int:
        """Delete records that expired before `now`; return how many were deleted."""

    # -- documents ------------------------------------------------------------
    @abc.abstractmethod
    def read_document(self, partition: str, document_id: str) -> Document | None:
        """Point read of a business document."""

    @abc.abstractmethod
    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        """Apply `operations` atomically in one partition (no marker)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release network resources."""
