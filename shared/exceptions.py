"""Precise exception types of the dedup library.

Two families: errors the caller must act on (bad keys, oversized results,
retention misconfiguration, store outages) and the store contract errors the
backends raise to the flow (record exists, etag mismatch, failed batch).
"""

from __future__ import annotations

from azure.core.exceptions import AzureError


class IdempotencyError(Exception):
    """Base class of every error this library raises."""


class InvalidKeyError(IdempotencyError, ValueError):
    """The dedup key is empty, too long, undecodable, or a transport-level value."""


class ResultTooLargeError(IdempotencyError, ValueError):
    """The handler's result is larger than the store may keep on the record."""


class RetentionConfigError(IdempotencyError, ValueError):
    """The record TTL is shorter than the window in which the broker can redeliver."""


class StoreUnavailableError(IdempotencyError):
    """The store is throttling, timing out or unreachable: retry later.

    Never read this as "not a duplicate": the message must not be acknowledged.
    """

    def __init__(self, message: str, *, status_code: int | None = None,
                 error: BaseException | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error = error


class StoreRequestError(IdempotencyError):
    """The store rejected a request for a reason retrying will not fix (e.g. HTTP 400)."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class RecordExistsError(IdempotencyError):
    """A conditional create found the record already there (HTTP 409)."""


class RecordChangedError(IdempotencyError):
    """An etag-conditional write lost the race: the record changed or vanished (412/404)."""


class OperationFailedError(IdempotencyError):
    """A business operation inside an atomic commit failed; nothing was committed."""

    def __init__(self, index: int, status_code: int | None, message: str = "") -> None:
        super().__init__(message or f"operation {index} failed with status {status_code}")
        self.index = index
        self.status_code = status_code


class EffectUncertainError(IdempotencyError):
    """The handler cannot tell whether its effect happened (e.g. a timeout after sending).

    Raised by a two-phase handler, it keeps the claim in progress instead of
    releasing it, so no redelivery repeats the effect blindly; the caller
    reconciles or parks it. `record` is the claim still held.
    """

    def __init__(self, message: str, *, record: object | None = None) -> None:
        super().__init__(message)
        self.record = record


class ConcurrencyRetriesExhaustedError(IdempotencyError):
    """An optimistic write kept losing races; redeliver the message later."""


RETRIABLE_STATUS = frozenset({408, 429, 449, 500, 502, 503, 504})


def is_transport_error(error: BaseException) -> bool:
    """True for connection failures and timeouts that carry no HTTP status."""
    return isinstance(error, AzureError) and getattr(error, "status_code", None) is None
