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
library's settlement rule (`shared.settlement`) the only way this trigger allows:

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

import base64
import dataclasses
import datetime
import hashlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, cast

from shared.drivers import (
    Async,
    Sync,
    flowmethod,
)
from shared.exceptions import ConfigurationError, IdempotencyError, InvalidKeyError, PoisonMessageError
from shared.flow import Flow
from shared.idempotency import AsyncIdempotency, Idempotency
from shared.keys import DedupKey, request_hash
from shared.observability import message_span
from shared.payload import parse_json_object
from shared.records import Outcome
from shared.settlement import (
    MAX_DESCRIPTION_CHARS,
    Action,
    Decision,
    decision_after,
    decision_for_result,
    derived,
)
from shared.telemetry import EVENT_CONFLICT, Telemetry

logger = logging.getLogger(__name__)

#: The host's `maxDequeueCount` default (host.json `extensions.queues`).
DEFAULT_MAX_DEQUEUE_COUNT = 5
#: A queue message holds at most 64 KiB; with the trigger's base64 encoding that is 48 KiB of
#: text. The envelope stays within it whichever encoding the poison client uses.
MAX_POISON_TEXT_BYTES = 48 * 1024
#: Poison envelopes never expire (`time_to_live=-1`): a person decides what becomes of them.
NEVER_EXPIRES = -1
REASON_LAST_DELIVERY = "MaxDequeueCountReached"
REASON_POISON_UNAVAILABLE = "PoisonQueueUnavailable"


class PoisonQueue(Protocol):
    """What the consumer needs of the poison queue: `azure.storage.queue.QueueClient` (or its
    `aio` twin, for the async consumer). Build it with the trigger's message encoding (the
    default `base64`: `message_encode_policy=TextBase64EncodePolicy()`), so the envelopes
    read like the host's own poison messages."""

    def send_message(self, content: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class QueueMessageView:
    """A Storage Queue message as the consumer sees it (what the trigger's metadata carries).

    `message_id` and `dequeue_count` come from the queue: the id is the same on every
    redelivery, the count rises by one with each. `pop_receipt` changes with each delivery.
    """

    message_id: str | None
    body: bytes
    dequeue_count: int = 1
    insertion_time: datetime.datetime | None = None
    expiration_time: datetime.datetime | None = None
    next_visible_time: datetime.datetime | None = None
    pop_receipt: str | None = None
    replayed: bool = False  # a resubmission from the poison queue, as the original

    @classmethod
    def of(cls, message: Any) -> QueueMessageView:
        """From `azure.functions.QueueMessage` (the trigger's binding), an
        `azure.storage.queue.QueueMessage` (a consumer of its own), or a view. A
        resubmission from the poison queue (`resubmission`) reads as the original: its
        id and body."""
        if isinstance(message, QueueMessageView):
            return message
        return _unwrapped(cls._read(message))

    @classmethod
    def _read(cls, message: Any) -> QueueMessageView:
        if hasattr(message, "get_body"):  # azure.functions.QueueMessage
            return cls(
                message_id=_text_or_none(message.id), body=_bytes(message.get_body()),
                dequeue_count=_count(message.dequeue_count),
                insertion_time=message.insertion_time, expiration_time=message.expiration_time,
                next_visible_time=message.time_next_visible,
                pop_receipt=_text_or_none(message.pop_receipt))
        if hasattr(message, "content"):  # azure.storage.queue.QueueMessage
            return cls(
                message_id=_text_or_none(message.id), body=_bytes(message.content),
                dequeue_count=_count(message.dequeue_count), insertion_time=message.inserted_on,
                expiration_time=message.expires_on, next_visible_time=message.next_visible_on,
                pop_receipt=_text_or_none(message.pop_receipt))
        raise TypeError(f"not a queue message: {type(message).__name__}")

    def context(self, key: DedupKey | None = None) -> dict[str, Any]:
        """What the logs and metrics say about this delivery (`delivery_count` tells a
        redelivery from a producer's retry in the duplicate metric)."""
        return {"message_id": self.message_id, "delivery_count": self.dequeue_count,
                **({"dedup_key": key.key} if key is not None else {}),
                **({"replayed": True} if self.replayed else {})}


#: The first member of a message that brings a poison envelope back to its queue.
REPLAY_FIELD = "replayOf"
_REPLAY_PREFIX = b'{"' + REPLAY_FIELD.encode() + b'":'
MAX_RESUBMISSION_BYTES = 2 * MAX_POISON_TEXT_BYTES  # bounds the decoder reading one


def resubmission(envelope: Mapping[str, Any], *, by: str,
                 now: datetime.datetime | None = None) -> str:
    """The message that brings a poison envelope back to the consumer's queue: the original
    id and body under `replayOf`, so that the consumer reads it as the original
    (`QueueMessageView.of`) and its dedup absorbs it if the original had committed (a
    consumer keyed by the message id included). ValueError, naming what is missing, when the
    envelope cannot bring the original back (a body cut to fit, no id)."""
    if envelope.get("bodyTruncated"):
        raise ValueError(f"the body was cut to fit the poison queue ({envelope.get('bodyBytes')} "
                         f"bytes, sha256 {envelope.get('bodySha256')}): re-send the original "
                         "from its source")
    message_id = envelope.get("messageId")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("the envelope has no messageId: the original cannot be recognised")
    body = envelope.get("body")
    field = "body"
    if not isinstance(body, str):
        body, field = envelope.get("bodyBase64"), "bodyBase64"
        try:
            base64.b64decode(str(body), validate=True)
        except ValueError as error:
            raise ValueError("the envelope holds no body (body or bodyBase64)") from error
    return _json({REPLAY_FIELD: {
        "messageId": message_id, "dedupKey": envelope.get("dedupKey"),
        "reason": envelope.get("reason"), "poisonedAt": envelope.get("poisonedAt"),
        "replayedBy": by,
        "replayedAt": (now or datetime.datetime.now(datetime.UTC)).isoformat()}, field: body})


def _unwrapped(view: QueueMessageView) -> QueueMessageView:
    """The original message a resubmission carries, or `view` when it is not one (a body
    that only looks like one is left to the parse, which refuses it with its reason)."""
    if not view.body.startswith(_REPLAY_PREFIX):
        return view
    try:
        data = parse_json_object(view.body, max_bytes=MAX_RESUBMISSION_BYTES)
        original = data[REPLAY_FIELD]
        message_id = original["messageId"]
        if not isinstance(message_id, str) or not message_id:
            return view
        text = data.get("body")
        body = (text.encode("utf-8") if isinstance(text, str)
                else base64.b64decode(str(data["bodyBase64"]), validate=True))
    except (PoisonMessageError, KeyError, TypeError, ValueError, UnicodeEncodeError):
        return view
    return dataclasses.replace(view, message_id=message_id, body=body, replayed=True)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _count(value: Any) -> int:
    return int(value) if value else 1


def _bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray)):
        return bytes(cast(bytes, body))
    return str(body).encode("utf-8")


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


def poison_envelope(view: QueueMessageView, *, consumer: str, reason: str, detail: str,
                    key: DedupKey | None = None, now: datetime.datetime | None = None) -> str:
    """The poison queue message for `view`: JSON with the reason, the detail, the original
    id, dequeue count, insertion time, dedup key and body (as text when it is UTF-8, else
    base64). A body that would not fit in one queue message is cut, and the envelope
    says so (`bodyTruncated`, `bodyBytes`, `bodySha256`)."""
    envelope: dict[str, Any] = {
        "reason": reason,
        "detail": detail[:MAX_DESCRIPTION_CHARS],
        "consumer": consumer,
        "messageId": view.message_id,
        "dequeueCount": view.dequeue_count,
        "insertionTime": view.insertion_time.isoformat() if view.insertion_time else None,
        "dedupKey": key.key if key is not None else None,
        "poisonedAt": (now or datetime.datetime.now(datetime.UTC)).isoformat(),
    }
    try:
        envelope["body"] = view.body.decode("utf-8")
    except UnicodeDecodeError:
        envelope["bodyBase64"] = base64.b64encode(view.body).decode("ascii")
    text = _json(envelope)
    if len(text.encode("utf-8")) <= MAX_POISON_TEXT_BYTES:
        return text
    field = "body" if "body" in envelope else "bodyBase64"
    whole = str(envelope.pop(field))
    envelope.update(bodyTruncated=True, bodyBytes=len(view.body),
                    bodySha256=hashlib.sha256(view.body).hexdigest())
    low, high = 0, len(whole)  # the longest prefix that fits, escaping included
    while low < high:
        middle = (low + high + 1) // 2
        if len(_json({**envelope, field: whole[:middle]}).encode("utf-8")) <= MAX_POISON_TEXT_BYTES:
            low = middle
        else:
            high = middle - 1
    envelope[field] = whole[:low]
    return _json(envelope)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


Handle = Callable[[QueueMessageView], Any]  # -> Outcome | Decision (awaitable on the async face)
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
    """What both faces share: identifying a message, the settlement rule, the envelope."""

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
        message's: `PoisonMessageError` with the reason (`shared.settlement.derived`)."""
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
        """The atomic path as a flow: both faces run it (sync, or awaited)."""
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
        """The two-phase path as a flow: both faces run it (sync, or awaited)."""
        found = self.identify(view, parse=parse, key=key, content=content)
        outcome: Outcome = yield from self.idempotency.run.flow(
            found.key, found.request_hash, lambda: handler(found.item),
            takeover_stale=takeover_stale, context=view.context(found.key))
        return outcome

    def _settled(self, view: QueueMessageView, result: Any) -> tuple[Decision, DedupKey | None,
                                                                     Exception | None]:
        """The decision for what `handle` answered (after the last delivery's rule)."""
        return self._final(decision_for_result(result), view), _key_of(result), None

    def _failed(self, view: QueueMessageView, error: Exception
                ) -> tuple[Decision, DedupKey | None, Exception | None]:
        """The decision after `handle` raised (the last delivery poisons what would retry)."""
        decision = decision_after(error, consumer=self.name, delivery_count=view.dequeue_count,
                                  context=view.context())
        return self._final(decision, view), None, error

    # -- the settlement rule: shared.settlement, then the last delivery's ------------------
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

    def run_atomic(self, message: Any, build: Callable[[Any, Any], Any], *,
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
                decision, key, cause = self._settled(view, handle(view))
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

    async def run_atomic(self, message: Any, build: Callable[[Any, Any], Any], *,
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
                decision, key, cause = self._settled(view, result)
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


def read_envelope(text: str | bytes) -> Mapping[str, Any]:
    """A poison envelope as written by the consumer (for tools and tests that read the
    poison queue); ValueError when it is not one."""
    data = parse_json_object(text, max_bytes=MAX_RESUBMISSION_BYTES)  # InvalidPayloadError: a ValueError
    if not isinstance(data.get("reason"), str) or "messageId" not in data:
        raise ValueError("not a poison envelope (no reason or messageId)")
    return data


__all__ = [
    "DEFAULT_MAX_DEQUEUE_COUNT", "AsyncStorageQueueConsumer", "MessageRetryError", "PoisonQueue",
    "QueueMessageView", "StorageQueueConsumer", "poison_envelope", "read_envelope", "resubmission",
]
