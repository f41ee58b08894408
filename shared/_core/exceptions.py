"""Precise exception types of the dedup library; every one derives from `IdempotencyError`.

Three families: errors the caller acts on (a message that can never succeed, a store outage;
the two that carry an `Outcome` live in `shared._core.records`, so this module imports nothing
of the library), configuration errors raised when the library is set up, and the store
contract errors the backends raise to the flow (record exists, etag mismatch, failed batch).
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils


class IdempotencyError(Exception):
    """Base class of every error this library raises."""


class ConfigurationError(IdempotencyError, ValueError):
    """The library is set up wrong (a missing or mismatched collaborator, an option out of
    range): raised at construction, with the fix in the message, never per message."""


class PoisonMessageError(IdempotencyError):
    """The message can never succeed as it is: dead-letter or park it with `reason` (a short
    stable code) on its first delivery, never retry it. Raise it from a parse or a build to
    refuse a message; `detail` says what is wrong."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class InvalidKeyError(IdempotencyError, ValueError):
    """The dedup key is empty, too long, undecodable, or a transport-level value."""


class ResultTooLargeError(IdempotencyError, ValueError):
    """The handler's result is larger than the store may keep on the record."""


class RetentionConfigError(ConfigurationError):
    """The record TTL is shorter than the window in which the broker can redeliver."""


class StoreUnavailableError(IdempotencyError):
    """The store is throttling, timing out or unreachable: retry later. Never read this as
    "not a duplicate": the message must not be acknowledged."""

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


class _MarkerWriteError(IdempotencyError):
    """A record write failed; `index` says which marker of a group commit it was (0 alone)."""

    def __init__(self, record_id: str = "", *, index: int = 0) -> None:
        super().__init__(record_id)
        self.record_id = record_id
        self.index = index


class RecordExistsError(_MarkerWriteError):
    """A conditional create found the record already there (HTTP 409)."""


class RecordChangedError(_MarkerWriteError):
    """An etag-conditional write lost the race: the record changed or vanished (412/404)."""


class OperationFailedError(IdempotencyError):
    """A business operation inside an atomic commit failed; nothing was committed."""

    def __init__(self, index: int, status_code: int | None, message: str = "") -> None:
        super().__init__(message or f"operation {index} failed with status {status_code}")
        self.index = index
        self.status_code = status_code


class _RecordError(IdempotencyError):
    """An error about a claim, which it carries as `record`."""

    def __init__(self, message: str, *, record: object | None = None) -> None:
        super().__init__(message)
        self.record = record


class EffectUncertainError(_RecordError):
    """The handler cannot tell whether its effect happened (e.g. a timeout after sending).

    Raised by a two-phase handler, it keeps the claim (`record`) in progress instead of
    releasing it, so no redelivery repeats the effect blindly; the caller reconciles or parks it.
    """


class LeaseLostError(_RecordError):
    """A two-phase holder's lease ran out and another consumer took the key over: both effects
    may have run; the store keeps the other one's record (`record`), never this holder's result.
    """


class ConcurrencyRetriesExhaustedError(IdempotencyError):
    """An optimistic write kept losing races; redeliver the message later."""


RETRIABLE_STATUS = frozenset({408, 429, 449, 500, 502, 503, 504})
_RETRY_AFTER_MS = ("x-ms-retry-after-ms", "retry-after-ms")


def retry_after(error: BaseException) -> float | None:
    """Seconds the store asked the caller to wait before retrying, if its answer said so: the
    first response header `x-ms-retry-after-ms`, `retry-after-ms` or `Retry-After` (seconds or
    an HTTP date) on the error, the SDK error it wraps (`.error`) or its causes.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        headers = getattr(getattr(current, "response", None), "headers", None)
        if headers:
            lowered = {str(name).lower(): str(value) for name, value in headers.items()}
            for name in _RETRY_AFTER_MS:
                if name in lowered:
                    with contextlib.suppress(ValueError):
                        return max(0.0, float(lowered[name]) / 1000.0)
            if "retry-after" in lowered:
                return _seconds_from(lowered["retry-after"])
        current = getattr(current, "error", None) or current.__cause__
    return None


def _seconds_from(value: str) -> float | None:
    """A Retry-After value (delay in seconds, or an HTTP date) as seconds from now."""
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


class OutgoingMessageTooLargeError(IdempotencyError, ValueError):
    """An outgoing message (or one key's messages) is larger than the marker can carry; raised
    while the consumer records it, before anything commits, never at dispatch."""


class _DispatchError(IdempotencyError):
    """A dispatch failed; `error` is the SDK's. The messages stay pending on the marker."""

    def __init__(self, message: str, *, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.error = error


class DispatchUnavailableError(_DispatchError):
    """The broker did not take (or did not confirm) an outgoing message: retry later (safe: the
    ids are stable and the destination deduplicates them)."""


class DispatchRejectedError(_DispatchError):
    """The broker refused an outgoing message for a reason retrying will not fix (no such
    destination, over the entity's size limit); the failure is alerted."""


class MultiRegionWritesError(ConfigurationError):
    """The Cosmos DB account accepts writes in more than one region, so no single region
    arbitrates a key (two regions can each accept a copy's marker, and both effects run).
    Raised when a store is built (async: on its first request)."""

    def __init__(self, message: str, *, regions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.regions = regions
