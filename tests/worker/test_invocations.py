"""Every function invoked through the real worker with the data the host sends.

Invocation requests go into `azure_functions_runtime`, which decodes the
inputs with its own converters (RpcHttp, timer JSON, Event Hubs collection +
trigger metadata, Service Bus model binding data through the servicebus
extension), injects `ServiceBusMessageActions` and runs the function on its
thread pool. Settlement calls travel over gRPC to the local settlement server
and are asserted as it received them.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from domain.balance_projection import read_view
from domain.payments import ACCOUNT_DOCUMENT
from functions.services import RealAsyncStores, build_services, real_stores, use_services
from local_stack.host_data import SentEvent, SentMessage
from local_stack.settlement_server import SettlementCall
from local_stack.worker import WorkerHost
from shared import DedupKey, request_hash
from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore
from shared._backends.table_aio import AsyncTableIdempotencyStore
from shared._core.keys import store_safe_id
from tests.functions.conftest import settings_for
from tests.support.parking import parked_body
from tests.support.services import carrying_context, records
from tests.support.settlement import SettlementRecorder

SOURCE = "/payments/api"


def order(order_id: str, *, qty: int = 2) -> bytes:
    return json.dumps({"orderId": order_id, "customerId": "C-1", "currency": "EUR",
                       "lines": [{"sku": f"SKU-{n}", "quantity": qty, "unitPrice": 9.5}
                                 for n in range(2)]}).encode()


def deliver(worker: WorkerHost, function: str, body: bytes, message_id: str, *,
            delivery_count: int = 1) -> tuple[tuple[str, str | None, str | None], SettlementRecorder]:
    recorder = SettlementRecorder()
    result = worker.invoke_service_bus(function, SentMessage(body, message_id=message_id,
                                                             correlation_id="corr-w"),
                                       delivery_count=delivery_count, settle=recorder)
    assert result.ok, result.exception
    assert len(recorder.calls) <= 1
    return recorder.last, recorder


# -- Service Bus: orders ---------------------------------------------------------------------
def test_orders_first_delivery_completes_over_grpc_and_a_redelivery_writes_nothing(worker, services):
    order_id = f"ORD-{uuid.uuid4().hex[:10]}"
    (action, _, _), recorder = deliver(worker, "orders", order(order_id), order_id)
    assert action == "complete"
    assert recorder.calls[0].lock_token and recorder.calls[0].reason is None
    store = services.stores["orders"]
    first = store.read_document(order_id, order_id)
    assert first.body["total"] == 38.0 and first.body["lineCount"] == 2
    assert deliver(worker, "orders", order(order_id), order_id, delivery_count=2)[0][0] == "complete"
    assert store.read_document(order_id, order_id).etag == first.etag


class RecordingServiceBusClient:
    """The azure-servicebus client surface the dispatcher uses; keeps the real
    `ServiceBusMessage` objects each sender was given, by (kind, entity)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, object]] = []

    def get_topic_sender(self, topic_name: str) -> RecordingSender:
        return RecordingSender(self, "topic", topic_name)

    def get_queue_sender(self, queue_name: str) -> RecordingSender:
        return RecordingSender(self, "queue", queue_name)

    def close(self) -> None:
        pass


class RecordingSender:
    def __init__(self, client: RecordingServiceBusClient, kind: str, entity: str) -> None:
        self.client, self.kind, self.entity = client, kind, entity

    def close(self) -> None:
        pass

    def send_messages(self, messages: list) -> None:
        self.client.sent.extend((self.kind, self.entity, m) for m in messages)


@pytest.mark.parametrize("backend", ["cosmos", "table"])
def test_orders_sends_order_accepted_through_the_service_bus_sender_with_its_id_and_key(
        worker, stack, api, clock, backend):
    from azure.servicebus import ServiceBusMessage

    from shared._backends.dispatch import ServiceBusDispatcher
    from shared._core.outbox import outgoing_message_id

    settings = settings_for(stack, backend)
    client = RecordingServiceBusClient()
    services = build_services(settings, stores=real_stores(settings), sender=api, clock=clock,
                              sleep=lambda _: None,
                              dispatcher=ServiceBusDispatcher.from_client(
                                  client, topics=[settings.notifications_topic]))
    with use_services(services):
        order_id = f"ORD-{uuid.uuid4().hex[:10]}"
        assert deliver(worker, "orders", order(order_id), order_id)[0][0] == "complete"
        (kind, entity, message), = client.sent
        assert (kind, entity) == ("topic", settings.notifications_topic)
        assert isinstance(message, ServiceBusMessage)
        key = DedupKey("orders", order_id)
        assert message.message_id == outgoing_message_id(key, entity, 0)
        properties = {str(k): v for k, v in (message.application_properties or {}).items()}
        assert str(properties["Idempotency-Key"]).startswith(key.encoded)
        assert properties["X-Correlation-Id"] == "corr-w" and properties["type"] == "OrderAccepted"
        assert json.loads(b"".join(message.body))["orderId"] == order_id
        assert services.stores["orders"].get_record(order_id, order_id).outbox == ()
        assert deliver(worker, "orders", order(order_id), order_id, delivery_count=2)[0][0] == "complete"
        assert len(client.sent) == 1  # the redelivery finds nothing pending


def test_orders_reused_id_with_other_content_is_dead_lettered_with_reason_and_description(
        worker, services):
    order_id = f"ORD-{uuid.uuid4().hex[:10]}"
    deliver(worker, "orders", order(order_id, qty=1), order_id)
    (action, reason, description), recorder = deliver(worker, "orders", order(order_id, qty=5),
                                                      order_id)
    print(f"settlement server received: {recorder.calls[-1]!r}")
    assert (action, reason) == ("deadletter", "IdempotencyKeyConflict")
    assert description is not None
    stored = services.stores["orders"].get_record(order_id, order_id)
    hashes = re.search(r"request hash (\S+); this message has (\S+)$", description)
    assert order_id in description and hashes is not None
    assert hashes[1] == stored.request_hash and hashes[2] != stored.request_hash
    assert services.stores["orders"].read_document(order_id, order_id).body["total"] == 19.0


def test_concurrent_copies_from_many_caller_threads_create_one_order(worker, services):
    order_id = f"ORD-{uuid.uuid4().hex[:10]}"
    barrier = threading.Barrier(8)

    def copy(_: int) -> str:
        barrier.wait()
        return deliver(worker, "orders", order(order_id), order_id)[0][0]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(carrying_context(copy), range(8))) == ["complete"] * 8
    assert services.stores["orders"].read_document(order_id, order_id) is not None


def test_a_settlement_the_host_refuses_fails_the_invocation(worker, services):
    """The host cannot settle (e.g. the lock was lost): the extension raises in the function."""
    order_id = f"ORD-{uuid.uuid4().hex[:10]}"
    refused: list[SettlementCall] = []

    def lock_lost(call: SettlementCall) -> None:
        refused.append(call)
        raise RuntimeError(f"MessageLockLost: the lock {call.lock_token} expired")

    result = worker.invoke_service_bus("orders", SentMessage(order(order_id), message_id=order_id),
                                       settle=lock_lost)
    assert not result.ok and [c.action for c in refused] == ["complete"]
    assert "SettlementError" in result.exception and "MessageLockLost" in result.exception


# -- Service Bus: order_status, notify, audit -----------------------------------------------
def test_order_status_applies_newer_versions_and_dead_letters_malformed_events(worker, services):
    order_id = f"ORD-{uuid.uuid4().hex[:8]}"

    def status(version: int, state: str) -> str:
        body = json.dumps({"orderId": order_id, "version": version, "status": state}).encode()
        return deliver(worker, "order_status", body, str(uuid.uuid4()))[0][0]

    assert status(1, "accepted") == "complete" and status(2, "paid") == "complete"
    assert status(1, "accepted") == "complete"  # late and older: rejected, still completed
    safe = store_safe_id(order_id)
    assert services.stores["order-status"].read_document(safe, safe).body["status"] == "paid"
    (action, reason, _), _ = deliver(worker, "order_status", b'{"orderId": "x", "version": "2"}', "m")
    assert (action, reason) == ("deadletter", "InvalidStatusEvent")


@pytest.mark.parametrize("backend", ["table"])  # notifications use Table Storage
def test_notify_and_audit_send_once_each_and_abandon_when_the_api_fails(worker, services, api):
    message_id = f"N-{uuid.uuid4().hex[:10]}"
    body = json.dumps({"to": "a@example.com", "text": "shipped"}).encode()
    assert deliver(worker, "notify", body, message_id)[0][0] == "complete"
    assert deliver(worker, "audit", body, message_id)[0][0] == "complete"
    assert deliver(worker, "notify", body, message_id, delivery_count=2)[0][0] == "complete"
    assert sorted(api.keys()) == sorted([f"audit|{message_id}", f"notify|{message_id}"])
    assert api.requests[0][2]["X-Correlation-Id"] == "corr-w"  # from the AMQP message properties

    other = f"N-{uuid.uuid4().hex[:10]}"
    api.status = 503
    assert deliver(worker, "notify", body, other)[0][0] == "abandon"
    api.status = None
    assert deliver(worker, "notify", body, other, delivery_count=2)[0][0] == "complete"


# -- Event Hubs ----------------------------------------------------------------------------
def structured(event_id: str, account: str, cents: int) -> bytes:
    return json.dumps({"specversion": "1.0", "id": event_id, "source": SOURCE,
                       "type": "payment.credit",
                       "data": {"accountId": account, "amountCents": cents}}).encode()


def binary_mode(event_id: str, account: str, cents: int, prefix: str) -> tuple[bytes, dict]:
    """A CloudEvent whose attributes travel only in the event's properties (PropertiesArray)."""
    return (json.dumps({"accountId": account, "amountCents": cents}).encode(),
            {f"{prefix}specversion": "1.0", f"{prefix}id": event_id, f"{prefix}source": SOURCE,
             f"{prefix}type": "payment.debit"})


def balance(services, account: str) -> int | None:
    document = services.stores["ledger"].read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    return None if document is None else document.body["balanceCents"]


@pytest.fixture
def async_services(worker, stack, api, clock, backend):
    """App services whose async payments path runs on the real async stores (azure.cosmos.aio,
    azure.data.tables.aio), as in Azure; their clients live on the worker's loop."""
    settings = settings_for(stack, backend)
    services = build_services(settings, stores=real_stores(settings),
                              async_stores=RealAsyncStores(settings), sender=api, clock=clock,
                              sleep=lambda _: None)
    with use_services(services):
        yield services
    worker.run(services.aclose())


def test_payments_batch_reads_per_event_metadata_and_a_replay_changes_nothing(worker,
                                                                              async_services):
    services = async_services
    expected = AsyncCosmosIdempotencyStore if services.settings.backend == "cosmos" \
        else AsyncTableIdempotencyStore
    assert isinstance(services.async_stores["ledger"], expected)
    account, partition = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    debit, debit_props = binary_mode("d1", account, 300, "ce_")
    debit2, debit2_props = binary_mode("d2", account, 200, "cloudEvents:")
    batch = [SentEvent(structured("c1", account, 1000), 11),
             SentEvent(debit, 12, debit_props, partition_key=account),
             SentEvent(b"{broken", 13),
             SentEvent(debit2, 14, debit2_props)]

    result = worker.invoke_event_hub_batch("payments", batch, partition_id=partition)

    assert result.ok, result.exception
    assert balance(services, account) == 500  # the debits needed their own PropertiesArray entry
    hub = services.settings.payments_hub
    parked = parked_body(services.parking, "payments", f"{hub}/{partition}/13")  # SystemPropertiesArray
    assert parked["reason"] == "MalformedJson"
    assert services.payments.watermark.read(partition).sequence_number == 14  # PartitionContext
    replay = worker.invoke_event_hub_batch("payments", batch, partition_id=partition,
                                           retry_count=1, max_retry_count=-1)
    assert replay.ok and balance(services, account) == 500


class AsyncRecordingServiceBusClient:
    """The azure.servicebus.aio client surface the async dispatcher uses; keeps the real
    `ServiceBusMessage` objects each sender was given, by (kind, entity)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, object]] = []

    def get_topic_sender(self, topic_name: str) -> AsyncRecordingSender:
        return AsyncRecordingSender(self, "topic", topic_name)

    def get_queue_sender(self, queue_name: str) -> AsyncRecordingSender:
        return AsyncRecordingSender(self, "queue", queue_name)

    async def close(self) -> None:
        pass


class AsyncRecordingSender:
    def __init__(self, client: AsyncRecordingServiceBusClient, kind: str, entity: str) -> None:
        self.client, self.kind, self.entity = client, kind, entity

    async def close(self) -> None:
        pass

    async def send_messages(self, messages: list) -> None:
        self.client.sent.extend((self.kind, self.entity, m) for m in messages)


@pytest.mark.parametrize("backend", ["cosmos", "table"])
def test_payments_sends_balance_changed_through_the_async_sender_and_the_projection_applies_it(
        worker, stack, api, clock, backend):
    """Both hops through the real worker: `payments` on the real async stores publishes one
    BalanceChanged per account through the aio Service Bus dispatcher (a real
    ServiceBusMessage, with its derived id and the propagated key) before the mark moves;
    `balance_projection`, fed that message as Service Bus delivers it, writes the view once."""
    from azure.servicebus import ServiceBusMessage

    from shared._backends.dispatch_aio import ServiceBusDispatcher
    from shared._core.outbox import outgoing_message_id

    settings = settings_for(stack, backend)
    client = AsyncRecordingServiceBusClient()
    services = build_services(settings, stores=real_stores(settings),
                              async_stores=RealAsyncStores(settings), sender=api, clock=clock,
                              sleep=lambda _: None,
                              async_dispatcher=ServiceBusDispatcher.from_client(
                                  client, topics=[settings.notifications_topic]))
    scope = contextlib.ExitStack()
    scope.enter_context(use_services(services))
    try:
        account, partition = f"acct-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
        batch = [SentEvent(structured(f"bc{n}", account, 100 * n), n,
                           properties={"X-Correlation-Id": "corr-eh"}) for n in range(1, 4)]
        result = worker.invoke_event_hub_batch("payments", batch, partition_id=partition)
        assert result.ok, result.exception
        (kind, entity, message), = client.sent
        assert (kind, entity) == ("queue", settings.balance_changes_queue)
        assert isinstance(message, ServiceBusMessage)
        key = DedupKey.from_cloudevent("payments", SOURCE, "bc1")
        assert message.message_id == outgoing_message_id(key, entity, 0)
        properties = {str(k): v for k, v in (message.application_properties or {}).items()}
        assert str(properties["Idempotency-Key"]).startswith(key.encoded)
        assert properties["X-Correlation-Id"] == "corr-eh" and message.correlation_id == "corr-eh"
        assert properties["type"] == "BalanceChanged"
        body = json.loads(b"".join(message.body))
        assert body == {"type": "BalanceChanged", "accountId": account, "balanceCents": 600,
                        "version": 3, "eventIds": ["bc1", "bc2", "bc3"]}
        assert services.payments.watermark.read(partition).sequence_number == 3
        replay = worker.invoke_event_hub_batch("payments", batch, partition_id=partition,
                                               retry_count=1, max_retry_count=-1)
        assert replay.ok and len(client.sent) == 1  # covered by the mark: nothing sent again

        delivered = SentMessage(b"".join(message.body), message_id=message.message_id,
                                correlation_id=message.correlation_id,
                                application_properties=properties)
        recorder = SettlementRecorder()
        result = worker.invoke_service_bus("balance_projection", delivered, settle=recorder)
        assert result.ok, result.exception
        assert recorder.last[0] == "complete"
        assert read_view(services.stores["dedup"], account) == {
            "accountId": account, "balanceCents": 600, "version": 3, "kind": "balance-view"}
        again = SettlementRecorder()
        assert worker.invoke_service_bus("balance_projection", delivered, delivery_count=2,
                                         settle=again).ok
        assert again.last[0] == "complete"
        (action, reason, _), _ = deliver(worker, "balance_projection", b"{broken", "bad-1")
        assert (action, reason) == ("deadletter", "MalformedJson")
    finally:
        scope.close()
        worker.run(services.aclose())


# -- HTTP ----------------------------------------------------------------------------------
def post(worker: WorkerHost, body: dict | bytes, key: str | None):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    result = worker.invoke_http("http_payments", method="POST", headers=headers, body=raw)
    assert result.ok, result.exception
    return result.http


def payment(account: str, cents: int = 250) -> dict:
    return {"type": "payment.credit", "accountId": account, "amountCents": cents}


def test_http_created_then_replayed_with_the_stored_response(worker, services):
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    first = post(worker, payment(account), key)
    assert first.status == 201 and first.header("Idempotent-Replayed") is None
    assert first.json()["balanceCents"] == 250
    again = post(worker, payment(account), key)
    assert again.status == 201 and again.header("Idempotent-Replayed") == "true"
    assert again.json() == first.json()
    assert balance(services, account) == 250


def test_http_key_reused_with_another_body_is_422_in_progress_is_409_no_key_is_400(worker, services):
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    post(worker, payment(account), key)
    conflict = post(worker, payment(account, 999), key)
    assert conflict.status == 422 and conflict.header("Content-Type") == "application/problem+json"

    busy_key = str(uuid.uuid4())
    services.http_payments.endpoint.idempotency.claim(DedupKey("http-payments", busy_key),
                                             request_hash(payment(account)))
    busy = post(worker, payment(account), busy_key)
    assert busy.status == 409 and busy.header("Retry-After") == "1"

    assert post(worker, payment(account), None).status == 400
    assert post(worker, b"{nope", str(uuid.uuid4())).status == 400
    assert balance(services, account) == 250


def test_http_another_callers_key_gets_its_own_outcome_never_the_first_callers_body(worker, services):
    """Through the real worker (headers lowercased as the host sends them): B reusing A's key
    is B's own request; each caller's retry replays its own response."""
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())

    def as_caller(object_id: str, cents: int):
        headers = {"Content-Type": "application/json", "Idempotency-Key": key,
                   "X-MS-CLIENT-PRINCIPAL-IDP": "aad", "X-MS-CLIENT-PRINCIPAL-ID": object_id}
        result = worker.invoke_http("http_payments", method="POST", headers=headers,
                                    body=json.dumps(payment(account, cents)).encode())
        assert result.ok, result.exception
        return result.http

    a = as_caller("oid-a", 250)
    b = as_caller("oid-b", 250)  # A's key and A's body
    assert (a.status, b.status) == (201, 201) and b.header("Idempotent-Replayed") is None
    assert (a.json()["balanceCents"], b.json()["balanceCents"]) == (250, 500)
    c = as_caller("oid-c", 40)  # A's key, another body: processed, not 422
    assert c.status == 201 and c.json()["balanceCents"] == 540
    again = as_caller("oid-a", 250)
    assert again.header("Idempotent-Replayed") == "true" and again.json() == a.json()
    assert balance(services, account) == 540


# -- Timer -----------------------------------------------------------------------------------
def test_timer_runs_maintenance_which_parks_an_abandoned_claim(worker, services, clock):
    idem = records(services)
    stuck = DedupKey("audit", f"stuck-{uuid.uuid4().hex[:6]}")
    _, held = idem.claim(stuck, request_hash("y"))
    clock.advance(idem.config.lease.total_seconds() + services.settings.window.length.total_seconds()
                  + 1)

    result = worker.invoke_timer("maintenance", past_due=True)

    assert result.ok, result.exception
    closed = idem.store.get_record(held.partition_key, held.id)
    assert closed.state.value == "completed" and closed.result == {"parked": "StaleInProgress"}
    assert parked_body(services.parking, "audit", stuck.key)["reason"] == "StaleInProgress"
