"""The two drivers of the step protocol (`shared._flows.steps`), and the variants they give a class.

`run_sync` performs each step a flow yields on a sync store; `await run_async` on an async one.
A class of `@flowmethod`s mixed with `Sync` or `Async` gets both variants from one definition.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Concatenate, Protocol, Self, overload

from shared._core.exceptions import RecordChangedError, StoreUnavailableError
from shared._core.keys import DedupKey
from shared._core.records import IdempotencyRecord
from shared._core.store import Document, ReadDocument, StoreStep
from shared._flows import steps
from shared._flows.steps import (
    BuildResult,
    Dispatch,
    Flow,
    Gather,
    HandlerResult,
    OnStore,
    Reads,
    RunBuild,
    RunHandler,
    Sleep,
    Step,
    Writes,
)

logger = logging.getLogger(__name__)


# -- the stores the drivers talk to --------------------------------------------------------
class SyncStore(Protocol):
    """A store `run_sync` performs steps on (`shared._core.store.IdempotencyStore`)."""

    @property
    def name(self) -> str: ...

    def perform(self, step: StoreStep) -> Any: ...
    # Tells the variants apart for a type checker (a coroutine answers `perform` too).
    def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None: ...


class AsyncStore(Protocol):
    """A store `run_async` awaits steps on (`shared._core.store.AsyncIdempotencyStore`)."""

    @property
    def name(self) -> str: ...

    async def perform(self, step: StoreStep) -> Any: ...
    async def get_record(self, partition: str, record_id: str) -> IdempotencyRecord | None: ...


# -- the drivers -----------------------------------------------------------------------------
def run_sync[T](flow: Flow[T], store: Any, *, sleep: Callable[[float], object] = time.sleep) -> T:
    """Run `flow` to its value on a sync store: each step performed, its error thrown in."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = flow.send(answer) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value
        try:
            answer, error = _perform_sync(step, store, sleep), None
        except BaseException as failure:  # handed to the flow, which may re-raise
            answer, error = None, failure


def _perform_sync(step: Step, store: SyncStore, sleep: Callable[[float], object]) -> Any:
    if isinstance(step, StoreStep):
        return store.perform(step)
    match step:
        case RunBuild(build, partition, args, reads, key, correlation_id):
            _commits(store)
            tx = Transaction(store, partition, reads, key=key, correlation_id=correlation_id)
            return BuildResult(_not_awaitable(build(tx, *args), "build"), tx)
        case RunHandler():
            return _run_renewing(step, store)
        case Sleep(seconds):
            sleep(seconds)
            return None
        case Gather(flows, limit):
            def run(flow: Flow[Any]) -> Any:
                return run_sync(flow, store, sleep=sleep)
            if min(limit, len(flows)) <= 1:
                return _in_order([_outcome(run, flow) for flow in flows])
            with ThreadPoolExecutor(max_workers=min(limit, len(flows)),
                                    thread_name_prefix="flow") as pool:
                futures = [pool.submit(contextvars.copy_context().run, _outcome, run, flow)
                           for flow in flows]
                return _in_order([future.result() for future in futures])
        case OnStore(other, flow):
            return run_sync(flow, other, sleep=sleep)
        case Dispatch(dispatcher, messages):
            _not_awaitable(dispatcher.dispatch(messages), "dispatcher")
            return None
        case _:
            raise TypeError(f"not a step: {step!r}")


async def run_async[T](flow: Flow[T], store: Any, *,
                       sleep: Callable[[float], object] = asyncio.sleep) -> T:
    """Run `flow` to its value on an async store: each step awaited, its error thrown in
    (`sleep` may be sync or async)."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = flow.send(answer) if error is None else flow.throw(error)
        except StopIteration as stop:
            return stop.value
        try:
            answer, error = await _perform_async(step, store, sleep), None
        except BaseException as failure:  # handed to the flow, which may re-raise
            answer, error = None, failure


async def _perform_async(step: Step, store: AsyncStore, sleep: Callable[[float], object]) -> Any:
    if isinstance(step, StoreStep):
        return await store.perform(step)
    match step:
        case RunBuild(build, partition, args, reads, key, correlation_id):
            _commits(store)
            tx = AsyncTransaction(store, partition, reads, key=key, correlation_id=correlation_id)
            value = build(tx, *args)
            return BuildResult(await value if inspect.isawaitable(value) else value, tx)
        case RunHandler():
            return await _run_renewing_async(step, store)
        case Sleep(seconds):
            slept = sleep(seconds)
            if inspect.isawaitable(slept):
                await slept
            return None
        case Gather(flows, limit):
            bound = asyncio.Semaphore(limit)

            async def run(flow: Flow[Any]) -> Any:
                async with bound:
                    try:
                        return await run_async(flow, store, sleep=sleep)
                    except BaseException as error:
                        return _Raised(error)

            return _in_order(list(await asyncio.gather(*(run(flow) for flow in flows))))
        case OnStore(other, flow):
            return await run_async(flow, other, sleep=sleep)
        case Dispatch(dispatcher, messages):
            sent = dispatcher.dispatch(messages)
            if inspect.isawaitable(sent):
                await sent
            return None
        case _:
            raise TypeError(f"not a step: {step!r}")


def _outcome(run: Callable[[Flow[Any]], Any], flow: Flow[Any]) -> Any:
    """A gathered flow's value, or the error it raised as a value (the others finish)."""
    try:
        return run(flow)
    except BaseException as error:
        return _Raised(error)


@dataclass(frozen=True, slots=True)
class _Raised:
    error: BaseException


def _in_order(results: list[Any]) -> list[Any]:
    """Gather's answer: the values, or the first error in order once all have finished."""
    for result in results:
        if isinstance(result, _Raised):
            raise result.error
    return results


def _commits(store: object) -> None:
    """Refuse a build (always followed by its commit) on a store that holds no documents."""
    if not hasattr(store, "commit"):
        raise TypeError(f"the atomic path needs a DocumentStore; {type(store).__name__} is not one")


def _not_awaitable[V](value: V, what: str) -> V:
    """`value`; TypeError when it is awaitable (closed first: no "never awaited" warning)."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError(f"an async {what} needs the async variant (shared.aio)")
    return value


def _run_renewing(step: RunHandler, store: SyncStore) -> HandlerResult:
    """Run the handler while a thread renews its lease. A lost renewal stops renewing (the
    completion then reports LEASE_LOST); a store outage is retried at the next tick."""
    lock = threading.Lock()
    done = threading.Event()
    held = step.held

    def renew() -> None:
        nonlocal held
        while not done.wait(step.every) and step.clock() < step.until:
            with lock:
                if done.is_set():
                    return
                try:
                    held = run_sync(step.renew(held), store)
                except RecordChangedError:
                    _lease_lost(held)
                    return
                except StoreUnavailableError as error:
                    logger.warning("could not renew lease: %s", error)

    def stop() -> IdempotencyRecord:
        done.set()
        thread.join()
        with lock:
            return held

    thread = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    thread.start()
    try:
        result = step.handler()
    except BaseException as error:  # the flow decides: release or keep
        return HandlerResult(stop(), error=error)
    return HandlerResult(stop(), result)


async def _run_renewing_async(step: RunHandler, store: AsyncStore) -> HandlerResult:
    """`_run_renewing` for an async handler: a task renews, not a thread."""
    done = asyncio.Event()
    held = step.held

    async def renew() -> None:
        nonlocal held
        while step.clock() < step.until:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), step.every)
            if done.is_set():
                return
            try:
                held = await run_async(step.renew(held), store)
            except RecordChangedError:
                _lease_lost(held)
                return
            except StoreUnavailableError as error:
                logger.warning("could not renew lease: %s", error)

    async def stop() -> IdempotencyRecord:
        done.set()
        await task  # a renewal in flight lands first
        return held

    task = asyncio.get_running_loop().create_task(renew())
    try:
        result = step.handler()
        if inspect.isawaitable(result):
            result = await result
    except BaseException as error:  # the flow decides: release or keep
        return HandlerResult(await stop(), error=error)
    return HandlerResult(await stop(), result)


def _lease_lost(held: IdempotencyRecord) -> None:
    logger.warning("lease lost while the handler ran",
                   extra={"dedup_key": held.key.key, "consumer": held.key.consumer})


# -- variants: one flow definition, a sync and an async way to call it ---------------------------
class Sync:
    """Mixed into a class of `@flowmethod`s: calling one runs its flow with `run_sync` on
    `self.store`, sleeping with `self.sleep`."""

    store: Any
    sleep: Callable[[float], object] = staticmethod(time.sleep)


class Async:
    """Mixed into a class of `@flowmethod`s: calling one returns a coroutine that runs its
    flow with `run_async` on `self.store`."""

    store: Any
    sleep: Callable[[float], object] = staticmethod(asyncio.sleep)


class BoundFlow[**P, T]:
    """A flow method bound to its object: `.flow(...)` is the flow (to compose it in another)."""

    __slots__ = ("_fn", "_owner")

    def __init__(self, fn: Callable[Concatenate[Any, P], Flow[T]], owner: Any) -> None:
        self._fn = fn
        self._owner = owner

    def flow(self, *args: P.args, **kwargs: P.kwargs) -> Flow[T]:
        return self._fn(self._owner, *args, **kwargs)


class SyncMethod[**P, T](BoundFlow[P, T]):
    """A flow method of a `Sync` object: calling it runs the flow."""

    __slots__ = ()
    _owner: Sync

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        owner = self._owner
        return run_sync(self._fn(owner, *args, **kwargs), owner.store, sleep=owner.sleep)


class AsyncMethod[**P, T](BoundFlow[P, T]):
    """A flow method of an `Async` object: calling it returns a coroutine."""

    __slots__ = ()
    _owner: Async

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, T]:
        owner = self._owner
        return run_async(self._fn(owner, *args, **kwargs), owner.store, sleep=owner.sleep)


class flowmethod[**P, T]:
    """Marks a method that returns a flow: on a `Sync` object calling it runs the flow, on an
    `Async` one it returns a coroutine that does."""

    def __init__(self, fn: Callable[Concatenate[Any, P], Flow[T]]) -> None:
        self._fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    @overload
    def __get__(self, owner: None, kind: type | None = None) -> Self: ...
    @overload
    def __get__(self, owner: Sync, kind: type | None = None) -> SyncMethod[P, T]: ...
    @overload
    def __get__(self, owner: Async, kind: type | None = None) -> AsyncMethod[P, T]: ...
    @overload
    def __get__(self, owner: object, kind: type | None = None) -> BoundFlow[P, T]: ...
    def __get__(self, owner: object, kind: type | None = None
                ) -> Self | BoundFlow[P, T]:
        if owner is None:
            return self
        if isinstance(owner, Async):
            return AsyncMethod(self._fn, owner)
        if isinstance(owner, Sync):
            return SyncMethod(self._fn, owner)
        return BoundFlow(self._fn, owner)


# -- the transaction a build fills --------------------------------------------------------------
class BaseTransaction(Writes):
    """What a build receives: the commit's `Writes` (in the marker's transaction) and `read`."""

    def __init__(self, store: Any, partition: str, reads: Reads | None = None, *,
                 key: DedupKey | None = None, correlation_id: str | None = None) -> None:
        super().__init__(partition, key=key, correlation_id=correlation_id)
        self.store = store
        self._reads = reads

    @flowmethod
    def read(self, document_id: str) -> Flow[Document | None]:
        """The current document or None, from what this commit already read when it can be
        (the commit's etag condition checks it)."""
        if self._reads is not None:
            hit, document = self._reads.known(document_id)
            if hit:
                return document
        document: Document | None = yield ReadDocument(self.partition, document_id)
        if self._reads is not None:
            self._reads.remember(document_id, document)
        return document


class Transaction(BaseTransaction, Sync):
    """What a sync build receives: `read` a document, add writes to the commit."""


class AsyncTransaction(BaseTransaction, Async):
    """What an async build receives (`shared.aio.Transaction`): `await tx.read(...)`."""


def update_document(store: Any, partition: str, document_id: str,
                    change: Callable[[Document | None], dict[str, Any] | None], *,
                    attempts: int = 10) -> tuple[Document | None, Document | None]:
    """`shared._flows.steps.update_document` run on a sync store: the naturally idempotent path,
    no dedup record. Returns (the written document or None, the document `change` last saw)."""
    return run_sync(steps.update_document(partition, document_id, change, attempts=attempts), store)


async def update_document_async(store: Any, partition: str, document_id: str,
                                change: Callable[[Document | None], dict[str, Any] | None], *,
                                attempts: int = 10) -> tuple[Document | None, Document | None]:
    """`update_document` on an async store (`shared.aio.update_document`)."""
    return await run_async(steps.update_document(partition, document_id, change,
                                                 attempts=attempts), store)


__all__ = [
    "Async", "AsyncStore", "AsyncTransaction", "BaseTransaction", "Sync", "SyncStore",
    "Transaction", "flowmethod", "run_async", "run_sync", "update_document", "update_document_async",
]
