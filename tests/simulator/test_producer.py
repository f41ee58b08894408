"""The producer CLI's message construction and send loops, without a broker."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from producer.__main__ import main as producer_main
from producer.messages import event_data, send_workload, service_bus_message
from simulator.workload import generate


@pytest.fixture
def workload():
    return generate(seed=11, messages=400, events=300, duplicate_rate=0.5, run_id="prod1")


def test_orders_use_the_order_id_as_message_id(workload):
    order = next(i for i in workload.items if i.kind == "order" and i.expect == "effect")
    message = service_bus_message(order)
    assert message.message_id == order.key == json.loads(order.body)["orderId"]
    assert message.content_type == "application/json"
    assert message.correlation_id == f"corr-{order.key}"
    assert b"".join(message.body) == order.body_bytes


def test_conflicting_variant_reuses_the_message_id_with_another_body(workload):
    conflict = next(i for i in workload.items if i.expect == "conflict" and i.kind == "order")
    original = next(i for i in workload.items if i.key == conflict.key and i.variant == 0)
    a, b = service_bus_message(original), service_bus_message(conflict)
    assert a.message_id == b.message_id and b"".join(a.body) != b"".join(b.body)


def test_structured_and_binary_cloudevents(workload):
    structured = next(i for i in workload.event_items if not i.properties)
    event = event_data(structured)
    assert event.content_type == "application/cloudevents+json"
    envelope = json.loads(event.body_as_str())
    assert {"id", "source", "type", "specversion", "data"} <= set(envelope)
    binary = next(i for i in workload.event_items if i.properties)
    event = event_data(binary)
    assert event.properties["ce_id"] and event.properties["ce_source"]
    assert event.content_type == "application/json"
    with pytest.raises(ValueError):
        service_bus_message(structured)
    with pytest.raises(ValueError):
        event_data(next(i for i in workload.items if i.kind == "order"))


class FakeBatch(list):
    def __init__(self, limit=1000):
        super().__init__()
        self.limit = limit
        self.partition_key: str | None = None

    def add_message(self, message):
        if len(self) >= self.limit:
            raise ValueError("full")
        self.append(message)

    add = add_message


class FakeSender:
    def __init__(self, log, entity, kind):
        self.log, self.entity, self.kind = log, entity, kind

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def create_message_batch(self):
        return FakeBatch(limit=30)

    def send_messages(self, batch):
        self.log[(self.kind, self.entity)].extend(batch)


class FakeServiceBus:
    def __init__(self):
        self.sent = defaultdict(list)

    def get_queue_sender(self, name):
        return FakeSender(self.sent, name, "queue")

    def get_topic_sender(self, name):
        return FakeSender(self.sent, name, "topic")


class FakeProducer:
    def __init__(self):
        self.batches = []

    def create_batch(self, partition_key=None):
        batch = FakeBatch(limit=25)
        batch.partition_key = partition_key
        return batch

    def send_batch(self, batch):
        self.batches.append(batch)


def test_send_loop_sends_every_copy_to_the_right_entity_with_the_right_partition_key(workload):
    bus, hub, slept = FakeServiceBus(), FakeProducer(), []
    log = send_workload(workload, service_bus_client=bus, event_hubs_producer=hub,
                        copies_after=400, sleep=slept.append)
    assert slept == [400]  # retries after a pause, e.g. past the duplicate-detection window
    expected = defaultdict(int)
    for _, _, item in workload.sends():
        target = ("event hubs", item.entity) if item.kind == "payment" else (
            "topic" if item.kind == "notification" else "queue", item.entity)
        expected[target] += 1
    got = {key: len(value) for key, value in bus.sent.items()}
    got[("event hubs", "payments")] = sum(len(b) for b in hub.batches)
    assert got == dict(expected)
    for batch in (b for b in hub.batches if b.partition_key is not None):
        bodies = [json.loads(e.body_as_str()) for e in batch]
        accounts = {b["accountId"] if e.properties else b["data"]["accountId"]
                    for b, e in zip(bodies, batch, strict=True)}
        assert accounts == {batch.partition_key}
    assert log.sent["first sends"] == len(workload.items)


def test_cli_dry_run_writes_the_ledger(tmp_path):
    path = tmp_path / "sent.json"
    assert producer_main(["--sent", str(path), "--dry-run", "--messages", "50", "--events", "40",
                          "--run-id", "cli1"]) == 0
    ledger = json.loads(path.read_text())
    assert ledger["runId"] == "cli1" and ledger["dryRun"] is True and ledger["hub"] == "payments"
    assert sum(item["kind"] == "payment" for item in ledger["items"]) == 40


def test_cli_refuses_to_send_without_a_connection(tmp_path):
    with pytest.raises(SystemExit):
        producer_main(["--sent", str(tmp_path / "s.json"), "--messages", "5", "--events", "0"])
