"""`python -m replay`: act on parked entries, dead-lettered messages and poison envelopes.

    python -m replay list [--consumer C] [--reason R] [--older-than 1h] [--state all]
    python -m replay list --source poison [--message-id M]   # Storage Queue poison envelopes
    python -m replay show dlq:orders/42
    python -m replay replay parked:payments/payments/0/1234
    python -m replay replay --filter consumer=payments,reason=ProcessingFailed --dry-run
    python -m replay replay --all            # one line per item as it completes, then totals
    python -m replay replay --source poison --reason MaxDequeueCountReached
    python -m replay discard dlq:orders/43 --note "duplicate order, refunded by hand"
    python -m replay outbox [--older-than 10m]            # outgoing messages still pending
    python -m replay outbox --dispatch [--dry-run]        # dispatch them (same message ids)
    python -m replay reused-keys [--consumer payments]    # one key in two partitions (full read)

The app's settings come from the environment (as the function app reads them)
or from a local.settings.json (`--settings`). Azure: the stores with
TABLE_ENDPOINT / COSMOS_ENDPOINT and the Service Bus namespace
(`ServiceBusConnection__fullyQualifiedNamespace` or --servicebus-namespace),
all with DefaultAzureCredential, and the queue triggers' poison queues on their
connection (AzureWebJobsStorage__queueServiceUri). Local: TABLE_CONNECTION_STRING /
COSMOS_KEY, the emulator's connection string (SERVICEBUS_CONNECTION_STRING) and
AzureWebJobsStorage (Azurite).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime

from functions.services import build_services
from functions.settings import Settings, SettingsError
from replay.deadletters import ServiceBusDeadLetters
from replay.poison import StoragePoisonQueues
from replay.render import counts_text, items_text, progress_line, results_text, show_text
from replay.stores import ReuseScan, document_lister
from replay.tool import (
    Filters,
    Options,
    ReplayError,
    ReplayTool,
    Result,
    app_entities,
    app_queues,
    pending_outgoing,
    reused_keys,
)
from shared._flows.parking import ParkingLot

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
FILTER_KEYS = ("consumer", "reason", "source", "state", "older-than", "newer-than", "message-id")


def duration(text: str) -> float:
    match = DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 30m, 2h or 1d")
    return float(match.group(1)) * UNITS[match.group(2)]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--operator", help="who is acting (default: the OS user)")
    parser.add_argument("--settings", help="read app settings from this local.settings.json "
                                           "(its Values override the environment)")
    parser.add_argument("--servicebus-connection",
                        help="Service Bus connection string (Docker emulator); default: "
                             "SERVICEBUS_CONNECTION_STRING or a connection-string ServiceBusConnection")
    parser.add_argument("--servicebus-namespace",
                        help="fully qualified namespace, signed in with DefaultAzureCredential; "
                             "default: ServiceBusConnection__fullyQualifiedNamespace")
    parser.add_argument("--no-servicebus", action="store_true",
                        help="do not read the dead-letter queues")
    parser.add_argument("--no-queues", action="store_true",
                        help="do not read the Storage queue triggers' poison queues")
    parser.add_argument("--duplicate-detection-window", type=duration, default=600.0,
                        help="the entities' duplicate-detection window (default 10m as in infra/; "
                             "the Docker emulator's config uses 5m)")


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--consumer",
                        help="orders, order_status, notify, audit, payments, order_audit")
    parser.add_argument("--reason", help="e.g. MaxDeliveryCountExceeded, MaxDequeueCountReached")
    parser.add_argument("--source", choices=("parked", "deadletter", "poison"))
    parser.add_argument("--message-id", metavar="ID",
                        help="the (original) message id, or the dedup key of a parked event")
    parser.add_argument("--older-than", type=duration, metavar="AGE")
    parser.add_argument("--newer-than", type=duration, metavar="AGE")
    parser.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help=f"the same filters in one string; keys: {', '.join(FILTER_KEYS)}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    _common(common)
    parser = argparse.ArgumentParser(prog="python -m replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", parents=[common],
                                  help="parked entries and dead-lettered messages")
    _filters(listing)
    listing.add_argument("--state", choices=("open", "replayed", "discarded", "all"), default="open")
    show = commands.add_parser("show", parents=[common], help="one item in full")
    show.add_argument("id")
    replay = commands.add_parser("replay", parents=[common],
                                 help="replay items by id, by filter, or all open ones")
    replay.add_argument("ids", nargs="*", metavar="ID")
    replay.add_argument("--all", action="store_true", help="every open item (filters narrow it)")
    _filters(replay)
    replay.add_argument("--dry-run", action="store_true", help="say what would happen; change nothing")
    replay.add_argument("--confirm-not-sent", action="store_true",
                        help="parked notifications, API ignoring Idempotency-Key: you checked it "
                             "was NOT sent, so sending it now is the first time")
    replay.add_argument("--past-retention", action="store_true",
                        help="replay items older than the dedup records' retention (checked by hand)")
    replay.add_argument("--include-refused", action="store_true",
                        help="poison envelopes: resubmit refusals too (bad input, a reused key), "
                             "once you fixed their cause")
    replay.add_argument("--host-copies", action="store_true",
                        help="poison queue: resubmit the host's own copies (no envelope, no id) "
                             "as stored; only a business-keyed consumer absorbs them")
    outbox = commands.add_parser("outbox", parents=[common],
                                 help="outgoing messages committed but not recorded as dispatched")
    outbox.add_argument("--older-than", type=duration, default=0.0, metavar="AGE")
    outbox.add_argument("--dispatch", action="store_true",
                        help="dispatch and record them (their ids are the recorded ones)")
    outbox.add_argument("--dry-run", action="store_true", help="with --dispatch: change nothing")
    reused = commands.add_parser(
        "reused-keys", parents=[common],
        help="dedup keys recorded in more than one partition (a producer that reused an id for "
             "another account or order: both were applied); reads every record once")
    reused.add_argument("--consumer", help="only this consumer's records (e.g. payments)")
    discard = commands.add_parser("discard", parents=[common], help="close an item with a note")
    discard.add_argument("id")
    discard.add_argument("--note", required=True, help="why (kept on the entry)")
    args = parser.parse_args(argv)
    if args.command in ("list", "replay"):
        for text in args.filter:
            for pair in filter(None, (p.strip() for p in text.split(","))):
                name, sep, value = pair.partition("=")
                if not sep or name not in FILTER_KEYS:
                    parser.error(f"--filter {pair!r}: expected KEY=VALUE with KEY one of "
                                 f"{', '.join(FILTER_KEYS)}")
                attr = name.replace("-", "_")
                setattr(args, attr, duration(value) if attr.endswith("_than") else value)
    if args.command == "replay":
        selected = bool(args.ids) + bool(args.all or args.filter or args.consumer or args.reason
                                         or args.source or args.older_than or args.newer_than
                                         or args.message_id)
        if selected != 1:
            parser.error("replay takes ids, or --all / --filter / filter options (not both, not none)")
    return args


def app_settings(path: str | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    settings = dict(os.environ if env is None else env)
    if path:
        with open(path, encoding="utf-8") as handle:
            settings.update({k: str(v) for k, v in json.load(handle).get("Values", {}).items()})
    return settings


def dead_letter_source(args: argparse.Namespace, env: Mapping[str, str],
                       client_id: str | None = None) -> ServiceBusDeadLetters | None:
    """The app's Service Bus dead-letter queues, or None (with the reason on stderr).

    A connection string (the Docker emulator) wins; otherwise the namespace with
    DefaultAzureCredential (the app's user-assigned identity when AZURE_CLIENT_ID is set
    and the tool runs in Azure; your `az login` / environment credential elsewhere).
    """
    if args.no_servicebus:
        return None
    connection = args.servicebus_connection or env.get("SERVICEBUS_CONNECTION_STRING")
    binding = env.get("ServiceBusConnection", "")
    if not connection and binding.startswith("Endpoint="):
        connection = binding
    namespace = args.servicebus_namespace or env.get("ServiceBusConnection__fullyQualifiedNamespace")
    if not (connection or namespace):
        print("note: no Service Bus connection (--servicebus-connection / --servicebus-namespace): "
              "dead-letter queues not read", file=sys.stderr)
        return None
    credential = None
    if not connection:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential(managed_identity_client_id=client_id)
    return ServiceBusDeadLetters.connect(
        app_entities(env), connection_string=connection, namespace=namespace, credential=credential,
        duplicate_detection_window=args.duplicate_detection_window)


def poison_source(args: argparse.Namespace, env: Mapping[str, str],
                  settings: Settings) -> StoragePoisonQueues | None:
    """The queue triggers' poison queues on the trigger's own connection, or None (with the
    reason on stderr): a connection string (Azurite), or the queue endpoint with
    DefaultAzureCredential (Storage Queue Data Contributor on the queues)."""
    if args.no_queues:
        return None
    queues = app_queues(env)
    if settings.queue_connection:
        return StoragePoisonQueues.connect(queues, connection_string=settings.queue_connection)
    if settings.queue_service_uri:
        from azure.identity import DefaultAzureCredential

        return StoragePoisonQueues.connect(queues, account_url=settings.queue_service_uri,
                                           credential=DefaultAzureCredential(
                                               managed_identity_client_id=settings.azure_client_id))
    print("note: no queue connection (AzureWebJobsStorage / AzureWebJobsStorage__queueServiceUri): "
          "poison queues not read", file=sys.stderr)
    return None


def build_tool(args: argparse.Namespace, env: Mapping[str, str]) -> ReplayTool:
    """The tool on the app's stores (built as the app builds them), its dead-letter queues and
    its queue triggers' poison queues."""
    settings = Settings.from_env(env)
    services = build_services(settings)
    parked = services.stores["parked"]
    parking = ParkingLot(parked, telemetry=services.telemetry, lister=document_lister(parked))
    return ReplayTool(services, parking, dead_letter_source(args, env, settings.azure_client_id),
                      operator=args.operator or getpass.getuser(), clock=time.time,
                      poison=poison_source(args, env, settings))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "reused-keys":
        args.no_servicebus = args.no_queues = True  # the stores only
    try:
        tool = build_tool(args, app_settings(args.settings))
    except SettingsError as error:
        print(f"settings: {error}", file=sys.stderr)
        return 2
    try:
        return run(tool, args)
    except ReplayError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        if tool.dead_letters is not None:
            tool.dead_letters.close()
        tool.close()


def run(tool: ReplayTool, args: argparse.Namespace) -> int:
    """One command on a built tool; prints text or JSON; exit 0, or 1 when a replay failed (or
    `reused-keys` found a key in more than one partition)."""
    now = tool.now()
    if args.command == "list":
        filters = Filters(consumer=args.consumer, reason=args.reason, source=args.source,
                          state=args.state, older_than=args.older_than, newer_than=args.newer_than,
                          message_id=args.message_id)
        items = tool.items(filters)
        print(json.dumps([i.to_json(now) for i in items], indent=2) if args.json
              else items_text(items, now))
        return 0
    if args.command == "outbox":
        pending = pending_outgoing(tool.services, older_than=args.older_than, now=now,
                                   dispatch=args.dispatch, dry_run=args.dry_run)
        if args.json:
            print(json.dumps([p.to_json(now) for p in pending], indent=2))
        else:
            for p in pending:
                ids = ", ".join(f"{m['id']} -> {m['destination']}" for m in p.messages)
                print(f"{p.status:<15} {p.consumer} {p.key} pending {now - p.pending_since:.0f} s: "
                      f"{ids}{'  ' + p.detail if p.detail else ''}")
            print(f"{len(pending)} marker(s) with pending outgoing messages")
        return 1 if any(p.status == "failed" for p in pending) else 0
    if args.command == "reused-keys":
        return print_reused_keys(reused_keys(tool.services, consumer=args.consumer),
                                 as_json=args.json)
    if args.command == "show":
        item, facts = tool.show(args.id)
        print(json.dumps({**item.to_json(now, full=True), "facts": facts}, indent=2, default=str)
              if args.json else show_text(item, facts, now))
        return 0
    if args.command == "replay":
        filters = Filters(consumer=args.consumer, reason=args.reason, source=args.source,
                          older_than=args.older_than, newer_than=args.newer_than,
                          message_id=args.message_id)
        options = Options(confirm_not_sent=args.confirm_not_sent,
                          past_retention=args.past_retention, dry_run=args.dry_run,
                          include_refused=args.include_refused, host_copies=args.host_copies)
        # One line per item as it completes, with the tally so far: on stdout as the text
        # answer itself, on stderr with --json (stdout stays one JSON document).
        stream = sys.stderr if args.json else sys.stdout
        counts: Counter[str] = Counter()

        def progress(result: Result, done: int, total: int) -> None:
            counts[result.status] += 1
            print(progress_line(result, done, total, counts), file=stream, flush=True)

        results = tool.replay(args.ids, filters=filters, options=options, progress=progress)
        print(json.dumps([r.to_json() for r in results], indent=2) if args.json
              else counts_text(counts) or "nothing selected")
    else:
        results = [tool.discard(args.id, args.note)]
        print(json.dumps([r.to_json() for r in results], indent=2) if args.json
              else results_text(results))
    return 1 if any(r.status == "failed" for r in results) else 0


def print_reused_keys(scans: list[ReuseScan], *, as_json: bool) -> int:
    """Each store's cost, then each key found in several partitions; exit 1 when any was."""
    found = sum(len(scan.reused) for scan in scans)
    if as_json:
        print(json.dumps([{"store": scan.store, "records": scan.records, "requests": scan.requests,
                           "requestUnits": scan.request_units,
                           "reused": [{"consumer": r.consumer, "key": r.key,
                                       "partitions": [{"partition": p, "createdAt": _iso(c)}
                                                      for p, c in r.partitions]}
                                      for r in scan.reused]} for scan in scans], indent=2))
        return 1 if found else 0
    for scan in scans:
        print(f"{scan.store}: {scan.cost}")
        for reused in scan.reused:
            where = ", ".join(f"{partition} (created {_iso(created)})"
                              for partition, created in reused.partitions)
            print(f"  {reused.consumer} key {reused.key!r} in {len(reused.partitions)} "
                  f"partitions: {where}")
    print(f"{found} key(s) recorded in more than one partition")
    return 1 if found else 0


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
