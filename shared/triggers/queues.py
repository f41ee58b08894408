"""Azure Storage Queue triggers, made idempotent: the Functions queue trigger's contract.

The queue trigger has no settlement calls. What the function does with the message is
what it returns: a normal return and the host deletes the message; an exception and the
host leaves it on the queue, where it comes back after host.json `visibilityTimeout`
(default 0 s) with the same id and its dequeue count raised by one. A failure on the
delivery whose dequeue count reached `maxDequeueCount` (default 5) makes the host copy
the body to `<queue>-poison` (a new message: no reason, not the original id) and delete
the original. While a function runs, the host keeps the message invisible (10 minutes,
renewed); if the host dies first, the message comes back when that runs out. So a queue
message is delivered at least once: a crash after the effect and before the delete
repeats it, and a producer that retries a send puts a second message (another id) on
the queue.

`StorageQueueConsumer` takes one delivery through the dedup flow and applies the
library's settlement rule (`shared.core.settlement`) the only way this trigger allows:

* processed now, or a duplicate of a processed message: return (the host deletes it);
* the key reused for other content, bad input (`InvalidPayloadError`, a missing business
  key, a `parse`/`key`/`content`/`partition` that raised), a request the store refuses
  for good: write the message to the poison queue with the reason (a JSON envelope:
  reason, detail, the original body and id, the dedup key), then return, on its first
  delivery;
* a transient store or dispatch failure, another attempt holding the key, any other
  exception (`UnexpectedError`): raise `MessageRetryError` (chained to the cause), so
  the host leaves the message to come back;
* on the last delivery the host allows (`max_dequeue_count`, the host's
  `maxDequeueCount`), what would raise goes to the poison queue instead, with its
  reason (`MaxDequeueCountReached`): the host's own poison copy would carry no reason.

The dedup key is the message id (stable across the queue's redeliveries) or a business
key (`key=`): a producer's retry is a new message with a new id, so only a business key
absorbs it. A resubmission from the poison queue (`python -m replay`) carries the
original id and body (`resubmission`), so it is deduplicated as the original either way.

    consumer = StorageQueueConsumer("order-audit", Idempotency(store), poison=poison_client)

    @app.queue_trigger(arg_name="message", queue_name="order-audit", connection="AzureWebJobsStorage")
    def order_audit(message: func.QueueMessage) -> None:
        consumer.run_atomic(message, build, key=lambda order: order["orderId"])

`AsyncStorageQueueConsumer` is the same for `async def` functions on `shared.aio.Idempotency`.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from shared.core.exceptions import ConfigurationError, IdempotencyError, InvalidKeyError, PoisonMessageError
from shared.core.keys import DedupKey, request_hash
from shared.core.observability import message_span
from shared.core.payload import parse_json_object
from shared.core.records import Outcome
from shared.core.settlement import (
    Action,
    Decision,
    decision_after,
    decision_for_result,
    derived,
)
from shared.core.telemetry import EVENT_CONFLICT, Telemetry
from shared.flows.drivers import Async, AsyncTransaction, Sync, Transaction, flowmethod
from shared.flows.idempotency import AsyncIdempotency, Idempotency
from shared.flows.steps import Flow
from shared.triggers.queue_messages import (
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
    """Raised to the queue trigger so the host leaves the message to come back.

    The message is valid; what failed may succeed later (the store was unavailable,
    another attempt holds the key). `decision` says why (its `reason`: Transient,
    InProgress, ...); the cause is chained. The host redelivers after host.json
    `visibilityTimeout`, or moves the body to `<queue>-poison` after `maxDequeueCount`
    (the consumer does that itself, with the reason, on the last delivery).
    """

    def __init__(self, decision: Decision, *, message_id: str | None) -> None:
        super().__init__(f"{decision.reason}: {decision.description} (message {message_id} is "
                         "left on the queue to come back)")
        self.decision = decision
        self.reason = decision.reason






Handle = Callable[[QueueMessageView], Any]  # -> Outcome | Decision (awaitable on the async variant)
Parse = Callable[[QueueMessageView], Any]
KeyOf = Callable[[Any], str | DedupKey | None]  # None: the item has no key (refused)


@dataclass(frozen=True)
class _Identified:
    """One message's item, key and request hash (what the dedup flow is called with)."""

    item: Any
    key: DedupKey
    request_hash: str


def _business_key(name: str, key: KeyOf, item: Any) -> DedupKey:
    value = derived("key", lambda: key(item))
    if isinstance(value, DedupKey):
        return value
    return derived("key", lambda: DedupKey.from_business_key(name, value))


class BaseStorageQueueConsumer[L: (Idempotency, AsyncIdempotency)]:
    """What both variants share: identifying a message, the settlement rule, the envelope."""

    def __init__(self, name: str, idempotency: L, *,
                 poison: PoisonQueue | Callable[[], PoisonQueue],
                 telemetry: Telemetry | None = None, max_body_bytes: int = 64 * 1024,
                 max_dequeue_count: int = DEFAULT_MAX_DEQUEUE_COUNT,
                 poison_time_to_live: int = NEVER_EXPIRES) -> None:
        try:
            DedupKey(name, "-")
        except InvalidKeyError as error:
            raise ConfigurationError(f"consumer name {name!r}: {error}") from error
        if max_dequeue_count < 1:
            raise ConfigurationError(f"max_dequeue_count={max_dequeue_count} must be at least 1 (set it "
                             "to host.json extensions.queues.maxDequeueCount)")
        if poison is None:
            raise ConfigurationError("poison: give the `<queue>-poison` queue client (or a factory of "
                             "it): the queue trigger has no dead-letter call of its own")
        self.name = name
        self.idempotency = idempotency
        self.telemetry: Telemetry = telemetry or idempotency.telemetry
        self.max_body_bytes = max_body_bytes
        self.max_dequeue_count = max_dequeue_count
        self.poison_time_to_live = poison_time_to_live
        self._poison_given = poison
        self._poison: PoisonQueue | None = None
        self._poison_lock = threading.Lock()

    # -- identifying a message ------------------------------------------------------------
    def identify(self, view: QueueMessageView, *, parse: Parse | None = None,
                 key: KeyOf | None = None, content: Callable[[Any], Any] | None = None
                 ) -> _Identified:
        """Parse the body, take the key, hash the content. Whatever fails here is the
        message's: `PoisonMessageError` with the reason (`shared.core.settlement.derived`)."""
        by_id: DedupKey | None = None
        if key is None:  # checked first: a message without an id is refused as such
            try:
                by_id = DedupKey.from_message_id(self.name, view.message_id)
            except InvalidKeyError as error:
                raise PoisonMessageError("InvalidMessageId", str(error)) from error
        item = derived("parse", lambda: parse(view) if parse is not None else parse_json_object(
            view.body, max_bytes=self.max_body_bytes))
        dedup_key = _business_key(self.name, key, item) if key is not None else by_id
        assert dedup_key is not None
        payload: Any = view.body  # an item that is not JSON: its bytes
        if content is not None:
            payload = derived("content", lambda: content(item))
        elif isinstance(item, (dict, list)):
            payload = cast(Any, item)
        return _Identified(item, dedup_key, derived("content", lambda: request_hash(payload)))

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
        """The atomic path as a flow: both variants run it (sync, or awaited)."""
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
        """The two-phase path as a flow: both variants run it (sync, or awaited)."""
        found = self.identify(view, parse=parse, key=key, content=content)
        outcome: Outcome = yield from self.idempotency.run.flow(
            found.key, found.request_hash, lambda: handler(found.item),
            takeover_stale=takeover_stale, context=view.context(found.key))
        return outcome

    def _settlement_of(self, view: QueueMessageView, result: Any) -> tuple[Decision, DedupKey | None,
                                                                     Exception | None]:
        """The decision for what `handle` answered (after the last delivery's rule)."""
        return self._final(decision_for_result(result), view), _key_of(result), None

    def _failed(self, view: QueueMessageView, error: Exception
                ) -> tuple[Decision, DedupKey | None, Exception | None]:
        """The decision after `handle` raised (the last delivery poisons what would retry)."""
        decision = decision_after(error, consumer=self.name, delivery_count=view.dequeue_count,
                                  context=view.context())
        return self._final(decision, view), None, error

    # -- the settlement rule: shared.core.settlement, then the last delivery's ------------------
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

    def _refused(self, decision: Decision, view: QueueMessageView, key: DedupKey | None) -> str:
        """Alert (the conflict has its own record) and build the envelope."""
        if decision.reason != EVENT_CONFLICT:
            self.telemetry.dead_lettered(
                consumer=self.name, reason=decision.reason or "",
                context={**view.context(key), "error": (decision.description or "")[:500]})
        return poison_envelope(view, consumer=self.name, reason=decision.reason or "",
                               detail=decision.description or "", key=key)

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


def _key_of(result: Any) -> DedupKey | None:
    return result.key if isinstance(result, Outcome) else None


class StorageQueueConsumer(BaseStorageQueueConsumer[Idempotency], Sync):
    """One queue-triggered function's consumer on a sync `Idempotency`.

    Each method returns the `Decision` it applied (complete: the host deletes the message;
    deadletter: it was written to the poison queue) or raises `MessageRetryError`.
    `name` scopes the dedup keys; `poison` is the `<queue>-poison` client or a factory of it
    (called on first use); `max_dequeue_count` must be the host's `maxDequeueCount`.
    """

    def run_atomic(self, message: Any, build: Callable[[Transaction, Any], Any], *,
                   parse: Parse | None = None, key: KeyOf | None = None,
                   content: Callable[[Any], Any] | None = None,
                   partition: str | Callable[[Any], str] | None = None,
                   marker: Callable[[Any], tuple[str, dict[str, Any]]] | None = None) -> Decision:
        """Commit the marker and `build(tx, item)`'s writes in one transaction, once per key.

        `parse(view)` makes the item (default: the body as a JSON object); `key(item)` the
        business key (default: the message id); `content(item)` what is hashed to tell a
        duplicate from a reused key (default: the item); `partition` (or `partition(item)`)
        where the marker and the writes go; `marker(item)` -> (id, body) makes a business
        document its own marker, kept for good (the order's audit entry, say).
        """
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
            try:
                decision, key, cause = self._settlement_of(view, handle(view))
            except Exception as error:
                decision, key, cause = self._failed(view, error)
            if decision.action in (Action.ABANDON, Action.WAIT):
                raise self._retry(decision, view, key, cause)
            if decision.action is Action.DEADLETTER:
                self._send_poison(self._refused(decision, view, key), view, cause)
            return decision

    def _send_poison(self, envelope: str, view: QueueMessageView,
                     cause: BaseException | None) -> None:
        try:
            sent = self._poison_client().send_message(envelope,
                                                      time_to_live=self.poison_time_to_live)
        except Exception as error:
            raise self._retry(Decision.abandon(REASON_POISON_UNAVAILABLE, str(error)), view,
                              None, error) from error
        if inspect.isawaitable(sent):
            _close(sent)
            raise TypeError("an async poison queue client needs AsyncStorageQueueConsumer")


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
            try:
                result = handle(view)
                if inspect.isawaitable(result):
                    result = await cast(Any, result)
                decision, key, cause = self._settlement_of(view, result)
            except Exception as error:
                decision, key, cause = self._failed(view, error)
            if decision.action in (Action.ABANDON, Action.WAIT):
                raise self._retry(decision, view, key, cause)
            if decision.action is Action.DEADLETTER:
                await self._send_poison(self._refused(decision, view, key), view)
            return decision

    async def _send_poison(self, envelope: str, view: QueueMessageView) -> None:
        try:
            sent = self._poison_client().send_message(envelope,
                                                      time_to_live=self.poison_time_to_live)
            if inspect.isawaitable(sent):
                await sent
        except Exception as error:
            raise self._retry(Decision.abandon(REASON_POISON_UNAVAILABLE, str(error)), view,
                              None, error) from error


def _close(value: object) -> None:
    close = getattr(value, "close", None)
    if callable(close):
        close()  # a coroutine never awaited: no "was never awaited" warning




__all__ = ["DEFAULT_MAX_DEQUEUE_COUNT", "AsyncStorageQueueConsumer", "MessageRetryError",
           "StorageQueueConsumer"]
