"""The queue trigger's contract on a real queue: Azurite's queue service redelivers, the host
(local_stack.queue_host) deletes, releases or poisons as the Functions host does, and the
order_audit function runs in the real worker.

Every redelivery here is Azurite's: the same message id with its dequeue count raised,
after a real visibility timeout.
"""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest

from shared._triggers.queue_messages import read_envelope

pytestmark = pytest.mark.timeout(240)


def order(order_id: str | None = None, customer: str | None = None, total: float = 10.0) -> dict:
    return {"type": "OrderAccepted", "orderId": order_id or f"o-{uuid.uuid4().hex[:8]}",
            "customerId": customer or f"c-{uuid.uuid4().hex[:8]}", "currency": "EUR",
            "total": total, "lineCount": 1}


def deliveries(host, message_id: str) -> list:
    return sorted((d for d in host.stats.deliveries if d.message_id == message_id),
                  key=lambda d: d.dequeue_count)


def envelope(text: str) -> dict:
    return dict(read_envelope(base64.b64decode(text)))


def test_a_first_delivery_is_processed_and_deleted(make_rig):
    rig = make_rig()
    body = order()
    message_id = rig.send(body)
    host = rig.host()
    host.run_until_drained(timeout=60)
    assert [(d.dequeue_count, d.outcome) for d in deliveries(host, message_id)] == [(1, "deleted")]
    assert rig.trail.summary(body["customerId"])["orders"] == 1
    assert rig.trail.entry(body["customerId"], body["orderId"])["totalCents"] == 1000
    assert rig.poison_texts() == []


def test_a_failed_delivery_comes_back_from_the_queue_with_the_same_id_and_a_higher_count(make_rig):
    """The store answers 503: the function raises, the host releases the message, and the queue
    delivers it again (same id, dequeue count 2, 3, ...) until the store is back."""
    rig = make_rig(outage_after=1, outage_seconds=2.5)
    body = order()
    message_id = rig.send(body)
    host = rig.host(visibility_timeout=1.0)
    host.run_until_drained(timeout=60)
    seen = deliveries(host, message_id)
    assert seen[0].outcome == "released" and "Transient" in seen[0].exception
    assert [d.dequeue_count for d in seen] == list(range(1, len(seen) + 1))
    assert len(seen) >= 2 and seen[-1].outcome == "deleted"
    assert host.stats.redeliveries == len(seen) - 1
    assert rig.trail.summary(body["customerId"])["orders"] == 1
    assert rig.poison_texts() == []


def test_a_crash_after_the_commit_is_redelivered_after_the_visibility_timeout_and_absorbed(make_rig):
    rig = make_rig()
    body = order()
    message_id = rig.send(body)
    host = rig.host(receive_visibility=3.0,
                    crash=lambda message: message.dequeue_count == 1)
    host.run_until_drained(timeout=60)
    first, second = deliveries(host, message_id)
    assert (first.dequeue_count, first.outcome) == (1, "crashed-before-delete")
    assert (second.dequeue_count, second.outcome) == (2, "deleted")
    # Invisible for the receive's visibility timeout (Azurite counts whole seconds).
    assert second.received_at - first.received_at >= 2.0
    assert rig.trail.summary(body["customerId"])["orders"] == 1, "the redelivery was absorbed"


def test_invalid_input_goes_to_the_poison_queue_with_its_reason_on_its_first_delivery(make_rig):
    rig = make_rig()
    message_id = rig.send("{not json")
    host = rig.host()
    host.run_until_drained(timeout=60)
    assert [(d.dequeue_count, d.outcome) for d in deliveries(host, message_id)] == [(1, "deleted")]
    (text,) = rig.poison_texts()
    refused = envelope(text)
    assert (refused["reason"], refused["messageId"], refused["dequeueCount"]) == (
        "MalformedJson", message_id, 1)
    assert refused["body"] == "{not json" and refused["consumer"] == "order_audit"


def test_a_reused_order_id_with_other_content_is_refused_and_the_first_content_kept(make_rig):
    rig = make_rig()
    body = order(total=10.0)
    rig.send(body)
    rig.host().run_until_drained(timeout=60)
    reused = rig.send({**body, "total": 11.0})
    rig.host().run_until_drained(timeout=60)
    (text,) = rig.poison_texts()
    refused = envelope(text)
    assert (refused["reason"], refused["messageId"], refused["dedupKey"]) == (
        "IdempotencyKeyConflict", reused, body["orderId"])
    assert rig.trail.entry(body["customerId"], body["orderId"])["totalCents"] == 1000


def test_a_message_that_is_not_base64_goes_to_the_poison_queue_without_running(make_rig):
    rig = make_rig()
    rig.send("plain text, not base64!", encoded=False)
    host = rig.host()
    host.run_until_drained(timeout=60)
    assert host.stats.counts["invocations"] == 0
    assert rig.poison_texts() == ["plain text, not base64!"], "the host copies the text as it is"


def test_a_message_dequeued_more_often_than_allowed_is_poisoned_without_running(make_rig):
    """What a host that crashed on a message every time leaves behind: its dequeue count is
    above maxDequeueCount at the next receive, and the host moves it without running it."""
    rig = make_rig(max_dequeue_count=2)
    message_id = rig.send(order())
    for _ in range(2):  # received and never deleted: the queue counts each
        while not list(rig.queue.receive_messages(visibility_timeout=1, max_messages=1)):
            time.sleep(0.2)
    time.sleep(1.5)
    host = rig.host(max_dequeue_count=2)
    host.run_until_drained(timeout=60)
    (seen,) = deliveries(host, message_id)
    assert (seen.dequeue_count, seen.outcome) == (3, "poisoned-unrun")
    assert host.stats.counts["invocations"] == 0
    (text,) = rig.poison_texts()
    assert json.loads(base64.b64decode(text))["type"] == "OrderAccepted", "the host's copy"


def test_on_the_last_delivery_the_consumer_poisons_with_the_reason_before_the_host_would(make_rig):
    rig = make_rig(max_dequeue_count=2, outage_after=1, outage_seconds=60)
    message_id = rig.send(order())
    host = rig.host(max_dequeue_count=2, visibility_timeout=1.0)
    host.run_until_drained(timeout=60)
    assert [(d.dequeue_count, d.outcome) for d in deliveries(host, message_id)] == [
        (1, "released"), (2, "deleted")]
    (text,) = rig.poison_texts()
    refused = envelope(text)
    assert refused["reason"] == "MaxDequeueCountReached" and refused["dequeueCount"] == 2
    assert refused["detail"].startswith("Transient: simulated store outage")


def test_an_app_that_allows_more_deliveries_than_the_host_leaves_a_reasonless_host_copy(make_rig):
    """Why QUEUE_MAX_DEQUEUE_COUNT must be the host's maxDequeueCount: the host poisons first,
    copying the body with no reason and a new id."""
    rig = make_rig(max_dequeue_count=3, outage_after=1, outage_seconds=60)
    message_id = rig.send(order())
    host = rig.host(max_dequeue_count=2, visibility_timeout=1.0)
    host.run_until_drained(timeout=60)
    assert [d.outcome for d in deliveries(host, message_id)] == ["released", "poisoned-by-host"]
    (text,) = rig.poison_texts()
    assert json.loads(base64.b64decode(text))["type"] == "OrderAccepted"
    with pytest.raises(ValueError):
        envelope(text)


def test_the_async_consumer_on_the_async_table_store_and_an_async_poison_client(stack,
                                                                                 queue_service):
    """The async variant on real parts: the async Table store on Azurite, and the aio queue client
    writing the envelope to Azurite's queue service."""
    import asyncio

    from azure.data.tables import TableServiceClient
    from azure.storage.queue import TextBase64EncodePolicy
    from azure.storage.queue.aio import QueueClient as AsyncQueueClient

    from shared import aio
    from shared._backends.table_aio import AsyncTableIdempotencyStore
    from shared._triggers.queue_messages import QueueMessageView
    from shared._triggers.queues import AsyncStorageQueueConsumer

    table = f"t{uuid.uuid4().hex[:16]}"
    tables = TableServiceClient.from_connection_string(stack.table_connection_string)
    tables.create_table(table)
    poison_name = f"audit-{uuid.uuid4().hex[:8]}-poison"

    async def scenario() -> list[str]:
        store = AsyncTableIdempotencyStore.from_connection_string(stack.table_connection_string,
                                                                   table_name=table)
        poison = AsyncQueueClient.from_connection_string(
            queue_service, poison_name, message_encode_policy=TextBase64EncodePolicy())
        await poison.create_queue()
        consumer = AsyncStorageQueueConsumer("order_audit", aio.Idempotency(store), poison=poison)

        async def build(tx, item):
            current = await tx.read("summary")
            tx.upsert("summary", {"orders": (current.body["orders"] if current else 0) + 1})

        body = json.dumps(order(order_id="o-1", customer="c-1")).encode()
        outcomes = []
        for message_id, raw in (("m-1", body), ("m-2", body), ("m-3", b"{")):
            decision = await consumer.run_atomic(QueueMessageView(message_id, raw), build,
                                                 key=lambda item: item["orderId"],
                                                 partition="customer-c-1")
            outcomes.append(decision.outcome or decision.reason)
        summary = await store.read_document("customer-c-1", "summary")
        assert summary.body["orders"] == 1
        texts = [m.content async for m in poison.receive_messages()]
        assert [envelope(t)["reason"] for t in texts] == ["MalformedJson"]
        await poison.delete_queue()
        await poison.close()
        await store.close()
        return outcomes

    try:
        assert asyncio.run(scenario()) == ["processed", "duplicate", "MalformedJson"]
    finally:
        tables.delete_table(table)
