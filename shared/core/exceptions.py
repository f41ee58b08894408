"""Precise exception types of the dedup library; every one derives from `IdempotencyError`.

Three families: errors the caller acts on (a message that can never succeed, a store outage;
the two that carry an `Outcome`, a key reused or held, live beside it in `shared.core.records`
so that this module imports nothing of the library), configuration errors
raised when the library is set up (a missing or mismatched collaborator, a retention
shorter than the redelivery window), and the store contract errors the backends raise
to the flow (record exists, etag mismatch, failed batch).
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
    stable code) on its first delivery, never retry it. Raise it from a parse or a build
    to refuse a message; `detail` says what is wrong."""

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


class EffectUncertainError(IdempotencyError):
    """The handler cannot tell whether its effect happened (e.g. a timeout after sending).

    Raised by a two-phase handler, it keeps the claim in progress instead of
    releasing it, so no redelivery repeats the effect blindly; the caller
    reconciles or parks it. `record` is the claim still held.
    """

    def __init__(self, message: str, *, record: object | None = None) -> None:
        super().__init__(message)
        self.record = record


class LeaseLostError(IdempotencyError):
    """A two-phase holder's lease ran out and another consumer took the key over.

    The holder's effect ran, and so may the other consumer's: the store keeps
    the other one's record (`record`), never this holder's result.
    """

    def __init__(self, message: str, *, record: object | None = None) -> None:
        super().__init__(message)
        self.record = record


class ConcurrencyRetriesExhaustedError(IdempotencyError):
    """An optimistic write kept losing races; redeliver the message later."""


RETRIABLE_STATUS = frozenset({408, 429, 449, 500, 502, 503, 504})
_RETRY_AFTER_MS = ("x-ms-retry-after-ms", "retry-after-ms")


def retry_after(error: BaseException) -> float | None:
    """Seconds the store asked the caller to wait before retrying, if its answer said so.

    Looks through the error, the SDK error it wraps (`StoreUnavailableError.error`)
    and its causes for an HTTP response with `x-ms-retry-after-ms` (Cosmos DB),
    `retry-after-ms` or `Retry-After` (seconds or an HTTP date).
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
    """An outgoing message (or one key's messages) is larger than the marker can carry.

    Raised while the consumer records the message, before anything commits, so
    it is a bug or bad input of this message, never a dispatch-time surprise.
    """


class DispatchUnavailableError(IdempotencyError):
    """The broker did not take (or did not confirm) an outgoing message: retry later.

    The messages stay pending on the marker; re-sending them is safe because
    their ids are stable and the destination deduplicates them.
    """

    def __init__(self, message: str, *, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.error = error


class DispatchRejectedError(IdempotencyError):
    """The broker refused an outgoing message for a reason retrying will not fix.

    For example a destination that does not exist or a message over the
    entity's size limit. The messages stay pending and the failure is alerted.
    """

    def __init__(self, message: str, *, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.error = error


class MultiRegionWritesError(ConfigurationError):
    """The Cosmos DB account accepts writes in more than one region, so no single region
    arbitrates a key: two regions can each accept a copy's marker, and last-writer-wins
    resolves the conflict only after both effects ran. Raised when a store is built (async:
    on its first request); the message names the setting and the fix."""

    def __init__(self, message: str, *, regions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.regions = regions
