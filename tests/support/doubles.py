"""Test doubles with what only tests need: a memory store that counts its requests, dispatchers
that fail on demand. The library's own doubles (`InMemoryIdempotencyStore`,
`InMemoryDispatcher`, in shared.testing) stay plain."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

from shared._backends.memory import InMemoryIdempotencyStore
from shared._core.exceptions import DispatchUnavailableError
from shared._core.outbox import OutgoingMessage
from shared._core.records import IdempotencyRecord
from shared._core.store import Document, WriteOp
from shared.testing import InMemoryDispatcher


class CountingMemoryStore(InMemoryIdempotencyStore):
    """The in-memory store, counting each request it answers (`requests`): a create or a
    replace is one commit, a group commit one commit, as on the real backends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        self.requests += 1
        return super().get_record(partition, record_id)

    def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        self.requests += 1
        super().delete_record_if_unchanged(record)

    def record_dispatched(self, marker: IdempotencyRecord) -> IdempotencyRecord:
        self.requests += 1
        return super().record_dispatched(marker)

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        self.requests += 1
        return super().iter_pending(since_before=since_before)

    def iter_records(self, **options: Any) -> Iterator[IdempotencyRecord]:
        self.requests += 1
        return super().iter_records(**options)

    def read_document(self, partition: str, document_id: str) -> Document | None:
        self.requests += 1
        return super().read_document(partition, document_id)

    def write_documents(self, partition: str, operations: Sequence[WriteOp]) -> list[Document]:
        self.requests += 1
        return super().write_documents(partition, operations)

    def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
               marker_body: dict[str, Any] | None = None,
               written: list[Document] | None = None) -> IdempotencyRecord:
        self.requests += 1
        return super().commit(marker, operations, marker_body=marker_body, written=written)


class FailingDispatcher(InMemoryDispatcher):
    """Records what it sends; `fail_next(n)` makes the next n dispatch calls raise
    `DispatchUnavailableError` before sending anything, `accept_then_fail_next(n)` sends
    and then raises (a send whose answer was lost)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self._fail = 0
        self._accept_then_fail = 0

    def fail_next(self, count: int = 1) -> None:
        self._fail += count

    def accept_then_fail_next(self, count: int = 1) -> None:
        self._accept_then_fail += count

    def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        with self._lock:
            self.calls += 1
            if self._fail:
                self._fail -= 1
                raise DispatchUnavailableError("injected: broker unavailable")
            self.sent.extend(messages)
            if self._accept_then_fail:
                self._accept_then_fail -= 1
                raise DispatchUnavailableError("injected: sent, answer lost")


class AsyncFailingDispatcher:
    """`FailingDispatcher`, awaited (as `shared._backends.dispatch_aio` dispatchers are)."""

    def __init__(self) -> None:
        self.sync = FailingDispatcher()

    @property
    def sent(self) -> list[OutgoingMessage]:
        return self.sync.sent

    @property
    def calls(self) -> int:
        return self.sync.calls

    def fail_next(self, count: int = 1) -> None:
        self.sync.fail_next(count)

    def accept_then_fail_next(self, count: int = 1) -> None:
        self.sync.accept_then_fail_next(count)

    def ids(self) -> list[str]:
        return self.sync.ids()

    async def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        await asyncio.sleep(0)  # a real send yields to the loop
        self.sync.dispatch(messages)

    async def close(self) -> None:
        pass


def applied_now(outcome: Any) -> bool:
    """Whether the outcome's effect ran in this call (a new key, a stale claim taken over, or a
    lease lost after the effect ran)."""
    from shared._core.records import OutcomeStatus

    return outcome.status in (OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER,
                              OutcomeStatus.LEASE_LOST)


def single_region_connection() -> SimpleNamespace:
    """A stand-in container's `client_connection`: what the Cosmos store's account check reads
    of the SDK's (the account it cached, one write region)."""
    account = SimpleNamespace(_EnableMultipleWritableLocations=False,
                              WritableLocations=[{"name": "stand-in"}])
    return SimpleNamespace(_global_endpoint_manager=SimpleNamespace(_database_account_cache=account),
                           url_connection="stand-in")
