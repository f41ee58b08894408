"""StorageQueueConsumer: the queue trigger's contract (return = delete, raise = come back, the
helper writes refusals to the poison queue with a reason), on the in-memory store.

Fast unit tests; tests/queues/test_queue_chaos.py proves the same rules on Azurite's queue
service through the real worker.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import azure.functions as func
import pytest
from azure.functions.meta import Datum

from shared import DedupKey, Idempotency, aio
from shared._core.exceptions import StoreUnavailableError
from shared._core.payload import InvalidPayloadError
from shared._core.settlement import Action
from shared._triggers.queue_messages import (
    MAX_POISON_TEXT_BYTES,
    QueueMessageView,
    poison_envelope,
    read_envelope,
)
from shared._triggers.queues import AsyncStorageQueueConsumer, MessageRetryError, StorageQueueConsumer
from shared.testing import AsyncInMemoryIdempotencyStore, InMemoryIdempotencyStore
from tests.support.doubles import CountingMemoryStore


class PoisonQueue:
    """Stands in for the `<queue>-poison` QueueClient: keeps what was sent."""

    def __init__(self, *, fail: bool = False) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def send_message(self, content: Any, **kwargs: Any) -> dict[str, Any]:
        if self.fail:
            raise ConnectionError("poison queue unreachable")
        self.sent.append((content, kwargs))
        return {"id": f"p-{len(self.sent)}"}

    @property
    def envelopes(self) -> list[dict[str, Any]]:
        return [dict(read_envelope(text)) for text, _ in self.sent]


class AsyncPoisonQueue(PoisonQueue):
    async def send_message(self, content: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]  # the aio client's coroutine
        return super().send_message(content, **kwargs)


class FlakyStore(CountingMemoryStore):
    """The in-memory store, answering 503 while `down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailableError("store answered 503", status_code=503)

    def get_record(self, partition, record_id):
        self._check()
        return super().get_record(partition, record_id)

    def put_record_if_absent(self, record):
        self._check()
        return super().put_record_if_absent(record)

    def commit(self, marker, operations, **kwargs):
        self._check()
        return super().commit(marker, operations, **kwargs)

    def read_document(self, partition, document_id):
        self._check()
        return super().read_document(partition, document_id)


def message(body: Any, *, message_id: str | None = "m-1", dequeue_count: int = 1) -> QueueMessageView:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return QueueMessageView(message_id, raw, dequeue_count)


ORDER = {"orderId": "o-1", "customerId": "c-1", "total": 12.5}


def count(tx, item) -> dict[str, Any]:
    """An effect that is not idempotent on its own: a counter per customer."""
    current = tx.read("counter")
    body = {"n": (current.body["n"] if current else 0) + 1}
    if current is None:
        tx.create("counter", body)
    else:
        tx.replace("counter", body, etag=current.etag)
    return {"orderId": item["orderId"]}


def by_order(item: dict[str, Any]) -> str | None:
    return item.get("orderId")  # missing: refused as InvalidKey


def partition(item: dict[str, Any]) -> str:
    return f"customer-{item['customerId']}"


def counter(store: InMemoryIdempotencyStore, customer: str = "c-1") -> int:
    document = store.read_document(f"customer-{customer}", "counter")
    return 0 if document is None else document.body["n"]


@pytest.fixture
def store() -> FlakyStore:
    return FlakyStore()


@pytest.fixture
def poison() -> PoisonQueue:
    return PoisonQueue()


@pytest.fixture
def consumer(store, poison) -> StorageQueueConsumer:
    return StorageQueueConsumer("order-audit", Idempotency(store), poison=poison)


def run(consumer: StorageQueueConsumer, view: QueueMessageView, **options: Any):
    return consumer.run_atomic(view, count, key=by_order, partition=partition, **options)


# -- return = delete: processed once, duplicates absorbed -------------------------------------
def test_a_redelivery_of_the_same_message_is_absorbed(consumer, store, poison):
    first = consumer.run_atomic(message(ORDER), count, partition=partition)
    again = consumer.run_atomic(message(ORDER, dequeue_count=2), count, partition=partition)
    assert (first.action, first.outcome) == (Action.COMPLETE, "processed")
    assert (again.action, again.outcome) == (Action.COMPLETE, "duplicate")
    assert counter(store) == 1 and poison.sent == []


def test_a_producer_retry_is_a_new_message_id_absorbed_only_by_the_business_key(consumer, store):
    assert run(consumer, message(ORDER, message_id="m-1")).outcome == "processed"
    assert run(consumer, message(ORDER, message_id="m-2")).outcome == "duplicate"
    assert counter(store) == 1
    # Keyed by message id instead, the producer's retry is applied twice: why `key=` exists.
    other = StorageQueueConsumer("by-message-id", Idempotency(store), poison=PoisonQueue())
    other.run_atomic(message(ORDER, message_id="m-1"), count, partition=partition)
    other.run_atomic(message(ORDER, message_id="m-2"), count, partition=partition)
    assert counter(store) == 3


def test_content_is_compared_by_value_not_by_bytes(consumer, store):
    run(consumer, message(ORDER, message_id="m-1"))
    reordered = json.dumps(dict(reversed(list(ORDER.items())))).encode()
    assert run(consumer, message(reordered, message_id="m-2")).outcome == "duplicate"


# -- refused with a reason on the first delivery, then return (deleted) ------------------------
def test_a_reused_key_with_other_content_goes_to_the_poison_queue_with_the_reason(consumer, store,
                                                                                  poison):
    run(consumer, message(ORDER, message_id="m-1"))
    decision = run(consumer, message({**ORDER, "total": 99}, message_id="m-2"))
    assert (decision.action, decision.reason) == (Action.DEADLETTER, "IdempotencyKeyConflict")
    (envelope,) = poison.envelopes
    assert envelope["reason"] == "IdempotencyKeyConflict"
    assert envelope["messageId"] == "m-2" and envelope["dequeueCount"] == 1
    assert envelope["dedupKey"] == "o-1" and envelope["consumer"] == "order-audit"
    assert json.loads(envelope["body"]) == {**ORDER, "total": 99}
    assert "request hash" in envelope["detail"]
    assert poison.sent[0][1] == {"time_to_live": -1}, "poison envelopes never expire"
    assert counter(store) == 1


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "MalformedJson"),
    (b"[1, 2]", "MalformedJson"),
    (b"\xff\xfe", "MalformedJson"),
    (b"[" * 100 + b"]" * 100, "TooDeeplyNested"),
    (json.dumps({"customerId": "c-1"}).encode(), "InvalidKey"),
])
def test_bad_input_goes_to_the_poison_queue_with_its_reason_on_the_first_delivery(
        consumer, store, poison, body, reason):
    decision = run(consumer, message(body))
    assert (decision.action, decision.reason) == (Action.DEADLETTER, reason)
    (envelope,) = poison.envelopes
    assert envelope["reason"] == reason and envelope["dequeueCount"] == 1
    original = envelope.get("body", "").encode() if "body" in envelope else None
    assert original == body or envelope.get("bodyBase64")
    assert store.requests == 0, "refused before any store request"


def test_a_build_may_refuse_the_message_too(consumer, poison):
    def refuse(tx, item):
        raise InvalidPayloadError("UnknownCurrency", "XYZ")

    decision = consumer.run_atomic(message(ORDER), refuse, partition=partition)
    assert decision.reason == "UnknownCurrency"
    assert poison.envelopes[0]["detail"] == "XYZ"


def test_the_dead_letter_alert_is_counted_once_per_refusal_and_the_conflict_by_its_outcome(
        store, poison, caplog):
    consumer = StorageQueueConsumer("order-audit", Idempotency(store), poison=poison)
    with caplog.at_level("ERROR", logger="shared._core.telemetry"):
        run(consumer, message(b"{"))
        run(consumer, message(ORDER, message_id="m-1"))
        run(consumer, message({**ORDER, "total": 1}, message_id="m-2"))
    events = [r.getMessage().split()[0] for r in caplog.records]
    assert events == ["MessageDeadLettered", "IdempotencyKeyConflict"]


# -- raise = come back: transient failures, the last delivery --------------------------------
def test_a_transient_store_failure_raises_so_the_message_comes_back(consumer, store, poison):
    store.down = True
    with pytest.raises(MessageRetryError) as raised:
        run(consumer, message(ORDER))
    assert raised.value.reason == "Transient"
    assert isinstance(raised.value.__cause__, StoreUnavailableError)
    assert poison.sent == []
    store.down = False
    assert run(consumer, message(ORDER, dequeue_count=2)).outcome == "processed"
    assert counter(store) == 1


def test_on_the_last_delivery_a_retry_goes_to_the_poison_queue_with_its_reason(store, poison):
    consumer = StorageQueueConsumer("order-audit", Idempotency(store), poison=poison,
                                    max_dequeue_count=3)
    store.down = True
    with pytest.raises(MessageRetryError):
        run(consumer, message(ORDER, dequeue_count=2))
    decision = run(consumer, message(ORDER, dequeue_count=3))
    assert (decision.action, decision.reason) == (Action.DEADLETTER, "MaxDequeueCountReached")
    (envelope,) = poison.envelopes
    assert envelope["detail"].startswith("Transient: store answered 503")
    assert "dequeue count 3 of 3" in envelope["detail"] and envelope["dequeueCount"] == 3


def test_a_build_that_raises_is_retried_as_unexpected_until_the_last_delivery(store, poison):
    consumer = StorageQueueConsumer("order-audit", Idempotency(store), poison=poison,
                                    max_dequeue_count=2)

    def broken(tx, item):
        raise KeyError("bug")

    with pytest.raises(MessageRetryError) as raised:
        consumer.run_atomic(message(ORDER), broken, partition=partition)
    assert raised.value.reason == "UnexpectedError"
    assert isinstance(raised.value.__cause__, KeyError), "the cause is chained for the host's log"
    assert not poison.sent
    decision = consumer.run_atomic(message(ORDER, dequeue_count=2), broken, partition=partition)
    assert decision.reason == "MaxDequeueCountReached"
    assert poison.envelopes[0]["detail"].startswith("UnexpectedError: KeyError: 'bug'")


def _raise(error: Exception) -> Any:
    raise error


@pytest.mark.parametrize("where", ["key", "partition", "content", "parse", "marker"])
def test_what_reads_the_message_alone_and_raises_refuses_it_on_the_first_delivery(
        consumer, store, poison, where):
    """The Service Bus rule: parse, key, content, partition and marker read the message alone,
    so a retry cannot help; InvalidMessage names the step (tests/test_triggers.py holds the
    same for Service Bus)."""
    broken = {where: lambda *_: _raise(ZeroDivisionError("bug"))}
    options: dict[str, Any] = {"key": by_order, "partition": partition, **broken}
    decision = consumer.run_atomic(message(ORDER), lambda tx, item: None, **options)
    assert (decision.action, decision.reason) == (Action.DEADLETTER, "InvalidMessage")
    assert poison.envelopes[0]["detail"].startswith(f"{where}: ZeroDivisionError")
    assert poison.envelopes[0]["dequeueCount"] == 1


def test_an_effect_of_unknown_outcome_is_refused_for_reconciliation(consumer, poison):
    from shared._core.exceptions import EffectUncertainError

    decision = consumer.run(message(ORDER), lambda item: _raise(EffectUncertainError("timed out")),
                            key=by_order)
    assert (decision.action, decision.reason) == (Action.DEADLETTER, "OutcomeUnknown")


def test_a_message_without_an_id_keyed_by_its_id_is_refused_as_such(consumer, poison):
    decision = consumer.run_atomic(message(ORDER, message_id=None), lambda tx, item: None,
                                   partition=partition)
    assert (decision.action, decision.reason) == (Action.DEADLETTER, "InvalidMessageId")


def test_a_poison_queue_that_cannot_be_written_leaves_the_message_to_come_back(store):
    consumer = StorageQueueConsumer("order-audit", Idempotency(store),
                                    poison=PoisonQueue(fail=True))
    with pytest.raises(MessageRetryError) as raised:
        run(consumer, message(b"{"))
    assert raised.value.reason == "PoisonQueueUnavailable"
    assert isinstance(raised.value.__cause__, ConnectionError)


def test_the_poison_queue_factory_is_called_once_on_first_use(store):
    made: list[PoisonQueue] = []

    def factory() -> PoisonQueue:
        made.append(PoisonQueue())
        return made[-1]

    consumer = StorageQueueConsumer("order-audit", Idempotency(store), poison=factory)
    run(consumer, message(ORDER))
    assert made == []
    run(consumer, message(b"{", message_id="m-2"))
    run(consumer, message(b"[", message_id="m-3"))
    assert len(made) == 1 and len(made[0].sent) == 2


# -- two phases --------------------------------------------------------------------------------
def test_two_phase_runs_the_handler_once_and_returns_the_first_result(consumer, poison):
    calls: list[str] = []

    def send(item):
        calls.append(item["orderId"])
        return {"sent": len(calls)}

    first = consumer.run(message(ORDER, message_id="m-1"), send, key=by_order)
    again = consumer.run(message(ORDER, message_id="m-2"), send, key=by_order)
    assert (first.outcome, again.outcome) == ("processed", "duplicate")
    assert calls == ["o-1"] and poison.sent == []


def test_two_phase_while_another_attempt_holds_the_key_the_message_comes_back(consumer, store):
    key = DedupKey("order-audit", "o-1")
    consumer.idempotency.claim(key, consumer.identify(message(ORDER), key=by_order).request_hash)
    with pytest.raises(MessageRetryError) as raised:
        consumer.run(message(ORDER, message_id="m-2"), lambda item: None, key=by_order)
    assert raised.value.reason == "InProgress"


def test_two_phase_stale_claim_without_takeover_goes_to_the_poison_queue(store, poison, clock):
    from shared import IdempotencyConfig

    consumer = StorageQueueConsumer("order-audit", Idempotency(store, config=IdempotencyConfig(
        clock=clock)), poison=poison)
    key = DedupKey("order-audit", "o-1")
    consumer.idempotency.claim(key, consumer.identify(message(ORDER), key=by_order).request_hash)
    clock.advance(3600)
    decision = consumer.run(message(ORDER, dequeue_count=2), lambda item: None, key=by_order,
                            takeover_stale=False)
    assert decision.reason == "StaleInProgress"
    assert "reconcile" in poison.envelopes[0]["detail"]


def test_marker_makes_the_business_document_its_own_marker_kept_for_good(consumer, store):
    def entry(item):
        return f"entry-{item['orderId']}", {"orderId": item["orderId"], "kind": "entry"}

    run(consumer, message(ORDER), marker=entry)
    document = store.read_document("customer-c-1", "entry-o-1")
    assert document is not None and document.body["kind"] == "entry"
    record = store.get_record("customer-c-1", "entry-o-1")
    assert record is not None and record.expires_at is None
    assert run(consumer, message(ORDER, message_id="m-2"), marker=entry).outcome == "duplicate"
    assert counter(store) == 1


# -- what the trigger hands the function -------------------------------------------------------
def test_the_view_is_read_from_what_the_worker_decodes():
    """The worker's own converter turns the host's trigger metadata into a QueueMessage."""
    metadata = {"Id": Datum("5f0c", "string"), "DequeueCount": Datum("3", "json"),
                "InsertionTime": Datum('"2026-12-05T06:16:55Z"', "json"),
                "ExpirationTime": Datum('"9999-12-31T23:59:59Z"', "json"),
                "NextVisibleTime": Datum('"2026-12-05T06:17:25Z"', "json"),
                "PopReceipt": Datum("AgAAAA==", "string")}
    decoded = func.queue.QueueMessageInConverter.decode(Datum('{"a":1}', "string"),
                                                       trigger_metadata=metadata)
    view = QueueMessageView.of(decoded)
    assert (view.message_id, view.body, view.dequeue_count) == ("5f0c", b'{"a":1}', 3)
    assert view.insertion_time.isoformat() == "2026-12-05T06:16:55+00:00"
    assert view.pop_receipt == "AgAAAA=="


def test_the_view_of_an_sdk_message():
    from azure.storage.queue import QueueMessage

    sdk = QueueMessage(content='{"a":1}')
    sdk.id, sdk.dequeue_count, sdk.pop_receipt = "x", 2, "r"
    view = QueueMessageView.of(sdk)
    assert (view.message_id, view.body, view.dequeue_count) == ("x", b'{"a":1}', 2)


def test_a_body_too_large_for_one_envelope_is_cut_and_says_so():
    body = ('"' * 60_000).encode()  # every quote is escaped: twice its size in JSON
    text = poison_envelope(message(body), consumer="c", reason="PayloadTooLarge", detail="big")
    assert len(text.encode()) <= MAX_POISON_TEXT_BYTES
    envelope = read_envelope(text)
    assert envelope["bodyTruncated"] is True and envelope["bodyBytes"] == 60_000
    assert len(envelope["body"]) > 20_000 and len(envelope["bodySha256"]) == 64
    binary = read_envelope(poison_envelope(message(b"\x00\xff"), consumer="c", reason="r",
                                           detail=""))
    assert binary["bodyBase64"] == "AP8="


def test_constructor_refuses_what_cannot_work(store):
    with pytest.raises(ValueError, match="consumer name"):
        StorageQueueConsumer("no spaces", Idempotency(store), poison=PoisonQueue())
    with pytest.raises(ValueError, match="maxDequeueCount"):
        StorageQueueConsumer("c", Idempotency(store), poison=PoisonQueue(), max_dequeue_count=0)
    with pytest.raises(ValueError, match="poison"):
        StorageQueueConsumer("c", Idempotency(store), poison=None)  # pyright: ignore[reportArgumentType] - what an untyped caller may pass


def test_a_sync_consumer_refuses_an_async_poison_client(store):
    consumer = StorageQueueConsumer("c", Idempotency(store), poison=AsyncPoisonQueue())
    with pytest.raises(TypeError, match="AsyncStorageQueueConsumer"):
        run(consumer, message(b"{"))


# -- the async variant ----------------------------------------------------------------------------
def test_the_async_variant_follows_the_same_rules():
    async def scenario() -> None:
        inner = FlakyStore()
        poison = AsyncPoisonQueue()
        consumer = AsyncStorageQueueConsumer(
            "order-audit", aio.Idempotency(AsyncInMemoryIdempotencyStore(inner)), poison=poison,
            max_dequeue_count=2)

        async def build(tx, item):
            current = await tx.read("counter")
            body = {"n": (current.body["n"] if current else 0) + 1}
            if current is None:
                tx.create("counter", body)
            else:
                tx.replace("counter", body, etag=current.etag)
            return None

        async def run_async(view: QueueMessageView):
            return await consumer.run_atomic(view, build, key=by_order, partition=partition)

        assert (await run_async(message(ORDER, message_id="m-1"))).outcome == "processed"
        assert (await run_async(message(ORDER, message_id="m-2"))).outcome == "duplicate"
        conflict = await run_async(message({**ORDER, "total": 1}, message_id="m-3"))
        assert conflict.reason == "IdempotencyKeyConflict"
        assert (await run_async(message(b"{", message_id="m-4"))).reason == "MalformedJson"
        inner.down = True
        with pytest.raises(MessageRetryError):
            await run_async(message({**ORDER, "orderId": "o-2"}, message_id="m-5"))
        last = await run_async(message({**ORDER, "orderId": "o-2"}, message_id="m-5",
                                       dequeue_count=2))
        assert last.reason == "MaxDequeueCountReached"
        assert [e["reason"] for e in poison.envelopes] == [
            "IdempotencyKeyConflict", "MalformedJson", "MaxDequeueCountReached"]
        inner.down = False
        assert counter(inner) == 1

        calls: list[str] = []

        async def handler(item):
            calls.append(item["orderId"])
            await asyncio.sleep(0)
            return "ok"

        two_phase = AsyncStorageQueueConsumer(
            "two-phase", aio.Idempotency(AsyncInMemoryIdempotencyStore(inner)), poison=poison)
        first = await two_phase.run(message(ORDER, message_id="m-1"), handler, key=by_order)
        again = await two_phase.run(message(ORDER, message_id="m-2"), handler, key=by_order)
        assert (first.outcome, again.outcome, calls) == ("processed", "duplicate", ["o-1"])

    asyncio.run(scenario())


def test_concurrent_copies_of_one_key_apply_the_effect_once(store, poison):
    """Two instances receive a message and the producer's retry at once: the store arbitrates."""
    consumer = StorageQueueConsumer("order-audit", Idempotency(store), poison=poison)
    barrier = threading.Barrier(8)
    results: list[str] = []

    def deliver(n: int) -> None:
        barrier.wait()
        results.append(str(run(consumer, message(ORDER, message_id=f"m-{n}")).outcome))

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["duplicate"] * 7 + ["processed"]
    assert counter(store) == 1
