"""One retry budget: explicit SDK retry options, and the worst-case wait they allow.

The SDKs' own retry defaults, the caller's retries and the host's retry policy multiply, so
the time a throttled unit of work holds its invocation is bounded nowhere. `RetryBudget`
makes the SDK layer short and fixed, leaving the long waits to the caller (which honours
`Retry-After` up to its own cap) and the host (which holds nothing while it backs off):

* Cosmos DB: at most `sdk_retries` throttle and connection retries per request, `sdk_wait`
  apart (fixed: the SDK's wait ignores the service's retry-after, which the caller honours).
* Table Storage: no SDK retry of an error status (azure-core would honour any `Retry-After`,
  uncapped), at most `sdk_retries` connection and read retries, at most `sdk_wait` apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RetryBudget:
    """SDK retry options for both backends, and the bounds they give."""

    sdk_retries: int = 2  # retries of one request inside the SDK (at least 1: Cosmos reads 0 as 9)
    sdk_wait: float = 1.0  # seconds between them

    def __post_init__(self) -> None:
        if self.sdk_retries < 1:
            raise ValueError("sdk_retries must be at least 1 (azure-cosmos reads 0 as its default, 9)")
        if self.sdk_wait <= 0:
            raise ValueError("sdk_wait must be positive")

    @property
    def request_seconds(self) -> float:
        """The longest one request waits inside the SDK before its error reaches the caller."""
        return self.sdk_retries * self.sdk_wait

    def unit_seconds(self, *, attempts: int, max_retry_after: float) -> float:
        """The longest a unit of work waits when every request is throttled: `attempts` tries,
        each spending the SDK's retries and followed by a wait of at most `max_retry_after`."""
        return attempts * (self.request_seconds + max_retry_after)

    def cosmos_options(self) -> dict[str, Any]:
        """Keyword options for `azure.cosmos` clients, sync and async."""
        return {"retry_total": self.sdk_retries, "retry_throttle_total": self.sdk_retries,
                "retry_fixed_interval": max(1, round(self.sdk_wait * 1000)),
                "retry_throttle_backoff_max": self.request_seconds,
                "retry_backoff_max": self.sdk_wait, "retry_backoff_factor": self.sdk_wait}

    def table_options(self) -> dict[str, Any]:
        """Keyword options for `azure.data.tables` clients, sync and async."""
        return {"retry_total": self.sdk_retries, "retry_connect": self.sdk_retries,
                "retry_read": self.sdk_retries, "retry_status": 0,
                "retry_backoff_factor": self.sdk_wait / 2, "retry_backoff_max": self.sdk_wait}
