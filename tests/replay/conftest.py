"""A small world for the replay tests: the app's services on fresh real stores, the
simulator's broker for Service Bus, and a consumer loop that delivers through the
consumers the functions call (`handle(message, actions)`) and settles on that broker.

Failures are injected the way they happen: a store that is down (requests fail
before reaching it) or that applies a commit and then loses the answer, a
settlement whose lock was lost, a notification request that never reached the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from domain.notifications import HttpResponse, NotificationRetryError
from functions.services import Services, build_services
from functions.settings import COSMOS_CONTAINERS, TABLE_FOR, Settings
from replay.deadletters import EntityRef, ServiceBusDeadLetters, SimulatorDeadLetters
from replay.stores import document_lister
from replay.tool import ReplayTool, app_entities
from shared._core.exceptions import StoreRequestError, StoreUnavailableError
from shared._core.store import IdempotencyStore
from shared._flows.parking import ParkingLot
from shared._triggers.eventhubs import EventView
from simulator.faults import FakeNotificationApi, _Forwarding
from simulator.host_inputs import SentMessage, service_bus_message
from simulator.servicebus import Origin, ServiceBusNamespace
from simulator.workload import CLOUDEVENTS_JSON, Item, cloudevent_key
from tests.support.services import installing

from .sdk_client import SimulatedServiceBusClient

LOCK = 60.0
MAX_DELIVERIES = 3
WINDOW = 600.0


class Flaky(_Forwarding):
    """A real store that can be down (503: transient), refuse the app (403: the identity lost
    its data role for a while), or apply one commit and then refuse everything."""

    def __init__(self, inner: IdempotencyStore) -> None:
        super().__init__(inner)
        self.down = False
        self.forbidden = False
        self.lose_next_commit_answer = False  # the commit applies, then forbidden

    def _gate(self) -> None:
        if self.down:
            raise StoreUnavailableError("test: store down (503)", status_code=503)
        if self.forbidden:
            raise StoreRequestError("test: 403 AuthorizationPermissionMismatch", status_code=403)

    def get_record(self, *args: Any, **kwargs: Any) -> Any:
        self._gate()
        return super().get_record(*args, **kwargs)

    def put_record_if_absent(self, *args: Any, **kwargs: Any) -> Any:
        self._gate()
        return super().put_record_if_absent(*args, **kwargs)

    def replace_record_if_unchanged(self, *args: Any, **kwargs: Any) -> Any:
        self._gate()
        return super().replace_record_if_unchanged(*args, **kwargs)

    def read_document(self, *args: Any, **kwargs: Any) -> Any:
        self._gate()
        return super().read_document(*args, **kwargs)

    def write_documents(self, *args: Any, **kwargs: Any) -> Any:
        self._gate()
        return super().write_documents(*args, **kwargs)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        self._gate()
        result = super().commit(*args, **kwargs)
        if self.lose_next_commit_answer:
            self.lose_next_commit_answer, self.forbidden = False, True
            raise StoreRequestError("test: 403 after the write was applied", status_code=403)
        return result


class Api(FakeNotificationApi):
    """The fake API, plus requests that time out before reaching it, for chosen
    (channel, notification id): the client cannot tell whether it was sent."""

    unreachable: set[tuple[str, str]]

    def __init__(self, *, honours_key: bool) -> None:
        super().__init__(honours_key=honours_key)
        self.unreachable = set()

    def __call__(self, url: str, data: bytes, headers: dict[str, str]) -> HttpResponse:
        body = json.loads(data)
        if (body.get("channel"), body.get("notificationId")) in self.unreachable:
            raise NotificationRetryError("test: timed out; the request never reached the API")
        return super().__call__(url, data, headers)


class Clock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class World:
    backend: str
    run_id: str
    clock: Clock
    settings: Settings
    services: Services
    stores: dict[str, Flaky]
    api: Api
    namespace: ServiceBusNamespace
    entities: list[EntityRef]
    items: list[Item] = field(default_factory=list)
    lost_settlements: set[str] = field(default_factory=set)  # MessageIds whose settlement fails
    sequence: int = 0

    # -- producing -----------------------------------------------------------------
    def order(self, n: int, *, lines: int = 1, variant: int = 0, expect: str = "effect",
              order_id: str | None = None) -> Item:
        order_id = order_id or f"{self.run_id}-ORD-{n:03d}"
        body = {"orderId": order_id, "customerId": f"C-{n}", "currency": "EUR",
                "lines": [{"sku": f"SKU-{k}-{variant}", "quantity": 1 + k, "unitPrice": 10.0 + n}
                          for k in range(lines)]}
        item = Item("order", "orders", order_id, json.dumps(body), message_id=order_id,
                    properties={"tenant": "t1", "attempt": 1}, variant=variant, expect=expect)
        self.items.append(item)
        return item

    def notification(self, n: int) -> Item:
        message_id = f"{self.run_id}-NTF-{n:03d}"
        body = {"notificationId": message_id, "to": f"c{n}@example.org", "template": "order-accepted"}
        item = Item("notification", "notifications", message_id, json.dumps(body),
                    message_id=message_id)
        self.items.append(item)
        return item

    def payment(self, n: int, *, amount: int, kind: str = "payment.credit", variant: int = 0,
                expect: str = "effect", account: int = 0) -> Item:
        source, event_id = f"/test/{self.run_id}/payments", f"pay-{n:03d}"
        envelope = {"specversion": "1.0", "id": event_id, "source": source, "type": kind,
                    "datacontenttype": "application/json",
                    "data": {"accountId": self.account(account), "amountCents": amount}}
        item = Item("payment", self.settings.payments_hub, cloudevent_key(source, event_id),
                    json.dumps(envelope), content_type=CLOUDEVENTS_JSON, variant=variant,
                    expect=expect)
        self.items.append(item)
        return item

    def account(self, n: int = 0) -> str:
        return f"{self.run_id}-ACC-{n}"

    def send(self, item: Item) -> bool:
        sent = SentMessage(item.body_bytes, message_id=item.message_id,
                           correlation_id=f"corr-{item.key}", content_type=item.content_type,
                           application_properties=dict(item.properties) or None)
        return self.namespace.send(item.entity, sent, Origin(item.logical, 0, item.variant))

    def events(self, items: Sequence[Item]) -> list[EventView]:
        views = []
        for item in items:
            self.sequence += 1
            views.append(EventView(sequence_number=self.sequence, body=item.body_bytes,
                                      properties=dict(item.properties),
                                      content_type=item.content_type, offset=str(self.sequence * 100)))
        return views

    # -- consuming -------------------------------------------------------------------
    def handlers(self) -> dict[str, Callable[..., Any]]:
        s = self.services
        return {"orders": s.orders.handle, "order_status": s.order_status.handle,
                "notify": s.notify.handle, "audit": s.audit.handle}

    def drain(self, *, max_rounds: int = 200) -> list[tuple[str, str, str]]:
        """Deliver until nothing is left: (consumer, MessageId, settlement) per delivery."""
        handlers, log = self.handlers(), []
        for _ in range(max_rounds):
            delivered = False
            for ref in self.entities:
                entity = self.namespace.entity(ref.path)
                while (delivery := entity.receive(self.clock())) is not None:
                    delivered = True
                    sent = delivery.message.sent
                    message = service_bus_message(
                        sent, delivery_count=delivery.delivery_count, lock_token=delivery.lock_token,
                        sequence_number=delivery.message.sequence_number,
                        enqueued_time=datetime.fromtimestamp(delivery.message.enqueued_at, UTC))
                    actions = _Actions(self, delivery, lost=sent.message_id in self.lost_settlements)
                    # A failed settlement fails the invocation; the lock is gone already.
                    with contextlib.suppress(RuntimeError):
                        asyncio.run(handlers[ref.consumer](message, actions))
                    log.append((ref.consumer, str(sent.message_id), actions.outcome))
            if not delivered:
                if self.namespace.active_count() == 0:
                    return log
                self.clock.advance(LOCK + 1)  # unsettled (waiting or lost locks) come back
                self.namespace.expire_locks()
        raise AssertionError("the queues did not drain")

    def process_payments(self, items: Sequence[Item], partition: str = "0") -> Any:
        return self.services.payments.process_batch(self.events(items), partition)

    # -- the tool ---------------------------------------------------------------------
    def tool(self, dead_letters: str, operator: str = "ops@example.org") -> ReplayTool:
        source = (SimulatorDeadLetters(self.namespace, self.entities) if dead_letters == "simulator"
                  else ServiceBusDeadLetters(SimulatedServiceBusClient(self.namespace, self.clock),
                                             self.entities, duplicate_detection_window=WINDOW,
                                             max_wait_time=0.0))
        parked = self.services.stores["parked"]
        parking = ParkingLot(parked, telemetry=self.services.telemetry, clock=self.clock,
                             lister=document_lister(parked))
        return ReplayTool(self.services, parking, source, operator=operator, clock=self.clock)

    # -- effects, read from the stores and the API --------------------------------------
    def order_document(self, order_id: str) -> Any:
        from shared._core.keys import store_safe_id

        return self.services.stores["orders"].read_document(store_safe_id(order_id),
                                                            store_safe_id(order_id))

    def balance(self, account: int = 0) -> int:
        from shared._core.keys import store_safe_id

        document = self.services.stores["ledger"].read_document(
            store_safe_id(self.account(account)), "balance")
        return 0 if document is None else int(document.body["balanceCents"])

    def api_calls(self, channel: str, notification_id: str) -> int:
        return sum(1 for c in self.api.calls
                   if c.channel == channel and c.notification_id == notification_id)

    def dead_lettered(self) -> dict[str, list[str]]:
        letters: dict[str, list[str]] = defaultdict(list)
        for ref in self.entities:
            for m in self.namespace.entity(ref.path).dead_letters:
                letters[ref.consumer].append(f"{m.sent.message_id}:{m.dead_letter_reason}")
        return dict(letters)


class _Actions:
    """ServiceBusMessageActions on the simulated broker, for one delivery."""

    def __init__(self, world: World, delivery: Any, *, lost: bool) -> None:
        self.world, self.delivery, self.lost = world, delivery, lost
        self.outcome = "unsettled"

    def _settle(self, action: str, *args: Any) -> None:
        entity, token, now = self.delivery.entity, self.delivery.lock_token, self.world.clock()
        if self.lost:  # the lock was lost before the settlement reached the broker
            entity.take_lock_back(token)
            self.outcome = "lock lost"
            raise RuntimeError("test: MessageLockLostError")
        getattr(entity, action)(token, now, *args)
        self.outcome = action if action != "deadletter" else f"deadletter ({args[0]})"

    def complete(self, message: Any) -> None:
        self._settle("complete")

    def abandon(self, message: Any) -> None:
        self._settle("abandon")

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self._settle("deadletter", deadletter_reason, deadletter_error_description)


def app_store_factory(make_store: Callable[..., IdempotencyStore], backend: str
                      ) -> tuple[Callable[[str], IdempotencyStore], dict[str, Flaky]]:
    """Fresh stores by role, placed as `functions.services.real_stores` places them."""
    by_role: dict[str, Flaky] = {}
    by_table: dict[str, Flaky] = {}

    def factory(role: str) -> IdempotencyStore:
        if role not in by_role:
            if backend == "cosmos" and role in COSMOS_CONTAINERS:
                by_role[role] = Flaky(make_store("cosmos", partition_key_path=COSMOS_CONTAINERS[role]))
            else:
                table = TABLE_FOR[role]
                if table not in by_table:
                    by_table[table] = Flaky(make_store("table"))
                by_role[role] = by_table[table]
        return by_role[role]

    return factory, by_role


@pytest.fixture
def make_world(stack, make_store):
    """Worlds on fresh stores; the functions run on the last one built's services
    (`functions.services.use_services`), as the Functions host's process would have them."""

    with installing() as use:
        def build(backend: str, *, honours_key: bool = False) -> World:
            clock = Clock()
            run_id = f"rp{uuid.uuid4().hex[:6]}"
            env = {
                "DEDUP_BACKEND": backend,
                "TABLE_CONNECTION_STRING": stack.table_connection_string,
                "COSMOS_ENDPOINT": stack.cosmos_endpoint, "COSMOS_KEY": stack.cosmos_key,
                "COSMOS_VERIFY_TLS": "true" if stack.cosmos_verify else "false",
                "NOTIFICATION_API_URL": "http://notifications.test.invalid/send",
                "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY": "true" if honours_key else "false",
                "PAYMENTS_HUB_NAME": f"payments-{run_id}",
                "SERVICEBUS_LOCK_DURATION_SECONDS": str(int(LOCK)),
                "SERVICEBUS_MAX_DELIVERY_COUNT": str(MAX_DELIVERIES),
            }
            settings = Settings.from_env(env)
            factory, stores = app_store_factory(make_store, backend)
            api = Api(honours_key=honours_key)
            services = build_services(settings, stores=factory, sender=api, clock=clock,
                                      sleep=lambda _: None)
            namespace = ServiceBusNamespace(clock, lock_duration=LOCK, max_delivery_count=MAX_DELIVERIES,
                                            duplicate_detection_window=WINDOW)
            namespace.create_queue("orders")
            namespace.create_queue("order-status")
            namespace.create_topic("notifications", ["notify", "audit"])
            return World(backend, run_id, clock, settings, use(services), stores, api, namespace,
                         app_entities(env))

        yield build
