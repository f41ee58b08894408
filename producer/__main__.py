"""`python -m producer`: send the workload to real brokers and record it in a ledger.

    # Docker emulators (Service Bus and Event Hubs cannot run at the same time: port 5672)
    python -m producer --sent sent.json --messages 2000 --events 0 \\
        --servicebus-connection "$SERVICEBUS_CONNECTION_STRING"
    # Azure, with your Entra identity (role: Azure Service Bus/Event Hubs Data Sender)
    python -m producer --sent sent.json --servicebus-namespace mybus.servicebus.windows.net \\
        --eventhub-namespace myhub.servicebus.windows.net
    # then, once the function app has drained the queues:
    python -m simulator.check --sent sent.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

from producer.messages import send_workload
from simulator.workload import Names, generate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m producer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sent", required=True, help="write the ledger of what was sent here")
    parser.add_argument("--messages", type=int, default=2000, help="Service Bus messages (0: none)")
    parser.add_argument("--events", type=int, default=2000, help="Event Hubs events (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duplicate-rate", type=float, default=0.25,
                        help="share of messages that get producer-retry copies (0: none)")
    parser.add_argument("--copies-after", type=float, default=0.0,
                        help="seconds to wait before sending the retry copies; longer than the "
                             "duplicate-detection window (emulator 5 min, Bicep 10 min) lets them "
                             "through to the consumers")
    parser.add_argument("--run-id", help="prefix of every id (default: random), so runs never collide")
    parser.add_argument("--servicebus-connection",
                        default=os.environ.get("SERVICEBUS_CONNECTION_STRING"),
                        help="connection string (env SERVICEBUS_CONNECTION_STRING)")
    parser.add_argument("--servicebus-namespace",
                        help="fully qualified namespace, signing in with DefaultAzureCredential")
    parser.add_argument("--eventhub-connection", default=os.environ.get("EVENTHUB_CONNECTION_STRING"),
                        help="connection string (env EVENTHUB_CONNECTION_STRING)")
    parser.add_argument("--eventhub-namespace",
                        help="fully qualified namespace, signing in with DefaultAzureCredential")
    parser.add_argument("--orders-queue", default="orders")
    parser.add_argument("--status-queue", default="order-status")
    parser.add_argument("--topic", default="notifications")
    parser.add_argument("--hub", default="payments")
    parser.add_argument("--dry-run", action="store_true", help="write the ledger, send nothing")
    args = parser.parse_args(argv)
    if not args.dry_run:
        if args.messages and not (args.servicebus_connection or args.servicebus_namespace):
            parser.error("--messages needs --servicebus-connection or --servicebus-namespace "
                         "(or --messages 0)")
        if args.events and not (args.eventhub_connection or args.eventhub_namespace):
            parser.error("--events needs --eventhub-connection or --eventhub-namespace "
                         "(or --events 0)")
    return args


def _credential() -> Any:
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential()


def service_bus_client(args: argparse.Namespace) -> Any:
    from azure.servicebus import ServiceBusClient

    if args.servicebus_connection:
        return ServiceBusClient.from_connection_string(args.servicebus_connection)
    return ServiceBusClient(args.servicebus_namespace, _credential())


def event_hubs_producer(args: argparse.Namespace) -> Any:
    from azure.eventhub import EventHubProducerClient

    if args.eventhub_connection:
        return EventHubProducerClient.from_connection_string(args.eventhub_connection,
                                                             eventhub_name=args.hub)
    return EventHubProducerClient(args.eventhub_namespace, args.hub, _credential())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_id = args.run_id or f"p{uuid.uuid4().hex[:7]}"
    names = Names(orders_queue=args.orders_queue, status_queue=args.status_queue, topic=args.topic,
                  hub=args.hub)
    workload = generate(seed=args.seed, messages=args.messages, events=args.events,
                        duplicate_rate=args.duplicate_rate, run_id=run_id, names=names)
    counts: dict[str, int] = {}
    if not args.dry_run:
        sb = service_bus_client(args) if args.messages else None
        eh = event_hubs_producer(args) if args.events else None
        try:
            log = send_workload(workload, service_bus_client=sb, event_hubs_producer=eh,
                                copies_after=args.copies_after)
            counts = dict(log.sent)
        finally:
            for client in (sb, eh):
                if client is not None:
                    client.close()
    ledger = workload.ledger(hub=args.hub, sentAt=datetime.now(UTC).isoformat(),
                             dryRun=args.dry_run, sent=counts,
                             entities={"ordersQueue": args.orders_queue,
                                       "statusQueue": args.status_queue, "topic": args.topic,
                                       "hub": args.hub})
    with open(args.sent, "w", encoding="utf-8") as handle:
        json.dump(ledger, handle, indent=1)
    copies = sum(len(item.copies) for item in workload.items)
    print(f"run {run_id}: {len(workload.service_bus_items)} Service Bus messages, "
          f"{len(workload.event_items)} events, {copies} producer-retry copies"
          + (" (dry run: nothing sent)" if args.dry_run else f"; sent {counts}")
          + f"; ledger: {args.sent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
