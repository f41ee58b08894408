"""`orders`: the reference example, invoked as the worker would, against both backends."""

from __future__ import annotations

import json
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from azure.cosmos import CosmosClient, PartitionKey

from local_stack import COSMOS_LOCAL_KEY, free_port
from local_stack.servers import cosmos_server
from shared import CosmosIdempotencyStore, DedupKey, TableIdempotencyStore
from shared._backends.cosmos_indexing import record_indexing_policy
from shared._core.codec import is_record
from shared._core.keys import store_safe_id
from shared._core.records import RecordState
from shared.aio import ThreadedStore
from simulator.host_inputs import RecordingActions, SentMessage, service_bus_message
from tests.functions.conftest import function
from tests.support.services import carrying_context


def order(order_id: str, *, qty: int = 2, lines: int = 2) -> dict:
    return {"orderId": order_id, "customerId": "C-1", "currency": "EUR",
            "lines": [{"sku": f"SKU-{n}", "quantity": qty, "unitPrice": 9.5} for n in range(lines)]}


def deliver(body: bytes | dict, message_id: str | None, *, delivery_count: int = 1):
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    message = service_bus_message(SentMessage(raw, message_id=message_id, correlation_id="corr-1"),
                                  delivery_count=delivery_count)
    actions = RecordingActions()
    function("orders")(message=message, message_actions=actions)
    return actions.last


def new_id() -> str:
    return f"ORD-{uuid.uuid4().hex[:10]}"


def test_first_delivery_creates_the_order_and_its_lines_then_completes(services):
    order_id = new_id()
    assert deliver(order(order_id), order_id) == ("complete", None, None)
    store = services.stores["orders"]
    document = store.read_document(order_id, order_id)
    assert document.body["total"] == 38.0 and document.body["lineCount"] == 2
    assert is_record(document.body)  # the order document is the marker
    assert store.get_record(order_id, order_id).state is RecordState.COMPLETED
    assert store.read_document(order_id, f"{order_id}:line:002").body["sku"] == "SKU-1"


def test_redelivery_completes_without_writing_again(services):
    order_id = new_id()
    deliver(order(order_id), order_id)
    before = services.stores["orders"].read_document(order_id, order_id)
    assert deliver(order(order_id), order_id, delivery_count=2) == ("complete", None, None)
    after = services.stores["orders"].read_document(order_id, order_id)
    assert after.etag == before.etag


def test_concurrent_copies_create_one_order(services):
    order_id = new_id()
    barrier = threading.Barrier(8)

    def copy(_):
        barrier.wait()
        return deliver(order(order_id), order_id)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(carrying_context(copy), range(8)))
    assert results == [("complete", None, None)] * 8
    assert services.stores["orders"].read_document(order_id, order_id) is not None


def test_reused_order_id_with_different_content_is_dead_lettered_with_both_hashes(services, caplog):
    order_id = new_id()
    deliver(order(order_id, qty=1), order_id)
    with caplog.at_level("ERROR"):
        action, reason, description = deliver(order(order_id, qty=5), order_id)
    assert (action, reason) == ("deadletter", "IdempotencyKeyConflict")
    assert description is not None
    stored = services.stores["orders"].get_record(order_id, order_id)
    hashes = re.search(r"request hash (\S+); this message has (\S+)$", description)
    assert order_id in description and hashes is not None
    assert hashes[1] == stored.request_hash and hashes[2] != stored.request_hash
    assert any(getattr(r, "event", None) == "IdempotencyKeyConflict" for r in caplog.records)
    stored = services.stores["orders"].read_document(order_id, order_id)
    assert stored.body["total"] == 19.0  # the first order is untouched


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_store_outage_retries_without_burning_deliveries(services_for, backend, caplog):
    """A transient failure is never dead-lettered: the first delivery is abandoned (a blip
    is over by the redelivery), later ones wait for the lock, one delivery per lock duration."""
    services = services_for(backend)
    services.orders.consumer.idempotency.store = ThreadedStore(dead_store(backend))
    order_id = new_id()
    with caplog.at_level("WARNING"):
        assert deliver(order(order_id), order_id)[0] == "abandon"
        for delivery_count in range(2, 11):
            assert deliver(order(order_id), order_id, delivery_count=delivery_count)[0] == "unsettled"
    assert "transient failure" in caplog.text


def dead_store(backend: str):
    """A store whose server went away after the store was built."""
    if backend == "table":
        return TableIdempotencyStore.from_connection_string(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
            f"TableEndpoint=http://127.0.0.1:{free_port()}/devstoreaccount1;", table_name="orders",
            retry_total=0)
    server = cosmos_server(free_port())
    server.start()
    client = CosmosClient(f"https://127.0.0.1:{server.port}/", COSMOS_LOCAL_KEY,
                          connection_verify=False, retry_total=0)
    container = client.create_database_if_not_exists("d").create_container_if_not_exists(
        "orders", PartitionKey("/orderId"), indexing_policy=record_indexing_policy("/orderId"))
    server.stop()
    return CosmosIdempotencyStore.from_container(container, "/orderId")


@pytest.mark.parametrize(("body", "message_id", "reason"), [
    (b"{not json", "ORD-x", "MalformedJson"),
    (b"[1, 2]", "ORD-x", "MalformedJson"),
    ({"orderId": "ORD-y", "customerId": "C", "lines": []}, "ORD-y", "InvalidOrder"),
    ({"orderId": "ORD-z", "customerId": 5, "lines": [{"sku": "A", "quantity": 1, "unitPrice": 1}]},
     "ORD-z", "InvalidOrder"),
    ({"orderId": "ORD-q", "customerId": "C", "lines": [{"sku": "A", "quantity": "2", "unitPrice": 1}]},
     "ORD-q", "InvalidOrder"),
    ({"orderId": "ORD-other", "customerId": "C", "lines": [{"sku": "A", "quantity": 1, "unitPrice": 1}]},
     "ORD-mismatch", "OrderIdMismatch"),
    (order("ORD-none"), None, "InvalidMessageId"),
    (order("ORD-big", lines=99), "ORD-big", "OrderTooLarge"),
    (b"x" * (256 * 1024 + 1), "ORD-huge", "PayloadTooLarge"),
])
def test_bad_input_is_dead_lettered_with_a_reason(services, body, message_id, reason):
    action, got_reason, description = deliver(body, message_id)
    assert (action, got_reason) == ("deadletter", reason)
    assert description


def test_order_ids_with_characters_the_store_forbids_are_stored_safely(services):
    order_id = f"ORD/{uuid.uuid4().hex[:6]}?#\\é"
    assert deliver(order(order_id), order_id) == ("complete", None, None)
    assert deliver(order(order_id), order_id) == ("complete", None, None)
    safe = store_safe_id(order_id)
    marker = services.stores["orders"].get_record(safe, safe)
    assert marker is not None and marker.key == DedupKey("orders", order_id)


# -- the outbox: OrderAccepted to the notifications topic, committed with the order ----------
def test_the_order_accepted_message_is_sent_after_the_commit_with_a_derived_id(services):
    from shared._core.outbox import outgoing_message_id

    order_id = new_id()
    assert deliver(order(order_id), order_id) == ("complete", None, None)
    (sent,) = services.dispatcher.sent
    assert sent.destination == services.settings.notifications_topic
    assert sent.message_id == outgoing_message_id(DedupKey("orders", order_id), sent.destination, 0)
    assert json.loads(sent.body) == {"type": "OrderAccepted", "orderId": order_id,
                                     "customerId": "C-1", "currency": "EUR", "total": 38.0,
                                     "lineCount": 2}
    assert sent.properties["X-Correlation-Id"] == "corr-1"
    assert str(sent.properties["Idempotency-Key"]).startswith(DedupKey("orders", order_id).encoded)
    marker = services.stores["orders"].get_record(order_id, order_id)
    assert marker is not None and marker.outbox == ()  # recorded as dispatched


def test_a_broker_outage_after_the_commit_retries_and_the_redelivery_sends_it_once(services):
    order_id = new_id()
    services.dispatcher.fail_next()
    decision = deliver(order(order_id), order_id)
    assert decision[0] == "abandon"  # transient: never dead-lettered
    assert services.dispatcher.sent == []
    assert services.stores["orders"].get_record(order_id, order_id).outbox  # pending
    assert deliver(order(order_id), order_id, delivery_count=2) == ("complete", None, None)
    assert [m.destination for m in services.dispatcher.sent] == [services.settings.notifications_topic]
    assert deliver(order(order_id), order_id, delivery_count=3) == ("complete", None, None)
    assert len(services.dispatcher.sent) == 1  # nothing pending: not sent again


def test_a_retry_reserialised_by_another_runtime_is_a_duplicate_not_a_conflict(services):
    """JavaScript writes 10, Python 10.0 and a gateway 1e1: one order, not a reused id."""
    order_id = new_id()
    first = {**order(order_id), "lines": [{"sku": "SKU-0", "quantity": 2, "unitPrice": 10}]}
    assert deliver(first, order_id) == ("complete", None, None)
    before = services.stores["orders"].read_document(order_id, order_id)
    for price in (b"10.0", b"1e1", b"10.000"):
        raw = json.dumps({**first, "lines": [{"unitPrice": 0, "quantity": 2, "sku": "SKU-0"}]},
                         indent=2).encode().replace(b'"unitPrice": 0', b'"unitPrice": ' + price)
        assert deliver(raw, order_id, delivery_count=2) == ("complete", None, None), price
    assert services.stores["orders"].read_document(order_id, order_id).etag == before.etag


