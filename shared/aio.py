"""Async counterparts of the dedup flow, and stores that put a sync store behind the async
interface (`ThreadedStore`, `AsyncInMemoryIdempotencyStore`); the Cosmos and Table async
stores are in `shared.stores`.

`AsyncIdempotency` drives the same I/O-free flows as `Idempotency` (see
`shared.handler._FlowCore`), awaiting each store request, so an `async def`
function keeps its event loop free while Cosmos or Table Storage answer.
There is no second copy of the claim/commit/judge logic here: only a driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from shared.cache import CompletedKeyCache, DocumentCache
from shared.config import IdempotencyConfig
from shared.exceptions import RecordChangedError, StoreUnavailableError
from shared.handler import (
    Call,
    Context,
    Flow,
    GroupMessage,
    HandlerRun,
    P,
    Reads,
    TransactionWrites,
    _FlowCore,
    _identify,
)
from shared.keys import DedupKey
from shared.records import IdempotencyRecord, Outcome
from shared.stores.base import AsyncDocumentStore, Document, WriteOp, adrive
from shared.stores.memory import InMemoryIdempotencyStore
from shared.telemetry import Telemetry

logger = logging.getLogger(__name__)


class AsyncStore(Protocol):
    """The store requests the flows make, awaited (records and the atomic commit)."""

    name: str

    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None: ...
    async def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord: ...
    async def replace_record_if_unchanged(self, record: IdempotencyRecord
                                          ) -> IdempotencyRecord: ...
    async def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None: ...
    async def read_document(self, partition: str, document_id: str) -> Document | None: ...
    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None,
                     written: list[Document] | None = None) -> IdempotencyRecord: ...
    async def commit_group(self, markers: Sequence[IdempotencyRecord],
                           operations: Sequence[WriteOp], *,
                           written: list[Document] | None = None) -> list[IdempotencyRecord]: ...


class AsyncTransaction(TransactionWrites):
    """The business writes of one atomic commit; reads are awaited from the async store
    (or answered from `reads`, as in `Transaction`)."""

    def __init__(self, store: AsyncStore, partition: str, reads: Reads | None = None) -> None:
        super().__init__(partition)
        self._store = store
        self._reads = reads

    async def read(self, document_id: str) -> Document | None:
        if self._reads is not None:
            hit, document = self._reads.known(document_id)
            if hit:
                return document
        document = await self._store.read_document(self.partition, document_id)
        if self._reads is not None:
            self._reads.remember(document_id, document)
        return document


async def _maybe_await(value: Any) -> Any:
    """User code may be sync or async: await what needs awaiting."""
    return await value if inspect.isawaitable(value) else value


class AsyncIdempotency(_FlowCore):
    """Runs messages through the dedup flow against an async store.

    Same methods and outcomes as `Idempotency`, as coroutines; `build` and
    handlers may be sync or async.
    """

    store: AsyncStore

    def __init__(self, store: AsyncStore, *, config: IdempotencyConfig | None = None,
                 telemetry: Telemetry | None = None, cache: CompletedKeyCache | None = None,
                 documents: DocumentCache | None = None) -> None:
        super().__init__(store, config=config, telemetry=telemetry, cache=cache,
                         documents=documents)

    def _transaction(self, partition: str, reads: Reads | None = None) -> AsyncTransaction:
        return AsyncTransaction(self.store, partition, reads)

    async def _perform(self, call: Call) -> Any:
        if call.kind == "store":
            return await getattr(self.store, call.name)(*call.args, **call.kwargs)
        assert call.fn is not None
        if call.kind == "build":
            return await _maybe_await(call.fn(*call.args))
        lease = _AsyncLeaseRenewal(self, call.args[0])
        try:
            result = await _maybe_await(call.fn())
        except BaseException as error:  # the flow decides: release or keep
            return HandlerRun(await lease.stop(), error=error)
        return HandlerRun(await lease.stop(), result)

    async def _drive(self, flow: Flow) -> Any:
        """Run a flow against the async store: each Call awaited, errors thrown back in."""
        return await adrive(flow, self._perform)

    # -- two-phase -------------------------------------------------------------------
    async def claim(self, key: DedupKey, digest: str, *, takeover_stale: bool = True,
                    partition: str | None = None) -> tuple[Outcome, IdempotencyRecord | None]:
        """Phase one (see `Idempotency.claim`)."""
        return await self._drive(self._claim_flow(key, digest, takeover_stale=takeover_stale,
                                                  partition=partition))

    async def complete(self, held: IdempotencyRecord, result: Any) -> IdempotencyRecord:
        """Phase two (see `Idempotency.complete`)."""
        return await self._drive(self._complete_flow(held, result))

    async def renew(self, held: IdempotencyRecord) -> IdempotencyRecord:
        """Extend a held lease; RecordChangedError when it was lost."""
        return await self._drive(self._renew_flow(held))

    async def release(self, held: IdempotencyRecord) -> None:
        """Give the key back after a failed handler so a redelivery can retry."""
        await self._drive(self._release_flow(held))

    async def run(self, key: DedupKey, digest: str, handler: Callable[[], Any], *,
                  takeover_stale: bool = True, partition: str | None = None,
                  context: Context | None = None) -> Outcome:
        """Claim, run `handler` (sync or async) once, record its result."""
        return await self._drive(self._run_flow(key, digest, handler,
                                                takeover_stale=takeover_stale,
                                                partition=partition, context=context))

    async def run_atomic(self, key: DedupKey, digest: str,
                         build: Callable[[AsyncTransaction], Any | Awaitable[Any]], *,
                         partition: str | None = None, marker_id: str | None = None,
                         marker_body: dict[str, Any] | None = None, expires: bool = True,
                         context: Context | None = None) -> Outcome:
        """Commit the marker and the writes `build` (sync or async) adds in one transaction."""
        return await self._drive(self._run_atomic_flow(
            key, digest, build, partition=partition, marker_id=marker_id,
            marker_body=marker_body, expires=expires, context=context))

    async def run_atomic_group(self, messages: Sequence[GroupMessage],
                               build: Callable[[AsyncTransaction, Sequence[int]],
                                               Sequence[Any] | Awaitable[Sequence[Any]]], *,
                               partition: str) -> list[Outcome]:
        """Commit many messages of one partition at once (see `Idempotency.run_atomic_group`)."""
        return await self._drive(self._run_atomic_group_flow(messages, build,
                                                             partition=partition))

    def idempotent(self, *, key: Callable[..., DedupKey], payload: Callable[..., Any] | None = None,
                   fields: tuple[str, ...] | None = None
                   ) -> Callable[[Callable[P, Any]], Callable[P, Awaitable[Outcome]]]:
        """Decorate a handler (sync or async) so each call runs once per key; the decorated
        handler is a coroutine function (see `Idempotency.idempotent`)."""
        def decorate(function: Callable[P, Any]) -> Callable[P, Awaitable[Outcome]]:
            @functools.wraps(function)
            async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Outcome:
                dedup_key, digest = _identify(key, payload, fields, args, kwargs)
                return await self.run(dedup_key, digest, lambda: function(*args, **kwargs))
            return wrapper
        return decorate


class _AsyncLeaseRenewal:
    """Keeps a held lease alive while an async handler runs: a task, not a thread.

    Renews every lease/3 for at most `max_lease_renewal`; a lost renewal stops
    it (completion then reports LEASE_LOST); store outages are retried next tick.
    """

    def __init__(self, flow: AsyncIdempotency, held: IdempotencyRecord) -> None:
        self._flow = flow
        self.held = held
        self._done = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._renew())

    async def stop(self) -> IdempotencyRecord:
        """Stop renewing (after a renewal in flight lands); the last held record."""
        self._done.set()
        await self._task
        return self.held

    async def _renew(self) -> None:
        config = self._flow.config
        every = config.lease.total_seconds() / 3
        deadline = config.clock() + config.max_lease_renewal.total_seconds()
        while config.clock() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), every)
            if self._done.is_set():
                return
            try:
                self.held = await self._flow.renew(self.held)
            except RecordChangedError:
                logger.warning("lease lost while the handler ran",
                               extra={"dedup_key": self.held.key.key,
                                      "consumer": self.held.key.consumer})
                return
            except StoreUnavailableError as error:
                logger.warning("could not renew lease: %s", error)


class ThreadedStore(AsyncDocumentStore):
    """A sync store behind the async interface, each request on a worker thread.

    For an async app whose stores are given as sync ones (a test double, a
    fault-injecting wrapper, a backend with no async SDK): the event loop stays
    free while the request runs. The real backends have native async stores.
    """

    def __init__(self, store: Any) -> None:
        self.sync = store

    @property
    def name(self) -> str:
        return str(self.sync.name)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(getattr(self.sync, method), *args, **kwargs)

    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None:
        return await self._call("get_record", partition, record_id)

    async def put_record_if_absent(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return await self._call("put_record_if_absent", record)

    async def replace_record_if_unchanged(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return await self._call("replace_record_if_unchanged", record)

    async def delete_record_if_unchanged(self, record: IdempotencyRecord) -> None:
        await self._call("delete_record_if_unchanged", record)

    async def read_document(self, partition: str, document_id: str) -> Document | None:
        return await self._call("read_document", partition, document_id)

    async def write_documents(self, partition: str, operations: Sequence[WriteOp]
                              ) -> list[Document]:
        return await self._call("write_documents", partition, operations)

    async def commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp], *,
                     marker_body: dict[str, Any] | None = None,
                     written: list[Document] | None = None) -> IdempotencyRecord:
        return await self._call("commit", marker, operations, marker_body=marker_body,
                                written=written)

    async def close(self) -> None:
        await self._call("close")


class AsyncInMemoryIdempotencyStore(ThreadedStore):
    """The in-memory store behind an async face: for tests of async handlers and flows.
    Requests run inline (they never block)."""

    def __init__(self, store: InMemoryIdempotencyStore | None = None) -> None:
        super().__init__(store or InMemoryIdempotencyStore())

    @property
    def requests(self) -> int:
        return self.sync.requests

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.sync, method)(*args, **kwargs)
