"""The trigger helpers fed by hand (`shared._triggers.servicebus`): messages and settlement actions are plain
objects, the store the in-memory one, so each rule of the module docstring is one test. The
helpers through the real worker on the real servers: tests/examples (the lift test) and
tests/functions, tests/worker (the sample app)."""

from __future__ import annotations

import asyncio
import json
import typing
from dataclasses import dataclass, field
from typing import Any

import azure.functions as func
import pytest

from shared import (
    EventHubConsumer,
    HttpResult,
    Idempotency,
    IdempotencyKeyEndpoint,
    KeyInProgressError,
    KeyReusedError,
    PoisonMessageError,
    ServiceBusConsumer,
    aio,
    request_hash,
)
from shared._core.exceptions import (
    ConfigurationError,
    DispatchUnavailableError,
    IdempotencyError,
    InvalidKeyError,
    StoreUnavailableError,
)
from shared._core.keys import DedupKey
from shared._core.payload import InvalidPayloadError
from shared._flows.parking import ParkedEntryError
from shared._triggers.servicebus import MessageView
from shared.testing import AsyncInMemoryIdempotencyStore, InMemoryDispatcher, InMemoryIdempotencyStore


@dataclass
class Actions:
    """ServiceBusMessageActions as the host injects it: what was settled, in order."""

    calls: list[tuple[str, str | None]] = field(default_factory=list)

    def complete(self, message: Any) -> None:
        self.calls.append(("complete", None))

    def abandon(self, message: Any) -> None:
        self.calls.append(("abandon", None))

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self.calls.append(("deadletter", deadletter_reason))


def message(body: Any, message_id: str | None = "m-1", delivery_count: int = 1) -> MessageView:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return MessageView(message_id, raw, delivery_count=delivery_count)


def save(tx: Any, order: dict[str, Any]) -> dict[str, Any]:
    tx.create("order", {"total": order["total"]})
    return {"orderId": order["orderId"]}


@pytest.fixture
def store() -> InMemoryIdempotencyStore:
    return InMemoryIdempotencyStore()


# -- Service Bus: the settlement rule ----------------------------------------------------------
def test_new_then_duplicate_complete_and_the_effect_happens_once(store):
    orders, actions = ServiceBusConsumer("orders", Idempotency(store)), Actions()
    body = {"orderId": "o-1", "total": 5}
    orders.run_atomic(message(body), actions, save, partition=lambda o: o["orderId"])
    orders.run_atomic(message(body, delivery_count=2), actions, save, partition=lambda o: o["orderId"])
    assert actions.calls == [("complete", None), ("complete", None)]
    assert store.read_document("o-1", "order").body["total"] == 5


def test_a_reused_key_is_dead_lettered_with_its_reason(store):
    orders, actions = ServiceBusConsumer("orders", Idempotency(store)), Actions()
    orders.run_atomic(message({"orderId": "o-1", "total": 5}), actions, save)
    orders.run_atomic(message({"orderId": "o-1", "total": 9}), actions, save)
    assert actions.calls[-1] == ("deadletter", "IdempotencyKeyConflict")


@pytest.mark.parametrize(("body", "message_id", "reason"), [
    (b"{not json", "m-1", "MalformedJson"),
    ({"orderId": "o-1"}, None, "InvalidMessageId"),  # the MessageId is checked first
    ({"total": 5}, "m-1", "InvalidMessage"),  # the partition function met a KeyError
])
def test_bad_input_is_dead_lettered_with_a_reason_on_its_first_delivery(store, body, message_id,
                                                                       reason):
    orders, actions = ServiceBusConsumer("orders", Idempotency(store)), Actions()
    decision = orders.run_atomic(message(body, message_id), actions, save,
                                 partition=lambda o: o["orderId"])
    assert actions.calls == [("deadletter", reason)] and decision.reason == reason


def test_a_build_refusing_the_message_dead_letters_it_and_commits_nothing(store):
    def refuse(tx: Any, order: dict[str, Any]) -> None:
        tx.create("order", order)
        raise PoisonMessageError("OrderTooLarge", "more lines than a transaction holds")

    orders, actions = ServiceBusConsumer("orders", Idempotency(store)), Actions()
    orders.run_atomic(message({"orderId": "o-1"}), actions, refuse)
    assert actions.calls == [("deadletter", "OrderTooLarge")]
    assert store.get_record(DedupKey("orders", "m-1").encoded, DedupKey("orders", "m-1").encoded) is None


class Down(InMemoryIdempotencyStore):
    def commit(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("503", status_code=503)

    def get_record(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("503", status_code=503)


def test_a_store_outage_abandons_the_first_delivery_then_leaves_the_message_to_its_lock():
    orders, actions = ServiceBusConsumer("orders", Idempotency(Down())), Actions()
    body = {"orderId": "o-1", "total": 5}
    first = orders.run_atomic(message(body), actions, save)
    later = orders.run_atomic(message(body, delivery_count=2), actions, save)
    assert actions.calls == [("abandon", None)]  # the second is not settled: its lock runs out
    assert (first.reason, later.reason) == ("Transient", "Transient")


def test_an_unexpected_error_is_logged_and_retried_never_raised_into_the_trigger(store, caplog):
    def broken(tx: Any, order: dict[str, Any]) -> None:
        raise RuntimeError("a bug")

    orders, actions = ServiceBusConsumer("orders", Idempotency(store)), Actions()
    with caplog.at_level("ERROR"):
        decision = orders.run_atomic(message({"orderId": "o-1"}), actions, broken)
    assert actions.calls == [("abandon", None)] and decision.reason == "UnexpectedError"
    assert "a bug" in caplog.text


def test_two_phase_runs_the_effect_once_and_dead_letters_an_uncertain_one(store):
    sent: list[str] = []
    notify, actions = ServiceBusConsumer("notify", Idempotency(store)), Actions()

    def send(note: dict[str, Any]) -> str:
        sent.append(note["to"])
        return "sent"

    notify.run(message({"to": "a"}), actions, send)
    notify.run(message({"to": "a"}, delivery_count=2), actions, send)
    assert sent == ["a"] and actions.calls == [("complete", None)] * 2

    from shared._core.exceptions import EffectUncertainError

    def unsure(note: dict[str, Any]) -> None:
        raise EffectUncertainError("timed out after sending")

    notify.run(message({"to": "b"}, "m-2"), actions, unsure)
    assert actions.calls[-1] == ("deadletter", "OutcomeUnknown")


def test_a_view_is_settled_by_nothing_when_no_actions_are_given(store):
    decision = ServiceBusConsumer("orders", Idempotency(store)).run_atomic(
        message({"orderId": "o-1", "total": 1}), None, save)
    assert decision.action.value == "complete"


def test_the_async_variant_settles_the_same_way():
    store = AsyncInMemoryIdempotencyStore()
    orders, actions = aio.ServiceBusConsumer("orders", aio.Idempotency(store)), Actions()

    async def save_async(tx: Any, order: dict[str, Any]) -> dict[str, Any]:
        await tx.read("order")  # an async build awaits its reads
        return save(tx, order)

    async def main() -> None:
        await orders.run_atomic(message({"orderId": "o-1", "total": 5}), actions, save_async)
        await orders.run_atomic(message({"orderId": "o-1", "total": 5}, delivery_count=2),
                                actions, save_async)
        await orders.run_atomic(message({"orderId": "o-1", "total": 6}), actions, save_async)

    asyncio.run(main())
    assert actions.calls == [("complete", None), ("complete", None),
                             ("deadletter", "IdempotencyKeyConflict")]


def test_a_message_view_is_made_from_what_the_sdk_type_binding_hands_over():
    @dataclass
    class Received:  # the attributes of azure.servicebus.ServiceBusReceivedMessage used
        message_id: Any = b"m-1"
        body: Any = field(default_factory=lambda: iter([b'{"a":', b"1}"]))  # AMQP data sections
        correlation_id: Any = b"c-1"
        delivery_count: Any = None
        content_type: Any = b"application/json"
        application_properties: Any = field(default_factory=lambda: {b"traceparent": b"00-x"})

    view = MessageView.of(Received())
    assert view == MessageView("m-1", b'{"a":1}', "c-1", 1, "application/json", {"traceparent": "00-x"})


# -- misuse fails early and loudly ---------------------------------------------------------------
def test_a_consumer_that_sends_without_a_dispatcher_fails_at_construction(store):
    with pytest.raises(ConfigurationError, match="dispatcher="):
        ServiceBusConsumer("orders", Idempotency(store), sends_to=["order-events"])
    ServiceBusConsumer("orders", Idempotency(store, dispatcher=InMemoryDispatcher()),
                       sends_to=["order-events"])


def test_a_sync_store_given_to_the_async_variant_fails_at_construction(store):
    with pytest.raises(ConfigurationError, match="async store") as refused:
        aio.Idempotency(store)  # the misuse under test (a sync store passes as a protocol)
    # The error names the fix by the names an app imports.
    assert str(refused.value).startswith("shared.aio.Idempotency needs an async store")
    assert "shared.aio.TableIdempotencyStore" in str(refused.value)
    with pytest.raises(ConfigurationError, match="sync store"):
        Idempotency(AsyncInMemoryIdempotencyStore())  # type: ignore[arg-type] - the misuse under test
    with pytest.raises(ConfigurationError, match=r"shared\.aio\.Idempotency"):
        aio.ServiceBusConsumer("orders", Idempotency(store))  # type: ignore[arg-type] - the misuse under test


def test_an_invalid_consumer_name_fails_at_construction(store):
    with pytest.raises(ConfigurationError, match="consumer name"):
        ServiceBusConsumer("orders/eu", Idempotency(store))


def test_every_library_error_derives_from_one_root():
    for error in (InvalidPayloadError, PoisonMessageError, ConfigurationError, KeyReusedError,
                  KeyInProgressError, StoreUnavailableError, InvalidKeyError, ParkedEntryError,
                  DispatchUnavailableError):
        assert issubclass(error, IdempotencyError), error


# -- the decorator returns results and raises on misuse ------------------------------------------
def test_the_decorator_returns_the_result_and_raises_on_a_reused_key(store):
    """Before, the decorated handler returned an Outcome: a caller who ignored it completed a
    message whose key was reused for other content, with no error."""
    idem = Idempotency(store)
    calls: list[dict[str, Any]] = []

    @idem.idempotent(key=lambda body: DedupKey("mail", body["ref"]))
    def send(body: dict[str, Any]) -> str:
        calls.append(body)
        return f"sent {body['to']}"

    assert send({"ref": "r1", "to": "a"}) == "sent a"
    assert send({"ref": "r1", "to": "a"}) == "sent a"  # the first call's result, stored
    with pytest.raises(KeyReusedError) as reused:
        send({"ref": "r1", "to": "b"})
    assert reused.value.outcome.stored_hash != reused.value.outcome.request_hash
    assert calls == [{"ref": "r1", "to": "a"}]


def test_the_decorator_raises_while_another_attempt_holds_the_key(store):
    idem = Idempotency(store)
    key = DedupKey("mail", "r1")
    idem.claim(key, request_hash("same content"))  # another attempt, live

    @idem.idempotent(key=lambda body: key, payload=lambda body: "same content")
    def send(body: dict[str, Any]) -> str:
        return "sent"

    with pytest.raises(KeyInProgressError):
        send({"ref": "r1"})


# -- Event Hubs: the retry policy the batch rests on ---------------------------------------------
def _app_with(*decorators: Any) -> Any:
    app = func.FunctionApp()

    def function(events: typing.List[func.EventHubEvent]) -> None:  # noqa: UP006 - the worker's form
        pass

    built: Any = function
    for decorate in reversed(decorators):
        built = decorate(app)(built)
    return built


def _trigger(cardinality: str = "many") -> Any:
    return lambda app: app.event_hub_message_trigger(arg_name="events", event_hub_name="hub",
                                                      connection="C", cardinality=cardinality)


def _retry(count: str) -> Any:
    return lambda app: app.retry(strategy="exponential_backoff", max_retry_count=count,
                                 minimum_interval="00:00:05", maximum_interval="00:05:00")


def test_a_batch_trigger_with_the_unbounded_retry_policy_is_accepted():
    built = _app_with(_retry("-1"), _trigger())
    assert EventHubConsumer.checked(built) is built


@pytest.mark.parametrize(("decorators", "why"), [
    ((_trigger(),), "no retry policy"),
    ((_retry("3"), _trigger()), "max_retry_count='3'"),
    ((_retry("-1"), _trigger("one")), 'cardinality="many"'),
])
def test_a_batch_trigger_the_host_would_checkpoint_past_a_failure_is_refused_at_import(decorators,
                                                                                       why):
    with pytest.raises(ConfigurationError, match=why.replace("(", r"\(")):
        EventHubConsumer.checked(_app_with(*decorators))


def test_the_check_put_below_the_trigger_says_where_it_goes():
    def function(events: Any) -> None:
        pass

    with pytest.raises(ConfigurationError, match="above the function's decorators"):
        EventHubConsumer.checked(function)  # type: ignore[arg-type] - the misuse under test


# -- HTTP: Idempotency-Key ----------------------------------------------------------------------
def created(request: Any) -> HttpResult:
    return HttpResult(201, {"amount": request.body["amount"]})


def headers(key: str | None = "k-1") -> dict[str, str]:
    return {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}


def test_http_first_request_then_a_replay_of_its_stored_response(store):
    endpoint = IdempotencyKeyEndpoint(Idempotency(store))
    first = endpoint.answer(headers(), b'{"amount": 5}', created)
    again = endpoint.answer(headers(), b'{"amount": 5}', created)
    assert (first.status, first.body) == (201, {"amount": 5}) == (again.status, again.body)
    assert again.headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(("key", "body", "slug", "status"), [
    (None, b'{"amount": 5}', "idempotency-key-missing", 400),
    ("k\x01", b'{"amount": 5}', "idempotency-key-invalid", 400),
    ("k-1", b"[1]", "request-invalid", 400),
])
def test_http_problems_name_their_type_and_keep_their_title(store, key, body, slug, status):
    from shared._triggers.http import PROBLEMS

    result = IdempotencyKeyEndpoint(Idempotency(store), problem_base="https://docs.example/http/#"
                                    ).answer(headers(key), body, created)
    assert result.status == status and result.headers["Content-Type"] == "application/problem+json"
    assert result.body["type"] == f"https://docs.example/http/#{slug}"
    assert result.body["title"] == PROBLEMS[slug][1]


def test_http_a_reused_key_is_422_and_a_refused_request_422_with_its_reason(store):
    endpoint = IdempotencyKeyEndpoint(Idempotency(store))
    endpoint.answer(headers(), b'{"amount": 5}', created)
    assert endpoint.answer(headers(), b'{"amount": 6}', created).body["type"].endswith(
        "idempotency-key-reused")

    def refuse(request: Any) -> HttpResult:
        raise PoisonMessageError("LimitExceeded", "over the daily limit")

    refused = endpoint.answer(headers("k-2"), b'{"amount": 6}', refuse)
    assert (refused.status, refused.body["reason"]) == (422, "LimitExceeded")


@pytest.mark.parametrize("failure", [StoreUnavailableError("503", status_code=503),
                                     DispatchUnavailableError("sent, answer lost")])
def test_http_a_transient_failure_is_503_with_retry_after(store, failure):
    def fails(request: Any) -> HttpResult:
        raise failure

    result = IdempotencyKeyEndpoint(Idempotency(store)).answer(headers(), b'{"amount": 5}', fails)
    assert (result.status, result.headers["Retry-After"]) == (503, "1")
    assert result.body["title"] == "Service Unavailable"  # about:blank: the status phrase
    # the claim was released: the caller's retry runs the request
    assert IdempotencyKeyEndpoint(Idempotency(store)).answer(
        headers(), b'{"amount": 5}', created).status == 201


def test_http_an_unexpected_error_is_a_500_problem_not_an_exception(store, caplog):
    def broken(request: Any) -> HttpResult:
        raise RuntimeError("a bug")

    with caplog.at_level("ERROR"):
        result = IdempotencyKeyEndpoint(Idempotency(store)).answer(headers(), b"{}", broken)
    assert result.status == 500 and "a bug" in caplog.text


def test_http_a_caller_header_that_is_not_a_header_name_fails_at_construction(store):
    with pytest.raises(ConfigurationError):
        IdempotencyKeyEndpoint(Idempotency(store), caller_header="X Caller")


def test_an_event_view_reads_its_cloud_event_in_either_mode():
    from shared import EventView
    from shared._core.cloudevents import InvalidEventError

    structured = EventView(1, json.dumps({"specversion": "1.0", "id": "e1", "source": "/s",
                                          "type": "t", "data": {"cents": 5}}).encode(),
                           content_type="application/cloudevents+json")
    binary = EventView(2, b'{"cents": 5}', properties={"ce_specversion": "1.0", "ce_id": "e1",
                                                       "ce_source": "/s", "ce_type": "t"},
                       content_type="application/json")
    for view in (structured, binary):
        event = view.cloud_event()
        assert (event.id, event.source, event.data) == ("e1", "/s", {"cents": 5})
    with pytest.raises(InvalidEventError):
        EventView(3, b'{"id": "e1"', content_type="application/cloudevents+json").cloud_event()
    with pytest.raises(InvalidEventError):
        structured.cloud_event(max_bytes=10)
