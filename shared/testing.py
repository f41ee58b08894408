"""Test doubles for your own consumers: every one a stand-in for something the host or an SDK
gives a function, so a consumer's test runs in process, fast, with no server (docs/testing.md).

    from shared import Idempotency, MessageView, ServiceBusConsumer
    from shared.testing import InMemoryDispatcher, InMemoryIdempotencyStore, RecordingMessageActions

    outbox = InMemoryDispatcher()
    orders = ServiceBusConsumer("orders", Idempotency(InMemoryIdempotencyStore(), dispatcher=outbox))
    actions = RecordingMessageActions()
    message = MessageView(message_id="o-1", body=b'{"orderId": "o-1"}')
    orders.run_atomic(message, actions, save)
    orders.run_atomic(message, actions, save)  # the broker's redelivery: absorbed
    assert actions.actions() == ["complete", "complete"] and len(outbox.sent) == 1

The async doubles (`AsyncInMemoryIdempotencyStore`, `AsyncInMemoryDispatcher`) are the same
records, awaited; `FlakyStore` is the in-memory store in an outage you switch on and off;
`ThreadedStore` puts any sync store behind the async interface.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shared._backends.memory import InMemoryIdempotencyStore
from shared._core.exceptions import StoreUnavailableError
from shared._core.outbox import OutgoingMessage
from shared._core.store import AsyncIdempotencyStore, StoreStep

__all__ = ["AsyncInMemoryDispatcher", "AsyncInMemoryIdempotencyStore", "FlakyStore",
           "InMemoryDispatcher", "InMemoryIdempotencyStore", "RecordingMessageActions",
           "Settlement", "ThreadedStore"]


class InMemoryDispatcher:
    """Records every message it sends (`sent`), in order."""

    def __init__(self) -> None:
        self.sent: list[OutgoingMessage] = []
        self._lock = threading.Lock()

    def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        with self._lock:
            self.sent.extend(messages)

    def close(self) -> None:
        pass

    def ids(self) -> list[str]:
        return [m.message_id for m in self.sent]


class AsyncInMemoryDispatcher:
    """`InMemoryDispatcher`, awaited (the same record of what was sent)."""

    def __init__(self) -> None:
        self._sync = InMemoryDispatcher()

    @property
    def sent(self) -> list[OutgoingMessage]:
        return self._sync.sent

    def ids(self) -> list[str]:
        return self._sync.ids()

    async def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        await asyncio.sleep(0)  # a real send yields to the loop
        self._sync.dispatch(messages)

    async def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Settlement:
    """One settlement call a consumer made (a dead-letter's with its reason and description)."""

    action: str  # "complete", "abandon" or "deadletter"
    message_id: str | None
    reason: str | None = None
    description: str | None = None


class RecordingMessageActions:
    """Stands in for the `message_actions` the Service Bus trigger hands a function
    (`azurefunctions.extensions.bindings.servicebus.ServiceBusMessageActions`): records each
    settlement (`settled`) instead of sending it to the host."""

    def __init__(self) -> None:
        self.settled: list[Settlement] = []

    def complete(self, message: Any) -> None:
        self.settled.append(Settlement("complete", _message_id(message)))

    def abandon(self, message: Any) -> None:
        self.settled.append(Settlement("abandon", _message_id(message)))

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self.settled.append(Settlement("deadletter", _message_id(message), deadletter_reason,
                                       deadletter_error_description))

    def actions(self) -> list[str]:
        """The actions, in order (a message left unsettled adds none: its lock runs out)."""
        return [settlement.action for settlement in self.settled]


def _message_id(message: Any) -> str | None:
    message_id = getattr(message, "message_id", None)
    return None if message_id is None else str(message_id)


class FlakyStore(InMemoryIdempotencyStore):
    """The in-memory store, answering every request a consumer makes with StoreUnavailableError
    (503) while `down` is set; `failed` counts them. Only `perform`, the consumers' one call
    into a store, fails: a test still reads what was written (`read_document`). Behind the async
    variant, put it in a `ThreadedStore`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed = 0

    def perform(self, step: StoreStep) -> Any:
        if self.down:
            self.failed += 1
            raise StoreUnavailableError(f"store outage ({type(step).__name__} refused: 503)",
                                        status_code=503)
        return super().perform(step)


#: Threads for sync stores' requests behind the async interface: each request holds one while it
#: waits on the network, so a slow store must not exhaust them (the loop's default executor has
#: only cores + 4); shared by every ThreadedStore of the process.
THREADED_STORE_THREADS = 64
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADED_STORE_THREADS, thread_name_prefix="threaded-store")
        return _pool


class ThreadedStore(AsyncIdempotencyStore):
    """A sync store (a test double, a fault-injecting wrapper) behind the async interface, each
    request on a worker thread so the event loop stays free."""

    def __init__(self, store: Any) -> None:
        self.sync = store
        self.name = str(store.name)

    async def _call[T](self, request: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        context = contextvars.copy_context()  # as asyncio.to_thread: the caller's context goes along
        return await asyncio.get_running_loop().run_in_executor(
            _threads(), functools.partial(context.run, request, *args, **kwargs))

    async def perform(self, step: StoreStep) -> Any:
        return await self._call(self.sync.perform, step)

    async def close(self) -> None:
        await self._call(self.sync.close)


class AsyncInMemoryIdempotencyStore(ThreadedStore):
    """The in-memory store behind the async interface; requests run inline (they never block),
    `sync` is the in-memory store itself."""

    def __init__(self, store: InMemoryIdempotencyStore | None = None) -> None:
        super().__init__(store or InMemoryIdempotencyStore())

    async def _call[T](self, request: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return request(*args, **kwargs)
