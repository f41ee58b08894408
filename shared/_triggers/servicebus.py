"""The Service Bus trigger's helper (SDK-type binding, explicit settlement): `ServiceBusConsumer`
views the message, takes its key (the MessageId, or a business key), runs the atomic flow
(`run_atomic`: marker, writes and outgoing messages in one transaction) or the two-phase one
(`run`: claim, effect, complete), and settles the message by the one rule of
`shared._core.settlement`; nothing raises into the trigger.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared._core.cloudevents import as_text
from shared._core.exceptions import ConfigurationError
from shared._core.keys import (
    DedupKey,
    Identified,
    consumer_name,
    message_id_key,
    request_hash,
    store_safe_id,
)
from shared._core.observability import message_span
from shared._core.payload import parse_json_object
from shared._core.records import Outcome
from shared._core.settlement import (
    Action,
    Decision,
    MessageActions,
    decision_after,
    decision_for,
    decision_for_result,
    derived,
    report_dead_letter,
    settle,
)
from shared._core.telemetry import Telemetry
from shared._flows.drivers import Async, AsyncTransaction, Sync, Transaction, flowmethod
from shared._flows.idempotency import AsyncIdempotency, BaseIdempotency, Idempotency
from shared._flows.steps import Flow

MAX_MESSAGE_BYTES = 256 * 1024  # a Standard-tier Service Bus message


@dataclass(frozen=True, slots=True)
class MessageView:
    """A Service Bus message as a consumer reads it (`MessageView.of` a received message)."""

    message_id: str | None
    body: bytes
    correlation_id: str | None = None
    delivery_count: int = 1
    content_type: str | None = None
    application_properties: Mapping[str, Any] = field(default_factory=dict[str, Any])

    @classmethod
    def of(cls, message: Any) -> MessageView:
        """From what the trigger hands the function: `azure.servicebus.ServiceBusReceivedMessage`
        (the SDK-type binding) or `azure.functions.ServiceBusMessage`; a view stays a view."""
        if isinstance(message, MessageView):
            return message
        message_id = message.message_id
        correlation_id = message.correlation_id
        properties: Mapping[Any, Any] = message.application_properties or {}
        return cls(
            message_id=None if message_id is None else str(as_text(message_id)),
            body=_message_body(message),
            correlation_id=None if correlation_id is None else str(as_text(correlation_id)),
            delivery_count=int(message.delivery_count or 1),
            content_type=as_text(message.content_type),
            application_properties={str(as_text(k)): as_text(v) for k, v in properties.items()},
        )

    @property
    def context(self) -> dict[str, Any]:
        """What logs and metrics say about the message."""
        return {"message_id": self.message_id, "correlation_id": self.correlation_id,
                "delivery_count": self.delivery_count}


def _message_body(message: Any) -> bytes:
    get_body = getattr(message, "get_body", None)
    body: Any = get_body() if callable(get_body) else message.body
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    try:
        return b"".join(bytes(part) for part in body)  # AMQP data sections
    except TypeError:
        return str(message).encode("utf-8")  # an AMQP value or sequence body


def json_object(view: MessageView) -> dict[str, Any]:
    """The default parse: the body as a JSON object (the bounded decoder)."""
    return parse_json_object(view.body, max_bytes=MAX_MESSAGE_BYTES)


class BaseServiceBusConsumer[L: BaseIdempotency[Any, Any, Any]]:
    """One Service Bus consumer: each message's effect once, settled explicitly. `name` scopes
    its keys (two subscriptions of one topic each apply a message once); `sends_to` names the
    destinations its builds send to: the idempotency must then have a dispatcher, checked here
    rather than at the first message."""

    def __init__(self, name: str, idempotency: L | None = None, *, sends_to: Collection[str] = (),
                 telemetry: Telemetry | None = None) -> None:
        self.name = consumer_name(name)
        self.idempotency = idempotency
        self.telemetry = telemetry or (idempotency.telemetry if idempotency else Telemetry())
        if sends_to and (idempotency is None or idempotency.dispatcher is None):
            raise ConfigurationError(
                f"{name} sends to {', '.join(sorted(sends_to))} but its Idempotency has no "
                "dispatcher: pass dispatcher=ServiceBusDispatcher(namespace, credential) (or "
                "another dispatcher from shared) to Idempotency")

    @property
    def store(self) -> Any:
        """Where the consumer's flows run: its Idempotency's store."""
        return None if self.idempotency is None else self.idempotency.store

    def _required_idempotency(self) -> L:
        if self.idempotency is None:
            raise ConfigurationError(f"{self.name} was built without an Idempotency; "
                                     "run and run_atomic need one")
        return self.idempotency

    def _identify[T](self, view: MessageView, parse: Callable[[MessageView], T],
                     key: Callable[[T], str] | None, content: Callable[[T], Any] | None) -> Identified[T]:
        if key is None:  # the MessageId is checked first: a message without one is refused as such
            dedup_key = message_id_key(self.name, view.message_id)
            value = derived("parse", lambda: parse(view))
        else:
            value = derived("parse", lambda: parse(view))
            dedup_key = derived("key", lambda: DedupKey.from_business_key(self.name, key(value)))
        hashed = derived("content", lambda: request_hash(value if content is None
                                                          else content(value)))
        return Identified(value, dedup_key, str(hashed))

    @flowmethod
    def _atomic[T](self, view: MessageView, build: Callable[..., Any],
                   parse: Callable[[MessageView], T], key: Callable[[T], str] | None,
                   content: Callable[[T], Any] | None, partition: Callable[[T], str] | None,
                   document: Callable[[T], tuple[str, dict[str, Any]]] | None) -> Flow[Decision]:
        found = self._identify(view, parse, key, content)
        value = found.item
        where = None if partition is None else \
            derived("partition", lambda: store_safe_id(partition(value)))
        marker_id, marker_body = (None, None) if document is None else \
            derived("document", lambda: document(value))
        if marker_id is not None:
            marker_id = store_safe_id(marker_id)
        outcome: Outcome = yield from self._required_idempotency().run_atomic.flow(
            found.key, found.request_hash, functools.partial(_build, build, value), partition=where,
            marker_id=marker_id, marker_body=marker_body, expires=document is None,
            context=view.context, read_first=view.delivery_count > 1)
        return decision_for(outcome)

    @flowmethod
    def _two_phase[T](self, view: MessageView, handler: Callable[[T], Any],
                      parse: Callable[[MessageView], T], key: Callable[[T], str] | None,
                      content: Callable[[T], Any] | None, takeover_stale: bool) -> Flow[Decision]:
        found = self._identify(view, parse, key, content)
        value = found.item
        outcome: Outcome = yield from self._required_idempotency().run.flow(
            found.key, found.request_hash, lambda: handler(value), takeover_stale=takeover_stale,
            context=view.context)
        return decision_for(outcome)

    def _failed(self, view: MessageView, error: Exception) -> Decision:
        return decision_after(error, consumer=self.name, delivery_count=view.delivery_count,
                              context=view.context)

    def _report(self, view: MessageView, decision: Decision) -> None:
        if decision.action is Action.DEADLETTER:
            report_dead_letter(self.telemetry, self.name, decision, view.context)

    def _span(self, view: MessageView) -> Any:
        return message_span(self.name, properties=view.application_properties,
                            message_id=view.message_id, correlation_id=view.correlation_id,
                            attributes={"messaging.delivery_count": view.delivery_count})


class ServiceBusConsumer(BaseServiceBusConsumer[Idempotency], Sync):
    """Settles each message of a sync function. Each method takes the trigger's message (or a
    `MessageView`) and its `ServiceBusMessageActions` (None: decide only, settle nothing) and
    returns the `Decision` it settled with. `parse` reads the message (default: its body as a
    JSON object); `key` gives a business key from what it read (default: the MessageId);
    `content` what is hashed to tell a duplicate from a reused key (default: all it read)."""

    def process(self, message: Any, actions: MessageActions | None,
                handle: Callable[[MessageView], Outcome | Decision | None]) -> Decision:
        """Low level: `handle(view)` runs any flow and returns its Outcome (or a Decision); its
        errors follow the settlement rule."""
        view = MessageView.of(message)
        with self._span(view):
            try:
                decision = decision_for_result(handle(view))
            except Exception as error:
                decision = self._failed(view, error)
            return self._settle(decision, message, actions, view)

    def run_atomic[T](self, message: Any, actions: MessageActions | None,
                      build: Callable[[Transaction, T], Any], *,
                      parse: Callable[[MessageView], T] = json_object,
                      key: Callable[[T], str] | None = None,
                      content: Callable[[T], Any] | None = None,
                      partition: Callable[[T], str] | None = None,
                      document: Callable[[T], tuple[str, dict[str, Any]]] | None = None) -> Decision:
        """The atomic path: the marker and what `build(tx, item)` writes and sends commit in
        one transaction, in `partition(item)` (default: the key's own). With `document`, the
        marker is the business document `(id, body)` it returns, kept for good. The partition
        and that id may be any text: they are stored escaped (`store_safe_id`), as keys are."""
        return self.process(message, actions, lambda view: self._atomic(
            view, build, parse, key, content, partition, document))

    def run[T](self, message: Any, actions: MessageActions | None, handler: Callable[[T], Any], *,
               parse: Callable[[MessageView], T] = json_object,
               key: Callable[[T], str] | None = None, content: Callable[[T], Any] | None = None,
               takeover_stale: bool = True) -> Decision:
        """The two-phase path, for an effect outside the store: claim the key, run
        `handler(item)` once under a renewed lease, record its result. An attempt that died
        mid-effect is taken over (`takeover_stale`) or dead-lettered for a person."""
        return self.process(message, actions, lambda view: self._two_phase(
            view, handler, parse, key, content, takeover_stale))

    def _settle(self, decision: Decision, message: Any, actions: MessageActions | None,
                view: MessageView) -> Decision:
        self._report(view, decision)
        if actions is not None:
            settle(decision, message, actions)
        return decision


class AsyncServiceBusConsumer(BaseServiceBusConsumer[AsyncIdempotency], Async):
    """`ServiceBusConsumer` for an `async def` function (`shared.aio.ServiceBusConsumer`): the
    same methods, awaited; builds, handlers and `handle` may be async. Settlement calls (sync
    gRPC calls to the host) run on a thread, off the event loop."""

    def __init__(self, name: str, idempotency: AsyncIdempotency | None = None, *,
                 sends_to: Collection[str] = (), telemetry: Telemetry | None = None) -> None:
        if idempotency is not None and not isinstance(idempotency, Async):  # pyright: ignore[reportUnnecessaryIsInstance] - callers are not all type-checked
            raise ConfigurationError(f"{name}: shared.aio.ServiceBusConsumer needs a "
                                     "shared.aio.Idempotency (on an async store)")
        super().__init__(name, idempotency, sends_to=sends_to, telemetry=telemetry)

    async def process(self, message: Any, actions: MessageActions | None,
                      handle: Callable[[MessageView], Awaitable[Outcome | Decision | None]
                                       | Outcome | Decision | None]) -> Decision:
        """`ServiceBusConsumer.process`, awaited."""
        view = MessageView.of(message)
        with self._span(view):
            try:
                result = handle(view)
                decision = decision_for_result(
                    await result if inspect.isawaitable(result) else result)
            except Exception as error:
                decision = self._failed(view, error)
            return await self._settle(decision, message, actions, view)

    async def run_atomic[T](self, message: Any, actions: MessageActions | None,
                            build: Callable[[AsyncTransaction, T], Any], *,
                            parse: Callable[[MessageView], T] = json_object,
                            key: Callable[[T], str] | None = None,
                            content: Callable[[T], Any] | None = None,
                            partition: Callable[[T], str] | None = None,
                            document: Callable[[T], tuple[str, dict[str, Any]]] | None = None
                            ) -> Decision:
        """`ServiceBusConsumer.run_atomic`, awaited; `build` may be async."""
        return await self.process(message, actions, lambda view: self._atomic(
            view, build, parse, key, content, partition, document))

    async def run[T](self, message: Any, actions: MessageActions | None,
                     handler: Callable[[T], Any], *, parse: Callable[[MessageView], T] = json_object,
                     key: Callable[[T], str] | None = None,
                     content: Callable[[T], Any] | None = None,
                     takeover_stale: bool = True) -> Decision:
        """`ServiceBusConsumer.run`, awaited; `handler` may be async. A sync handler runs on the
        event loop: make a blocking call async, or hand it to `asyncio.to_thread`."""
        return await self.process(message, actions, lambda view: self._two_phase(
            view, handler, parse, key, content, takeover_stale))

    async def _settle(self, decision: Decision, message: Any, actions: MessageActions | None,
                      view: MessageView) -> Decision:
        self._report(view, decision)
        if actions is not None and decision.action is not Action.WAIT:
            await asyncio.to_thread(settle, decision, message, actions)
        return decision


def _build[T](build: Callable[[Any, T], Any], value: T, tx: Any) -> Any:
    return build(tx, value)
