"""The functions run on the services their caller set (`functions.services.use_services`),
through the real worker: a sync function on the worker's pool thread, an `async def` one in
its task on the worker's loop; concurrent callers each with their own services, and none
of them touching the process's."""

from __future__ import annotations

import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import functions.services as services_module
from domain.payments import ACCOUNT_DOCUMENT
from functions.services import Services, build_services, use_services
from functions.settings import STORE_ROLES, Settings
from local_stack.host_data import SentEvent, SentMessage
from local_stack.worker import WorkerHost
from shared._core.keys import store_safe_id
from shared.testing import InMemoryIdempotencyStore
from simulator.faults import FakeNotificationApi

SETTINGS = {"DEDUP_BACKEND": "table", "TABLE_CONNECTION_STRING": "UseDevelopmentStorage=true",
            "NOTIFICATION_API_URL": "http://notifications.invalid/send",
            "PAYMENTS_HUB_NAME": "payments", "PAYMENTS_CONSUMER_GROUP": "payments-processor"}


def in_memory_services() -> Services:
    stores = {role: InMemoryIdempotencyStore() for role in STORE_ROLES}
    return build_services(Settings.from_env(SETTINGS), stores=stores.__getitem__,
                          sender=FakeNotificationApi(), sleep=lambda _: None)


def order(order_id: str) -> bytes:
    return json.dumps({"orderId": order_id, "customerId": "C-1", "currency": "EUR",
                       "lines": [{"sku": "A", "quantity": 1, "unitPrice": 2.5}]}).encode()


def credit(event_id: str, account: str) -> bytes:
    return json.dumps({"specversion": "1.0", "id": event_id, "source": "/ctx",
                       "type": "payment.credit",
                       "data": {"accountId": account, "amountCents": 100}}).encode()


def test_concurrent_callers_each_run_the_functions_on_their_own_services(worker: WorkerHost):
    callers = [in_memory_services() for _ in range(4)]
    ids = {id(s): f"ORD-{uuid.uuid4().hex[:8]}" for s in callers}
    start = threading.Barrier(len(callers))

    def call(services: Services) -> None:
        with use_services(services):
            start.wait()
            for n in range(3):
                order_id = f"{ids[id(services)]}-{n}"
                settled: list = []
                result = worker.invoke_service_bus("orders", SentMessage(order(order_id),
                                                                         message_id=order_id),
                                                   settle=settled.append)
                assert result.ok and settled[0].action == "complete", result.exception
            account = ids[id(services)]
            batch = worker.invoke_event_hub_batch(
                "payments", [SentEvent(credit(f"{account}-{n}", account), n) for n in range(1, 3)],
                partition_id="0")
            assert batch.ok, batch.exception

    before = services_module._services  # the process's own, if something built them
    with ThreadPoolExecutor(len(callers)) as pool:
        list(pool.map(call, callers))
    for services in callers:
        own, others = ids[id(services)], set(ids.values()) - {ids[id(services)]}
        orders = services.stores["orders"]
        for n in range(3):
            assert orders.read_document(f"{own}-{n}", f"{own}-{n}") is not None
        assert all(orders.read_document(f"{o}-0", f"{o}-0") is None for o in others)
        account = services.stores["ledger"].read_document(store_safe_id(own), ACCOUNT_DOCUMENT)
        assert account is not None and account.body["balanceCents"] == 200
    assert services_module._services is before
