"""`python -m simulator.check`: the checks against a real deployment (Docker emulators or
Azure), after the producer CLI sent a workload:

    python -m simulator.check --sent sent.json     # app settings from the environment
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable
from typing import Any

from simulator.check.checker import Checker
from simulator.check.evidence import DeadLetter, Evidence
from simulator.check.result import format_result
from simulator.check.stores import stores_from_settings
from simulator.workload import Item, load_ledger

SERVICE_BUS_CONSUMERS = (("orders", None, "orders"), ("order-status", None, "order_status"),
                         ("notifications", "notify", "notify"), ("notifications", "audit", "audit"))


def read_dead_letters(client: Any, items: list[Item], *,
                      entities: Iterable[tuple[str, str | None, str]] = SERVICE_BUS_CONSUMERS,
                      max_messages: int = 100_000) -> list[DeadLetter]:
    """Peek every dead-letter queue (nothing is removed) and match its messages to the ledger.

    `entities` are (queue or topic, subscription or None, consumer function name).
    """
    from azure.servicebus import ServiceBusSubQueue

    by_body: dict[tuple[str | None, bytes], Item] = {
        (item.message_id, item.body_bytes): item for item in items if item.kind != "payment"}
    letters = []
    for entity, subscription, consumer in entities:
        if subscription is None:
            receiver = client.get_queue_receiver(entity, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        else:
            receiver = client.get_subscription_receiver(entity, subscription,
                                                        sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        with receiver:
            sequence, seen = 0, 0
            while seen < max_messages:
                batch = receiver.peek_messages(max_message_count=250, sequence_number=sequence)
                if not batch:
                    break
                for message in batch:
                    seen += 1
                    sequence = max(sequence, int(message.sequence_number) + 1)
                    body = b"".join(bytes(part) for part in message.body)
                    message_id = None if message.message_id is None else str(message.message_id)
                    item = by_body.get((message_id, body))
                    if item is not None:
                        letters.append(DeadLetter(consumer, item.logical, item.variant,
                                                  str(message.dead_letter_reason or ""),
                                                  str(message.dead_letter_error_description or ""),
                                                  int(getattr(message, "delivery_count", 0) or 0)))
    return letters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.check",
        description="Read the app's stores and check the invariants for a workload the producer "
                    "CLI sent (app settings such as DEDUP_BACKEND, COSMOS_ENDPOINT, "
                    "TABLE_CONNECTION_STRING come from the environment).")
    parser.add_argument("--sent", required=True, help="the ledger written by `python -m producer`")
    parser.add_argument("--json", help="also write the result as JSON to this file")
    parser.add_argument("--in-progress", action="store_true",
                        help="fail on records still in progress (run after maintenance reconciled)")
    parser.add_argument("--servicebus-connection",
                        default=os.environ.get("SERVICEBUS_CONNECTION_STRING"),
                        help="read (peek) the dead-letter queues with this connection string")
    parser.add_argument("--servicebus-namespace",
                        help="read the dead-letter queues of this namespace (DefaultAzureCredential)")
    args = parser.parse_args(argv)
    with open(args.sent, encoding="utf-8") as handle:
        meta, items = load_ledger(json.load(handle))
    stores, hub = stores_from_settings()
    # A deployment's outbox sends through its broker to the consumers (the notification API's
    # log is not read: OrderAccepted goes unchecked; balance_projection's markers are read).
    evidence = Evidence(api_honours_key=os.environ.get(
        "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY", "true").strip().lower() not in ("false", "0", "no"),
        outbox_delivered=True)
    if args.servicebus_connection or args.servicebus_namespace:
        from azure.servicebus import ServiceBusClient

        if args.servicebus_connection:
            client = ServiceBusClient.from_connection_string(args.servicebus_connection)
        else:
            from azure.identity import DefaultAzureCredential

            client = ServiceBusClient(args.servicebus_namespace, DefaultAzureCredential())
        names = meta.get("entities", {})
        entities = ((names.get("ordersQueue", "orders"), None, "orders"),
                    (names.get("statusQueue", "order-status"), None, "order_status"),
                    (names.get("topic", "notifications"), "notify", "notify"),
                    (names.get("topic", "notifications"), "audit", "audit"))
        with client:
            evidence.dead_letters = read_dead_letters(client, items, entities=entities)
    result = Checker(items, stores, run_id=meta["runId"], hub=meta.get("hub", hub),
                     evidence=evidence).run(check_in_progress=args.in_progress)
    print(format_result(result, api_honours_key=evidence.api_honours_key))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result.to_json(), handle, indent=2)
    return 0 if result.ok else 1
