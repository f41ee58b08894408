"""The mixed workload: what producers send, with duplicates, conflicts and bad input.

One seeded generator serves the simulator and the producer CLI, so the
invariant checker reads the same ledger (`sent.json`) either way:

* **orders** (queue `orders`, MessageId = order id), a few reusing an earlier
  order id with different content (a key conflict: must be dead-lettered)
  and a few malformed (must be dead-lettered with a reason);
* **order status** events (queue `order-status`), full state with a version,
  some sent out of order;
* **notifications** (topic `notifications`, subscriptions notify and audit);
* **payments**: CloudEvents on the `payments` event hub, structured and
  binary mode, most with the account as partition key, a few reusing a
  source+id with another amount (must be parked) and a few invalid;
* **hostile input** (`Item.case` names it), once per case in every workload
  of 50 messages / 50 events or more: bodies nested 5,000 deep, NaN and
  Infinity in hashed fields, lone surrogates (escaped in the JSON) in ids and
  fields, integers past 2^53 and 2^63, a float that overflows, missing keys,
  for every Service Bus consumer and for payments in both CloudEvents modes;
  with `oversize_bytes`, one order and one payment event of that size. Each
  must be rejected with a reason on its first delivery (`expect` names the
  reason the product is expected to give; the checker accepts any rejection
  reason, see `simulator.check.is_operational`).

Each logical message may get producer-retry copies: some right after the
first send (inside Service Bus' duplicate-detection window, so the broker
drops them), most later (a producer that retried after a restart; the
consumer must absorb them).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from simulator.faults import stable_seed

LEDGER_FORMAT = "idempotent-consumer/sent/1"
CLOUDEVENTS_JSON = "application/cloudevents+json"


@dataclass
class Item:
    """One logical message as the producer sends it (one ledger entry)."""

    kind: str  # order, order_status, notification, payment
    entity: str  # queue, topic or event hub name
    key: str  # the logical id: MessageId, or '["source","id"]' for a CloudEvent
    body: str  # UTF-8 text of the body
    message_id: str | None = None
    content_type: str | None = "application/json"
    properties: dict[str, Any] = field(default_factory=dict)
    partition_key: str | None = None
    variant: int = 0  # > 0: another body under a key already used (a conflict)
    expect: str = "effect"  # effect | deadletter:<Reason> | park:<Reason> | conflict
    case: str | None = None  # the hostile-input case, e.g. "deep-nesting" (None: ordinary)
    copies: list[float] = field(default_factory=list)  # delays of producer-retry copies
    at: float = 0.0  # virtual seconds after the start of the run

    @property
    def body_bytes(self) -> bytes:
        return self.body.encode("utf-8")

    @property
    def body_sha256(self) -> str:
        return hashlib.sha256(self.body_bytes).hexdigest()

    @property
    def logical(self) -> str:
        """The harness id of the logical message (what dedup must see once)."""
        return f"{self.kind}:{self.key}"

    @property
    def invalid(self) -> bool:
        """Input that can never succeed: it must be rejected (dead-lettered or parked)."""
        return self.expect.startswith(("deadletter:", "park:"))

    def json_body(self) -> Any:
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):  # hostile bodies: malformed or nested too deep
            return None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, [], {})
                or k in ("variant",)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Item:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**fields)


@dataclass
class Workload:
    run_id: str
    seed: int
    items: list[Item]
    duration: float  # virtual seconds over which the first copies are sent
    duplicate_detection_window: float

    def by_kind(self, kind: str) -> list[Item]:
        return [i for i in self.items if i.kind == kind]

    @property
    def service_bus_items(self) -> list[Item]:
        return [i for i in self.items if i.kind != "payment"]

    @property
    def event_items(self) -> list[Item]:
        return self.by_kind("payment")

    def sends(self) -> list[tuple[float, int, Item]]:
        """(virtual time, copy number, item) for every send, in time order."""
        plan = [(item.at, 0, item) for item in self.items]
        plan += [(item.at + delay, n, item) for item in self.items
                 for n, delay in enumerate(item.copies, start=1)]
        plan.sort(key=lambda entry: (entry[0], entry[1]))
        return plan

    def ledger(self, **extra: Any) -> dict[str, Any]:
        return {"format": LEDGER_FORMAT, "runId": self.run_id, "seed": self.seed,
                **extra, "items": [item.to_json() for item in self.items]}


def load_ledger(data: dict[str, Any]) -> tuple[dict[str, Any], list[Item]]:
    if data.get("format") != LEDGER_FORMAT:
        raise ValueError(f"not a sent ledger ({LEDGER_FORMAT!r} expected)")
    meta = {k: v for k, v in data.items() if k != "items"}
    return meta, [Item.from_json(entry) for entry in data["items"]]


def cloudevent_key(source: str, event_id: str) -> str:
    """The logical id of a CloudEvent: the JSON pair the dedup key is made of."""
    return json.dumps([source, event_id], ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class Names:
    """Entity names (the app settings' defaults)."""

    orders_queue: str = "orders"
    status_queue: str = "order-status"
    topic: str = "notifications"
    hub: str = "payments"


class _Generator:
    def __init__(self, seed: int, run_id: str, duplicate_rate: float, window: float,
                 names: Names) -> None:
        self.rng = random.Random(stable_seed("workload", seed))
        self.run_id = run_id
        self.duplicate_rate = max(0.0, min(duplicate_rate, 1.0))
        self.window = window
        self.names = names

    def copies(self) -> list[float]:
        """Producer-retry copies of one message: most late (past the broker's window)."""
        if self.rng.random() >= self.duplicate_rate * 0.45:
            return []
        count = 2 if self.rng.random() < 0.1 else 1
        delays = []
        for _ in range(count):
            if self.rng.random() < 1 / 3:
                delays.append(round(self.rng.uniform(0.5, 5.0), 3))  # retried at once
            else:
                delays.append(round(self.window + self.rng.uniform(1.0, self.window), 3))
        return sorted(delays)

    # -- Service Bus ---------------------------------------------------------------------
    def order(self, n: int) -> Item:
        order_id = f"{self.run_id}-ORD-{n:06d}"
        body = {"orderId": order_id, "customerId": f"C-{self.rng.randint(1, 500):04d}",
                "currency": self.rng.choice(("EUR", "USD", "GBP")),
                "lines": [{"sku": f"SKU-{self.rng.randint(1, 999):03d}",
                           "quantity": self.rng.randint(1, 5),
                           "unitPrice": round(self.rng.uniform(1, 200), 2)}
                          for _ in range(self.rng.randint(1, 4))]}
        return Item("order", self.names.orders_queue, order_id, json.dumps(body),
                    message_id=order_id, copies=self.copies())

    def conflicting(self, original: Item) -> Item:
        body = json.loads(original.body)
        body["lines"] = [*body["lines"], {"sku": "SKU-CONFLICT", "quantity": 1, "unitPrice": 1.0}]
        return Item(original.kind, original.entity, original.key, json.dumps(body),
                    message_id=original.message_id, variant=1, expect="conflict",
                    copies=self.copies())

    def bad_order(self, n: int) -> Item:
        order_id = f"{self.run_id}-BAD-{n:06d}"
        choice = self.rng.randrange(3)
        if choice == 0:
            body, reason = '{"orderId": "' + order_id + '", "lines": [', "MalformedJson"
        elif choice == 1:
            body = json.dumps({"orderId": order_id + "-other", "customerId": "C-1",
                               "lines": [{"sku": "A", "quantity": 1, "unitPrice": 1}]})
            reason = "OrderIdMismatch"
        else:
            body = json.dumps({"orderId": order_id, "customerId": "C-1", "lines": []})
            reason = "InvalidOrder"
        return Item("order", self.names.orders_queue, order_id, body, message_id=order_id,
                    expect=f"deadletter:{reason}", copies=self.copies())

    def status(self, order_id: str, version: int) -> Item:
        states = ("accepted", "paid", "packed", "shipped", "delivered")
        body = {"orderId": order_id, "version": version, "status": states[(version - 1) % 5],
                "updatedBy": "sim"}
        message_id = f"{order_id}-v{version}"
        return Item("order_status", self.names.status_queue, message_id, json.dumps(body),
                    message_id=message_id, copies=self.copies())

    def notification(self, n: int) -> Item:
        message_id = f"{self.run_id}-NTF-{n:06d}"
        body = {"notificationId": message_id, "to": f"customer-{self.rng.randint(1, 500)}@example.org",
                "template": self.rng.choice(("order-accepted", "order-shipped", "payment-received"))}
        return Item("notification", self.names.topic, message_id, json.dumps(body),
                    message_id=message_id, copies=self.copies())

    # -- Event Hubs ----------------------------------------------------------------------
    def payment(self, n: int, accounts: int) -> Item:
        source = f"/sim/{self.run_id}/payments/{n % 4}"
        event_id = f"pay-{n:07d}"
        account = f"{self.run_id}-ACC-{self.rng.randrange(accounts):05d}"
        event_type = "payment.credit" if self.rng.random() < 0.7 else "payment.debit"
        data = {"accountId": account, "amountCents": self.rng.randint(1, 100_000)}
        key = account if self.rng.random() < 0.8 else None
        item = self._cloudevent(source, event_id, event_type, data, key)
        item.copies = self.copies()
        return item

    def _cloudevent(self, source: str, event_id: str, event_type: str, data: Any,
                    partition_key: str | None, *, binary: bool | None = None) -> Item:
        binary = self.rng.random() < 0.2 if binary is None else binary
        key = cloudevent_key(source, event_id)
        if binary:
            properties = {"ce_specversion": "1.0", "ce_id": event_id, "ce_source": source,
                          "ce_type": event_type}
            return Item("payment", self.names.hub, key, json.dumps(data), content_type="application/json",
                        properties=properties, partition_key=partition_key)
        envelope = {"specversion": "1.0", "id": event_id, "source": source, "type": event_type,
                    "datacontenttype": "application/json", "data": data}
        return Item("payment", self.names.hub, key, json.dumps(envelope),
                    content_type=CLOUDEVENTS_JSON, partition_key=partition_key)

    def conflicting_payment(self, original: Item) -> Item:
        body = json.loads(original.body)
        if "data" in body:
            body["data"] = {**body["data"], "amountCents": body["data"]["amountCents"] + 1}
        else:
            body = {**body, "amountCents": body["amountCents"] + 1}
        return Item("payment", original.entity, original.key, json.dumps(body),
                    content_type=original.content_type, properties=dict(original.properties),
                    partition_key=original.partition_key, variant=1, expect="conflict")

    def bad_payment(self, n: int) -> Item:
        source = f"/sim/{self.run_id}/payments/bad"
        event_id = f"{self.run_id}-bad-{n:06d}"
        choice = self.rng.randrange(3)
        if choice == 0:
            item = self._cloudevent(source, event_id, "payment.refund",
                                    {"accountId": "x", "amountCents": 1}, None, binary=False)
            item.expect = "park:UnknownEventType"
        elif choice == 1:
            item = Item("payment", self.names.hub, cloudevent_key(source, event_id),
                        '{"specversion": "1.0", "id": "' + event_id + '", "source": ',
                        content_type=CLOUDEVENTS_JSON, expect="park:MalformedJson")
        else:
            envelope = {"specversion": "1.0", "source": source, "type": "payment.credit",
                        "subject": event_id,  # no id, but a body of its own (matched by hash)
                        "data": {"accountId": "x", "amountCents": 1}}
            item = Item("payment", self.names.hub, cloudevent_key(source, event_id),
                        json.dumps(envelope), content_type=CLOUDEVENTS_JSON,
                        expect="park:MissingCloudEventAttributes")
        return item


def generate(*, seed: int, messages: int, events: int, duplicate_rate: float = 0.25,
             run_id: str | None = None, duplicate_detection_window: float = 600.0,
             duration: float | None = None, names: Names | None = None,
             invalid_rate: float = 0.004, conflict_rate: float = 0.004, hostile: bool = True,
             oversize_bytes: int = 0) -> Workload:
    """A deterministic workload of `messages` Service Bus messages and `events` events.

    With `hostile` (and at least HOSTILE_MINIMUM messages / events), every hostile-input
    case once, counted within `messages` and `events`; `oversize_bytes` > 0 adds one order
    and one payment event of that size (a real broker refuses them at send on its Standard
    tier, so the producer CLI leaves them out).
    """
    run_id = run_id or f"r{stable_seed('run', seed) % 0xFFFFFF:06x}"
    gen = _Generator(seed, run_id, duplicate_rate, duplicate_detection_window, names or Names())
    rng = gen.rng
    items: list[Item] = []

    oversize = max(0, oversize_bytes)
    hostile_sb = hostile_service_bus(gen, oversize) if hostile and messages >= HOSTILE_MINIMUM else []
    hostile_eh = hostile_payments(gen, oversize) if hostile and events >= HOSTILE_MINIMUM else []
    hostile_count = Counter(item.kind for item in hostile_sb)
    n_status = round(messages * 0.25)
    n_notify = round(messages * 0.35)
    n_orders_total = messages - n_status - n_notify
    n_status -= hostile_count["order_status"]
    n_notify -= hostile_count["notification"]
    n_bad = max(1, round(n_orders_total * invalid_rate)) if messages >= 50 else 0
    n_conflicts = max(1, round(n_orders_total * conflict_rate)) if messages >= 50 else 0
    n_orders = max(0, n_orders_total - n_bad - n_conflicts - hostile_count["order"])
    orders = [gen.order(n) for n in range(n_orders)]
    items += orders
    conflict_sources = rng.sample(orders, min(n_conflicts, len(orders)))
    items += [gen.conflicting(original) for original in conflict_sources]
    items += [gen.bad_order(n) for n in range(n_bad)]
    status_orders = [o.key for o in orders] or [f"{run_id}-ORD-X"]
    versions: dict[str, int] = {}
    for _ in range(n_status):
        order_id = rng.choice(status_orders[: max(1, len(status_orders) // 3)])
        versions[order_id] = versions.get(order_id, 0) + 1
        items.append(gen.status(order_id, versions[order_id]))
    items += [gen.notification(n) for n in range(n_notify)]

    n_bad_events = max(1, round(events * invalid_rate)) if events >= 50 else 0
    n_event_conflicts = max(1, round(events * conflict_rate)) if events >= 50 else 0
    n_payments = max(0, events - n_bad_events - n_event_conflicts - len(hostile_eh))
    accounts = max(4, n_payments // 40)
    payments = [gen.payment(n, accounts) for n in range(n_payments)]
    items += payments
    items += [gen.conflicting_payment(p) for p in rng.sample(payments, min(n_event_conflicts,
                                                                         len(payments)))]
    items += [gen.bad_payment(n) for n in range(n_bad_events)]
    items += hostile_sb + hostile_eh

    # Spread the first sends evenly over the run in a seeded order; a conflicting variant
    # goes after its original, and status versions mostly in order (a few swapped).
    rng.shuffle(items)
    items.sort(key=lambda item: (item.variant,))
    total = len(items) or 1
    duration = duration if duration is not None else 3600.0
    originals_first = [i for i in items if i.variant == 0] + [i for i in items if i.variant > 0]
    for index, item in enumerate(originals_first):
        item.at = round(index * duration / total, 3)
    _order_status_versions(originals_first, rng)
    return Workload(run_id, seed, originals_first, duration, duplicate_detection_window)


def _order_status_versions(items: list[Item], rng: random.Random) -> None:
    """Send each order's status versions in order of version, except a few swapped pairs."""
    by_order: dict[str, list[Item]] = {}
    for item in items:
        if item.kind == "order_status" and not item.invalid:
            by_order.setdefault(json.loads(item.body)["orderId"], []).append(item)
    for group in by_order.values():
        times = sorted(item.at for item in group)
        group.sort(key=lambda item: json.loads(item.body)["version"])
        if len(group) > 1 and rng.random() < 0.1:
            times[0], times[1] = times[1], times[0]
        for item, at in zip(group, times, strict=True):
            item.at = at


# -- hostile input ---------------------------------------------------------------------------
HOSTILE_MINIMUM = 100  # messages / events below which a workload carries no hostile cases
DEEP = "[" * 5000 + "]" * 5000  # 10,000 bytes: a RecursionError for a recursive decoder
LONE_SURROGATE = "\ud800"  # json.dumps escapes it as \\ud800: valid UTF-8 bytes on the wire
_RAW = "__raw_json_%d__"


def _json_with(value: Any, **raw: str) -> str:
    """JSON text of `value` in which the strings `__raw_json_<n>__` named in `raw` are
    replaced by raw JSON text (deep nesting, 1e400): what no encoder writes on purpose."""
    text = json.dumps(value)  # NaN / Infinity come out as the bare words; surrogates escaped
    for name, replacement in raw.items():
        text = text.replace(json.dumps(name), replacement)
    return text


def _padded(value: dict[str, Any], size: int) -> str:
    """`value` as JSON with a `padding` string that brings it to `size` bytes."""
    text = json.dumps({**value, "padding": ""})
    return json.dumps({**value, "padding": "x" * max(0, size - len(text))})


def hostile_service_bus(gen: _Generator, oversize_bytes: int = 0) -> list[Item]:
    """Hostile orders, order-status events and notifications, one per case."""
    run, names = gen.run_id, gen.names
    items: list[Item] = []

    def add(kind: str, entity: str, case: str, reason: str, body: str, key: str) -> None:
        copies = gen.copies() if case != "oversize" else []
        items.append(Item(kind, entity, key, body, message_id=key, expect=f"deadletter:{reason}",
                          case=case, copies=copies))

    def order(n: int, **fields: Any) -> tuple[str, dict[str, Any]]:
        order_id = f"{run}-HOS-O-{n:03d}"
        line = {"sku": "SKU-001", "quantity": 1, "unitPrice": 1.5}
        line.update({k[5:]: v for k, v in fields.items() if k.startswith("line_")})
        body = {"orderId": order_id, "customerId": "C-0001", "currency": "EUR", "lines": [line]}
        body.update({k: v for k, v in fields.items() if not k.startswith("line_")})
        return order_id, body

    orders: list[tuple[str, str, Any, dict[str, str]]] = [
        ("deep-nesting", "TooDeeplyNested", None, {}),
        ("deep-nesting-in-field", "TooDeeplyNested", {"lines": _RAW % 0}, {_RAW % 0: DEEP}),
        ("nan", "InvalidNumber", {"line_unitPrice": float("nan")}, {}),
        ("infinity", "InvalidNumber", {"line_unitPrice": float("inf")}, {}),
        ("float-overflow", "NumberOutOfRange", {"line_unitPrice": _RAW % 0}, {_RAW % 0: "1e400"}),
        ("surrogate-in-id", "InvalidText", "surrogate-id", {}),
        ("surrogate-in-field", "InvalidText", {"customerId": "C-" + LONE_SURROGATE}, {}),
        ("int-2^53+1", "NumberOutOfRange", {"line_quantity": 2**53 + 1}, {}),
        ("int-10^30", "NumberOutOfRange", {"line_quantity": 10**30}, {}),
        ("int-2^63", "NumberOutOfRange", {"line_quantity": 2**63}, {}),
        ("missing-keys", "InvalidOrder", "missing", {}),
    ]
    for n, (case, reason, fields, raw) in enumerate(orders):
        order_id, body = order(n)
        if case == "deep-nesting":
            text = DEEP
        elif fields == "surrogate-id":
            text = json.dumps({**body, "orderId": order_id + LONE_SURROGATE})
        elif fields == "missing":
            text = json.dumps({"orderId": order_id})
        else:
            order_id, body = order(n, **fields)
            text = _json_with(body, **raw)
        add("order", names.orders_queue, case, reason, text, order_id)
    if oversize_bytes:
        order_id, body = order(len(orders))
        add("order", names.orders_queue, "oversize", "PayloadTooLarge",
            _padded(body, oversize_bytes), order_id)

    def status(n: int) -> tuple[str, dict[str, Any]]:
        message_id = f"{run}-HOS-S-{n:03d}"  # its own order id: an effect would be visible
        return message_id, {"orderId": message_id, "version": 1, "status": "paid", "updatedBy": "sim"}

    status_cases: list[tuple[str, str, Any]] = [
        ("deep-nesting", "TooDeeplyNested", None),
        ("nan", "InvalidNumber", {"version": float("nan")}),
        ("surrogate-in-field", "InvalidText", {"updatedBy": "sim" + LONE_SURROGATE}),
        ("int-2^63", "NumberOutOfRange", {"version": 2**63}),
        ("missing-keys", "InvalidStatusEvent", "missing")]
    for n, (case, reason, change) in enumerate(status_cases):
        message_id, body = status(n)
        text = (DEEP if change is None else json.dumps({"orderId": message_id})
                if change == "missing" else json.dumps({**body, **change}))
        add("order_status", names.status_queue, case, reason, text, message_id)

    notification_cases: list[tuple[str, str, Any]] = [
        ("deep-nesting", "TooDeeplyNested", None),
        ("nan", "InvalidNumber", {"priority": float("nan")}),
        ("surrogate-in-field", "InvalidText", {"to": "customer" + LONE_SURROGATE + "@example.org"}),
        ("not-an-object", "MalformedJson", "list")]
    for n, (case, reason, change) in enumerate(notification_cases):
        message_id = f"{run}-HOS-N-{n:03d}"
        body = {"notificationId": message_id, "to": "customer-1@example.org",
                "template": "order-accepted"}
        text = (DEEP if change is None else json.dumps([body]) if change == "list"
                else json.dumps({**body, **change}))
        add("notification", names.topic, case, reason, text, message_id)
    return items


def hostile_payments(gen: _Generator, oversize_bytes: int = 0) -> list[Item]:
    """Hostile payment events, structured and binary CloudEvents, one per case."""
    run = gen.run_id
    source = f"/sim/{run}/payments/hostile"
    account = f"{run}-ACC-HOSTILE"  # an account no valid event touches
    items: list[Item] = []

    def add(n: int, case: str, reason: str, body: str, properties: dict[str, Any] | None = None,
            content_type: str = CLOUDEVENTS_JSON) -> None:
        event_id = f"{run}-hos-{n:03d}"  # the key is the harness's: the body may hold another id
        copies = gen.copies() if "oversize" not in case else []
        items.append(Item("payment", gen.names.hub, cloudevent_key(source, event_id), body,
                          content_type=content_type, properties=properties or {},
                          expect=f"park:{reason}", case=case, copies=copies))

    def envelope(n: int, **attributes: Any) -> dict[str, Any]:
        value = {"specversion": "1.0", "id": f"{run}-hos-{n:03d}", "source": source,
                 "type": "payment.credit", "datacontenttype": "application/json",
                 "data": {"accountId": account, "amountCents": 100}}
        value.update(attributes)
        return value

    # Parked events are matched to what was sent by their body's hash: no two bodies alike.
    structured: list[tuple[str, str, Any]] = [
        ("deep-nesting", "TooDeeplyNested", DEEP),
        ("deep-nesting-in-data", "TooDeeplyNested", ({"data": _RAW % 0}, {_RAW % 0: DEEP})),
        ("deep-nesting-in-extension", "TooDeeplyNested",
         ({"traceext": _RAW % 0}, {_RAW % 0: DEEP})),
        ("nan", "InvalidNumber", ({"data": {"accountId": account, "amountCents": float("nan")}}, {})),
        ("float-overflow", "NumberOutOfRange",
         ({"data": {"accountId": account, "amountCents": _RAW % 0}}, {_RAW % 0: "1e400"})),
        ("surrogate-in-id", "InvalidText", ({"id": f"{run}-hos-id" + LONE_SURROGATE}, {})),
        ("surrogate-in-account", "InvalidText",
         ({"data": {"accountId": account + LONE_SURROGATE, "amountCents": 100}}, {})),
        ("int-2^53+1", "NumberOutOfRange",
         ({"data": {"accountId": account, "amountCents": 2**53 + 1}}, {})),
        ("int-2^63", "NumberOutOfRange", ({"data": {"accountId": account, "amountCents": 2**63}}, {})),
        ("missing-data", "InvalidPayment", ({"data": None}, {})),
        ("missing-amount", "InvalidPayment", ({"data": {"accountId": account}}, {})),
    ]
    n = 0
    for case, reason, spec in structured:
        if isinstance(spec, str):
            body = spec
        else:
            attributes, raw = spec
            value = envelope(n, **attributes)
            if value["data"] is None:  # the missing-data case
                del value["data"]
            body = _json_with(value, **raw)
        add(n, f"structured:{case}", reason, body)
        n += 1
    if oversize_bytes:
        add(n, "structured:oversize", "PayloadTooLarge", _padded(envelope(n), oversize_bytes))
        n += 1

    binary: list[tuple[str, str, str, bool]] = [
        ("deep-nesting", "TooDeeplyNested", DEEP + "\n", True),
        ("infinity", "InvalidNumber",
         json.dumps({"accountId": account, "amountCents": float("inf")}), True),
        ("surrogate-in-account", "InvalidText",
         json.dumps({"accountId": account + LONE_SURROGATE, "amountCents": 100}), True),
        ("int-10^30", "NumberOutOfRange", json.dumps({"accountId": account, "amountCents": 10**30}),
         True),
        ("missing-id", "MissingCloudEventAttributes",
         json.dumps({"accountId": account, "amountCents": 100}), False),
    ]
    for case, reason, body, with_id in binary:
        properties = {"ce_specversion": "1.0", "ce_source": source, "ce_type": "payment.credit"}
        if with_id:
            properties["ce_id"] = f"{run}-hos-{n:03d}"
        add(n, f"binary:{case}", reason, body, properties, content_type="application/json")
        n += 1
    return items
