"""Azure Storage Queue triggers, made idempotent (docs/storage-queues.md).

The queue trigger has no settlement calls: a return deletes the message, an exception leaves it
to come back (same id, dequeue count + 1), and after `maxDequeueCount` failures the host copies
it to `<queue>-poison` without a reason. So `StorageQueueConsumer` returns for a processed
message or a duplicate; writes a refused one (reused key, bad input, a request the store refuses
for good) to the poison queue itself, as a JSON envelope with its reason, then returns; and
raises `MessageRetryError` for what may succeed later, except on the last delivery
(`max_dequeue_count`), where that too goes to the poison queue with its reason. The dedup key is
the message id or a business key (`key=`); only a business key absorbs a producer's retry.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any, cast

from shared._core.exceptions import ConfigurationError, IdempotencyError
from shared._core.keys import DedupKey, Identified, consumer_name, message_id_key, request_hash
from shared._core.observability import message_span
from shared._core.payload import parse_json_object
from shared._core.records import Outcome
from shared._core.settlement import (
    Action,
    Decision,
    decision_after,
    decision_for_result,
    derived,
    report_dead_letter,
)
from shared._core.telemetry import Telemetry
from shared._flows.drivers import Async, AsyncTransaction, Sync, Transaction, flowmethod
from shared._flows.idempotency import AsyncIdempotency, Idempotency
from shared._flows.steps import Flow
from shared._triggers.queue_messages import (
    NEVER_EXPIRES,
    REASON_LAST_DELIVERY,
    REASON_POISON_UNAVAILABLE,
    PoisonQueue,
    QueueMessageView,
    poison_envelope,
)

logger = logging.getLogger(__name__)

#: The host's `maxDequeueCount` default (host.json `extensions.queues`).
DEFAULT_MAX_DEQUEUE_COUNT = 5


class MessageRetryError(IdempotencyError):
    """Raised to the queue trigger so the host leaves the message to come back after
    `visibilityTimeout`: what failed may succeed later. `decision` (and `reason`) says why;
    the cause is chained."""

    def __init__(self, decision: Decision, *, message_id: str | None) -> None:
        super().__init__(f"{decision.reason}: {decision.description} (message {message_id} is "
                         "left on the queue to come back)")
        self.decision = decision
        self.reason = decision.reason


Handle = Callable[[QueueMessageView], Any]  # -> Outcome | Decision (awaitable on the async variant)
Parse = Callable[[QueueMessageView], Any]
KeyOf = Callable[[Any], str | DedupKey | None]  # None: the item has no key (refused)


def _business_key(name: str, key: KeyOf, item: Any) -> DedupKey:
    value = derived("key", lambda: key(item))
    if isinstance(value, DedupKey):
        return value
    return derived("key", lambda: DedupKey.from_business_key(name, value))


class BaseStorageQueueConsumer[L: (Idempotency, AsyncIdempotency)]:
    """What both variants share. `name` scopes the dedup keys; `poison` is the `<queue>-poison`
    client or a factory of it (called on first use); `max_dequeue_count` must be the host's
    `maxDequeueCount`."""

    def __init__(self, name: str, idempotency: L, *,
                 poison: PoisonQueue | Callable[[], PoisonQueue],
                 telemetry: Telemetry | None = None, max_body_bytes: int = 64 * 1024,
                 max_dequeue_count: int = DEFAULT_MAX_DEQUEUE_COUNT,
                 poison_time_to_live: int = NEVER_EXPIRES) -> None:
        if max_dequeue_count < 1:
            raise ConfigurationError(f"max_dequeue_count={max_dequeue_count} must be at least 1 (set it "
                             "to host.json extensions.queues.maxDequeueCount)")
        if poison is None:
            raise ConfigurationError("poison: give the `<queue>-poison` queue client (or a factory of "
                             "it): the queue trigger has no dead-letter call of its own")
        self.name = consumer_name(name)
        self.idempotency = idempotency
        self.telemetry: Telemetry = telemetry or idempotency.telemetry
        self.max_body_bytes = max_body_bytes
        self.max_dequeue_count = max_dequeue_count
        self.poison_time_to_live = poison_time_to_live
        self._poison_given = poison
        self._poison: PoisonQueue | None = None
        self._poison_lock = threading.Lock()

    def identify(self, view: QueueMessageView, *, parse: Parse | None = None,
                 key: KeyOf | None = None, content: Callable[[Any], Any] | None = None
                 ) -> Identified[Any]:
        """Parse the body, take the key, hash the content; `PoisonMessageError` with the
        reason for whatever fails here."""
        # The id is checked first: a message without one is refused as such.
        by_id = message_id_key(self.name, view.message_id) if key is None else None
        item = derived("parse", lambda: parse(view) if parse is not None else parse_json_object(
            view.body, max_bytes=self.max_body_bytes))
        dedup_key = _business_key(self.name, key, item) if key is not None else by_id
        assert dedup_key is not None
        payload: Any = view.body  # an item that is not JSON is hashed as its bytes
        if content is not None:
            payload = derived("content", lambda: content(item))
        elif isinstance(item, (dict, list)):
            payload = cast(Any, item)
        return Identified[Any](item, dedup_key, derived("content", lambda: request_hash(payload)))

    @staticmethod
    def _partition(partition: str | Callable[[Any], str] | None, item: Any) -> str | None:
        return derived("partition", lambda: partition(item)) if callable(partition) else partition

    @property
    def store(self) -> Any:
        """Where the consumer's flows run: its Idempotency's store."""
        return self.idempotency.store

    @flowmethod
    def _atomic(self, view: QueueMessageView, build: Callable[[Any, Any], Any],
                parse: Parse | None, key: KeyOf | None, content: Callable[[Any], Any] | None,
                partition: str | Callable[[Any], str] | None,
                marker: Callable[[Any], tuple[str, dict[str, Any]]] | None) -> Flow[Outcome]:
        found = self.identify(view, parse=parse, key=key, content=content)
        marker_id, marker_body = (derived("marker", lambda: marker(found.item))
                                  if marker is not None else (None, None))

        def built(tx: Any) -> Any:
            return build(tx, found.item)

        outcome: Outcome = yield from self.idempotency.run_atomic.flow(
            found.key, found.request_hash, built,
            partition=self._partition(partition, found.item), marker_id=marker_id,
            marker_body=marker_body, expires=marker is None, context=view.context(found.key),
            read_first=view.dequeue_count > 1 or view.replayed)
        return outcome

    @flowmethod
    def _two_phase(self, view: QueueMessageView, handler: Callable[[Any], Any],
                   parse: Parse | None, key: KeyOf | None, content: Callable[[Any], Any] | None,
                   takeover_stale: bool) -> Flow[Outcome]:
        found = self.identify(view, parse=parse, key=key, content=content)
        outcome: Outcome = yield from self.idempotency.run.flow(
            found.key, found.request_hash, lambda: handler(found.item),
            takeover_stale=takeover_stale, context=view.context(found.key))
        return outcome

    def _decided(self, view: QueueMessageView, result: Any = None, error: Exception | None = None
                 ) -> tuple[Decision, DedupKey | None]:
        """The decision for what `handle` answered (or raised), after the last delivery's rule."""
        if error is not None:
            decision = decision_after(error, consumer=self.name, delivery_count=view.dequeue_count,
                                      context=view.context())
            return self._final(decision, view), None
        key = result.key if isinstance(result, Outcome) else None
        return self._final(decision_for_result(result), view), key

    def last_delivery(self, view: QueueMessageView) -> bool:
        """Whether a failure now makes the host move the message to the poison queue."""
        return view.dequeue_count >= self.max_dequeue_count

    def _final(self, decision: Decision, view: QueueMessageView) -> Decision:
        """A retry on the last delivery becomes a poison message with the reason."""
        if decision.action in (Action.ABANDON, Action.WAIT) and self.last_delivery(view):
            return Decision.deadletter(
                REASON_LAST_DELIVERY, f"{decision.reason}: {decision.description} (dequeue "
                f"count {view.dequeue_count} of {self.max_dequeue_count})", decision.outcome)
        return decision

    def _retry(self, decision: Decision, view: QueueMessageView, key: DedupKey | None,
               cause: BaseException | None) -> MessageRetryError:
        logger.warning("%s: %s, message left to come back: %s", self.name, decision.reason,
                       decision.description, extra=view.context(key))
        error = MessageRetryError(decision, message_id=view.message_id)
        error.__cause__ = cause
        return error

    def _apply(self, decision: Decision, view: QueueMessageView, key: DedupKey | None,
               cause: Exception | None) -> Any:
        """Raise `MessageRetryError` for a retry; for a refusal, alert and write the envelope to
        the poison queue (what `send_message` answers is returned: awaitable from an async
        client)."""
        if decision.action in (Action.ABANDON, Action.WAIT):
            raise self._retry(decision, view, key, cause)
        if decision.action is not Action.DEADLETTER:
            return None
        report_dead_letter(self.telemetry, self.name, decision, view.context(key))
        envelope = poison_envelope(view, consumer=self.name, reason=decision.reason or "",
                                   detail=decision.description or "", key=key)
        try:
            return self._poison_client().send_message(envelope, time_to_live=self.poison_time_to_live)
        except Exception as error:
            raise self._poison_unavailable(view, error) from error

    def _poison_unavailable(self, view: QueueMessageView, error: Exception) -> MessageRetryError:
        return self._retry(Decision.abandon(REASON_POISON_UNAVAILABLE, str(error)), view, None, error)

    def _poison_client(self) -> PoisonQueue:
        with self._poison_lock:
            if self._poison is None:
                given = self._poison_given
                self._poison = (cast(Callable[[], PoisonQueue], given)() if not hasattr(
                    given, "send_message") else cast(PoisonQueue, given))
            return self._poison

    @contextmanager
    def _span(self, view: QueueMessageView) -> Generator[None]:
        with message_span(self.name, message_id=view.message_id,
                          attributes={"messaging.system": "azure_storage_queue",
                                      "messaging.delivery_count": view.dequeue_count}):
            yield


class StorageQueueConsumer(BaseStorageQueueConsumer[Idempotency], Sync):
    """One queue-triggered function's consumer on a sync `Idempotency`. Each method returns
    the `Decision` it applied (complete: the host deletes the message; deadletter: it was
    written to the poison queue) or raises `MessageRetryError`."""

    def run_atomic(self, message: Any, build: Callable[[Transaction, Any], Any], *,
                   parse: Parse | None = None, key: KeyOf | None = None,
                   content: Callable[[Any], Any] | None = None,
                   partition: str | Callable[[Any], str] | None = None,
                   marker: Callable[[Any], tuple[str, dict[str, Any]]] | None = None) -> Decision:
        """Commit the marker and `build(tx, item)`'s writes in one transaction, once per key.

        `parse(view)` makes the item (default: the body as a JSON object); `key(item)` the
        business key (default: the message id); `content(item)` what is hashed to tell a
        duplicate from a reused key (default: the item); `partition` (or `partition(item)`)
        where the writes go; `marker(item)` -> (id, body) makes a business document its own
        marker, kept for good."""
        return self.process(message, lambda view: self._atomic(
            view, build, parse, key, content, partition, marker))

    def run(self, message: Any, handler: Callable[[Any], Any], *, parse: Parse | None = None,
            key: KeyOf | None = None, content: Callable[[Any], Any] | None = None,
            takeover_stale: bool = True) -> Decision:
        """Two phases, for an effect that cannot join a transaction: claim the key, run
        `handler(item)` once, record its result. A claim left by a crashed attempt is taken
        over once its lease runs out (`takeover_stale=False`: poisoned as StaleInProgress)."""
        return self.process(message, lambda view: self._two_phase(
            view, handler, parse, key, content, takeover_stale))

    def process(self, message: Any, handle: Handle) -> Decision:
        """Low level: `handle(view)` returns an Outcome or a Decision; the rule settles it."""
        view = QueueMessageView.of(message)
        with self._span(view):
            cause: Exception | None = None
            try:
                decision, key = self._decided(view, handle(view))
            except Exception as error:
                cause = error
                decision, key = self._decided(view, error=error)
            sent = self._apply(decision, view, key, cause)
            if inspect.isawaitable(sent):
                close = getattr(sent, "close", None)
                if callable(close):
                    close()  # a coroutine never awaited: no "was never awaited" warning
                raise TypeError("an async poison queue client needs AsyncStorageQueueConsumer")
            return decision


class AsyncStorageQueueConsumer(BaseStorageQueueConsumer[AsyncIdempotency], Async):
    """`StorageQueueConsumer` for `async def` functions (`shared.aio.StorageQueueConsumer`):
    the same methods, awaited, on `shared.aio.Idempotency`; builds and handlers may be async,
    the poison client sync or async (`azure.storage.queue.aio.QueueClient`)."""

    async def run_atomic(self, message: Any, build: Callable[[AsyncTransaction, Any], Any], *,
                         parse: Parse | None = None, key: KeyOf | None = None,
                         content: Callable[[Any], Any] | None = None,
                         partition: str | Callable[[Any], str] | None = None,
                         marker: Callable[[Any], tuple[str, dict[str, Any]]] | None = None
                         ) -> Decision:
        """`StorageQueueConsumer.run_atomic`, awaited (`build` may be async)."""
        return await self.process(message, lambda view: self._atomic(
            view, build, parse, key, content, partition, marker))

    async def run(self, message: Any, handler: Callable[[Any], Any], *,
                  parse: Parse | None = None, key: KeyOf | None = None,
                  content: Callable[[Any], Any] | None = None,
                  takeover_stale: bool = True) -> Decision:
        """`StorageQueueConsumer.run`, awaited (`handler` may be async)."""
        return await self.process(message, lambda view: self._two_phase(
            view, handler, parse, key, content, takeover_stale))

    async def process(self, message: Any, handle: Handle) -> Decision:
        """`StorageQueueConsumer.process`, awaited (`handle` may be async)."""
        view = QueueMessageView.of(message)
        with self._span(view):
            cause: Exception | None = None
            try:
                result = handle(view)
                if inspect.isawaitable(result):
                    result = await cast(Any, result)
                decision, key = self._decided(view, result)
            except Exception as error:
                cause = error
                decision, key = self._decided(view, error=error)
            sent = self._apply(decision, view, key, cause)
            if inspect.isawaitable(sent):
                try:
                    await sent
                except Exception as error:
                    raise self._poison_unavailable(view, error) from error
            return decision


__all__ = ["DEFAULT_MAX_DEQUEUE_COUNT", "AsyncStorageQueueConsumer", "MessageRetryError",
           "StorageQueueConsumer"]
