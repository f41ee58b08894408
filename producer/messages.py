"""Workload items -> SDK messages, and the send loops (clients are injected, so tests need no broker)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from azure.eventhub import EventData
from azure.servicebus import ServiceBusMessage

from simulator.workload import Item, Workload


def service_bus_message(item: Item) -> ServiceBusMessage:
    """An order, status event or notification as a Service Bus message (MessageId = business id)."""
    if item.kind == "payment":
        raise ValueError("payments go to Event Hubs")
    return ServiceBusMessage(item.body_bytes, message_id=item.message_id,
                             content_type=item.content_type, correlation_id=f"corr-{item.key}",
                             application_properties={str(k): v for k, v in item.properties.items()}
                             or None)


def event_data(item: Item) -> EventData:
    """A payment CloudEvent as Event Hubs event data (structured: JSON body; binary: ce_ properties)."""
    if item.kind != "payment":
        raise ValueError("only payments go to Event Hubs")
    event = EventData(item.body_bytes)
    if item.properties:
        event.properties = {str(k): v for k, v in item.properties.items()}
    if item.content_type:
        event.content_type = item.content_type
    return event


@dataclass
class SendLog:
    """What was handed to the brokers: counts per entity and copy kind."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, what: str, n: int = 1) -> None:
        self.sent[what] += n


def plan(workload: Workload, *, service_bus: bool = True, event_hubs: bool = True
         ) -> tuple[list[tuple[int, Item]], list[tuple[int, Item]]]:
    """(first sends, retry copies) as (copy number, item), in the workload's time order."""
    firsts, copies = [], []
    for _, copy, item in workload.sends():
        if item.kind == "payment" and not event_hubs:
            continue
        if item.kind != "payment" and not service_bus:
            continue
        (copies if copy else firsts).append((copy, item))
    return firsts, copies


def send_service_bus(client: Any, items: Iterable[Item], log: SendLog, *,
                     batch_size: int = 100) -> None:
    """Send with a `ServiceBusClient`: one sender per queue or topic, in message batches."""
    by_entity: dict[tuple[str, bool], list[Item]] = defaultdict(list)
    for item in items:
        by_entity[(item.entity, item.kind == "notification")].append(item)
    for (entity, topic), entity_items in by_entity.items():
        sender_for = client.get_topic_sender if topic else client.get_queue_sender
        with sender_for(entity) as sender:
            for start in range(0, len(entity_items), batch_size):
                chunk = entity_items[start:start + batch_size]
                batch = sender.create_message_batch()
                for item in chunk:
                    message = service_bus_message(item)
                    try:
                        batch.add_message(message)
                    except ValueError:  # batch full: send it and start another
                        sender.send_messages(batch)
                        batch = sender.create_message_batch()
                        batch.add_message(message)
                sender.send_messages(batch)
                log.add(f"service bus {entity}", len(chunk))


def send_event_hubs(producer: Any, items: Iterable[Item], log: SendLog) -> None:
    """Send with an `EventHubProducerClient`: one batch per partition key (None = round robin)."""
    by_key: dict[str | None, list[Item]] = defaultdict(list)
    for item in items:
        by_key[item.partition_key].append(item)
    for key, key_items in by_key.items():
        batch = producer.create_batch(partition_key=key) if key else producer.create_batch()
        count = 0
        for item in key_items:
            event = event_data(item)
            try:
                batch.add(event)
            except ValueError:  # batch full
                producer.send_batch(batch)
                log.add("event hubs", count)
                batch = producer.create_batch(partition_key=key) if key else producer.create_batch()
                batch.add(event)
                count = 0
            count += 1
        if count:
            producer.send_batch(batch)
            log.add("event hubs", count)


def send_workload(workload: Workload, *, service_bus_client: Any | None,
                  event_hubs_producer: Any | None, copies_after: float = 0.0,
                  sleep: Callable[[float], None] = time.sleep) -> SendLog:
    """Send every first copy, then (after `copies_after` seconds) the producer-retry copies."""
    log = SendLog()
    firsts, copies = plan(workload, service_bus=service_bus_client is not None,
                          event_hubs=event_hubs_producer is not None)
    for stage, entries in (("first", firsts), ("retry", copies)):
        if stage == "retry" and entries and copies_after > 0:
            sleep(copies_after)
        items = [item for _, item in entries]
        if service_bus_client is not None:
            send_service_bus(service_bus_client, [i for i in items if i.kind != "payment"], log)
        if event_hubs_producer is not None:
            send_event_hubs(event_hubs_producer, [i for i in items if i.kind == "payment"], log)
        log.add(f"{stage} sends", len(items))
    return log
