"""What a million messages cost, per path: measured inputs + published prices.

    .venv/bin/python -m benchmarks.cost [--messages 200] [--payments-cpu-ms 0.35]

Measured here, on the local servers (Azurite, the Cosmos server) through the app's own
services (`build_services` on `real_stores`): the store requests per message (counted
at the SDK transport), the bytes of the marker each path leaves (the stored Cosmos item
as the server returns it; the Table entity by Azure's published size formula) and the
client CPU per message (process time of this process around the path's calls; the
servers are other processes). Computed from published figures (see PRICES and RU):
Cosmos RU per message (with the default indexing policy and with the app's
point-operation policy), their price serverless and provisioned, Table transactions'
price, and the stored bytes at 1,000 messages/s with the default 7-day TTL.

Prints a markdown table (benchmarks/RESULTS.md "What a million messages cost").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# -- published figures (looked up 2026-12-03; USD, single region, pay-as-you-go list prices) -------
PRICES = {
    # Azure Cosmos DB pricing page: serverless "$0.25 per million RUs"; provisioned (manual)
    # "$0.008 per 100 RU/s per hour"; autoscale 1.5x that; transactional storage "$0.25 per GB-month".
    "cosmos_serverless_per_million_ru": 0.25,
    "cosmos_provisioned_per_100rus_hour": 0.008,
    "cosmos_storage_per_gb_month": 0.25,
    # Azure Table Storage pricing page (standard, LRS): "$0.00036 per 10,000 transactions";
    # storage "$0.045 per GB-month" (first TB).
    "table_per_10k_transactions": 0.00036,
    "table_storage_per_gb_month": 0.045,
}
# learn.microsoft.com/azure/cosmos-db/understand-request-unit-consumption (table "Document
# size / Read / Write", default indexing): 1 KB: read 1.00 RU, write 4.95 RU; 2 KB: 1.04 / 6.29.
# A transactional batch is charged the sum of its operations. The docs publish no per-path
# index charge; the write charge with the app's policy is ESTIMATED as the write charge less
# an index share: INDEX_SHARE of the write is index maintenance under the default policy
# (every property indexed), of which the point policy keeps the fraction its indexed paths
# are of the item's properties. A range, stated as such.
RU_WRITE_1KB_DEFAULT = 4.95
RU_WRITE_2KB_DEFAULT = 6.29
RU_READ_1KB = 1.0
INDEX_SHARE = (0.2, 0.4)  # assumption: low / high share of a small item's write charge
# Telemetry per message at the default trace sampling (TRACE_SAMPLING_RATIO), from the item sizes
# `benchmarks.telemetry_bytes` measured with the real exporter (2026-12-03, full sampling): a valid
# message writes no log record, so it costs its trace times the ratio plus its share of one metric
# export (about 0.9 B at 1,000 msg/s and the 60 s interval); a payments event its share of the
# batch summary record (950 B per 100-event batch) and of the batch's trace (about 27 KB). HTTP is
# not in the demo: 4 store calls of about 2.1 KB of spans each.
TRACE_SAMPLING = 0.001
METRIC_BYTES = 0.9
TRACE_BYTES = {"orders": 4354, "duplicate (order)": 3094, "notifications (two-phase)": 5365,
               "HTTP (Idempotency-Key)": 8600}
BATCH_SUMMARY_BYTES, BATCH_TRACE_BYTES, BATCH_EVENTS = 950, 27_000, 100
RETENTION_SECONDS = 7 * 24 * 3600  # DEDUP_TTL_SECONDS default
RATE = 1000  # messages per second, steady state


def write_ru(size_bytes: int, *, properties: int, indexed: int | None) -> tuple[float, float]:
    """(low, high) RU of one write of an item of `size_bytes` with `properties` properties;
    `indexed` None: the default policy (all indexed)."""
    kb = max(1.0, size_bytes / 1024)
    full = RU_WRITE_1KB_DEFAULT + (RU_WRITE_2KB_DEFAULT - RU_WRITE_1KB_DEFAULT) * min(1.0, kb - 1)
    if indexed is None:
        return full, full
    kept = min(1.0, indexed / max(1, properties))
    low_share, high_share = INDEX_SHARE
    return full * (1 - high_share * (1 - kept)), full * (1 - low_share * (1 - kept))


def table_entity_bytes(entity: dict[str, Any]) -> int:
    """Azure's published formula: 4 + len(PartitionKey)*2 + len(RowKey)*2 + per property
    8 + len(name)*2 + value size (string: len*2+4; double/int64/datetime: 8; int32/bool: 4/1)."""
    size = 4 + 2 * len(entity["PartitionKey"]) + 2 * len(entity["RowKey"])
    for name, value in entity.items():
        if name in ("PartitionKey", "RowKey", "Timestamp", "etag"):
            continue
        value = getattr(value, "value", value)
        if isinstance(value, bool):
            v = 1
        elif isinstance(value, int):
            v = 8 if abs(value) >= 2 ** 31 else 4
        elif isinstance(value, float):
            v = 8
        else:
            v = 2 * len(str(value)) + 4
        size += 8 + 2 * len(name) + v
    return size


@dataclass
class PathFigures:
    path: str
    backend: str
    messages: int
    requests: float  # per message, counted at the transport
    reads: float  # of those, GETs (point reads), per message
    marker_writes: float  # marker write operations per message (in a transaction or not)
    other_writes: float  # business-document write operations per message (balances, marks)
    marker_bytes: int  # one marker as stored (payments: the mean of the batch markers)
    marker_properties: int
    cpu_ms: float  # client CPU per message
    table_always: bool = False  # lives in Table Storage whatever DEDUP_BACKEND says
    kept: bool = False  # the marker is the business document itself: no TTL, it stays


OTHER_DOCUMENT = (200, 5)  # a balance / mark document: ~200 bytes, ~5 properties (small item)


def cosmos_ru(f: PathFigures, indexed: int | None) -> tuple[float, float]:
    """(low, high) RU per message: a transactional batch costs the sum of its operations; a
    write that fails on its condition (a duplicate's 409) is counted as a write (conservative)."""
    lo, hi = write_ru(f.marker_bytes, properties=f.marker_properties, indexed=indexed)
    o_lo, o_hi = write_ru(OTHER_DOCUMENT[0], properties=OTHER_DOCUMENT[1],
                          indexed=None if indexed is None else 1)
    return (f.marker_writes * lo + f.other_writes * o_lo + f.reads * RU_READ_1KB,
            f.marker_writes * hi + f.other_writes * o_hi + f.reads * RU_READ_1KB)


def telemetry_bytes(path: str) -> float:
    """Bytes exported per message of `path` (computed from the measured item sizes above)."""
    if path.startswith("payments"):
        return (BATCH_SUMMARY_BYTES + BATCH_TRACE_BYTES * TRACE_SAMPLING) / BATCH_EVENTS + METRIC_BYTES
    return TRACE_BYTES[path] * TRACE_SAMPLING + METRIC_BYTES


def money_rows(figures: list[PathFigures]) -> list[list[str]]:
    rows = []
    for f in figures:
        million = 1_000_000
        stored_gb = RATE * RETENTION_SECONDS * f.marker_bytes / 1e9
        per_day = RATE * 86400 * f.marker_bytes / 1e9
        if f.backend == "cosmos" and not f.table_always:
            default = cosmos_ru(f, None)[0]
            lean = cosmos_ru(f, 4)  # the point policy indexes 4 paths
            ru = f"{default:.1f} / {lean[0]:.1f}-{lean[1]:.1f}"
            serverless = f"${default * PRICES['cosmos_serverless_per_million_ru']:.2f} / " \
                         f"${lean[0] * PRICES['cosmos_serverless_per_million_ru']:.2f}-" \
                         f"{lean[1] * PRICES['cosmos_serverless_per_million_ru']:.2f}"
            # Provisioned: RU/s to sustain RATE messages/s, billed per hour; per million messages.
            hours = million / RATE / 3600
            per_100 = PRICES["cosmos_provisioned_per_100rus_hour"]
            provisioned = f"${math.ceil(default * RATE / 100) * per_100 * hours:.2f} / " \
                          f"${math.ceil(lean[1] * RATE / 100) * per_100 * hours:.2f}"
            transactions = "-"
            storage = f"{stored_gb:.0f} GB (${stored_gb * PRICES['cosmos_storage_per_gb_month']:.0f}/month)"
            price_gb = PRICES["cosmos_storage_per_gb_month"]
        else:
            ru, serverless, provisioned = "-", "-", "-"
            price = f.requests * million / 10_000 * PRICES["table_per_10k_transactions"]
            transactions = f"{f.requests * million / 1e6:.2f} M (${price:.3f})"
            storage = f"{stored_gb:.0f} GB (${stored_gb * PRICES['table_storage_per_gb_month']:.0f}/month)"
            price_gb = PRICES["table_storage_per_gb_month"]
        if f.kept:
            storage = (f"kept (the order is the record): +{per_day:.1f} GB/day, "
                       f"+${per_day * price_gb:.2f}/month per day")
        rows.append([f.path, f.backend + (" (Table)" if f.table_always and f.backend == "cosmos" else ""),
                     f"{f.requests:.2f} M", ru, serverless, provisioned, transactions,
                     f"{f.marker_bytes} B", storage, f"{telemetry_bytes(f.path) / 1000:.3f}",
                     f"{f.cpu_ms * million / 1000:.0f} s"])
    return rows


HEADERS = ("Path", "Backend", "Store requests (measured)",
           "Cosmos RU/msg, default / point policy (computed)", "Cosmos serverless (computed)",
           "Cosmos provisioned at 1,000 msg/s (computed)", "Table transactions (measured)",
           "Marker bytes (measured)",
           "Stored at 1,000 msg/s, 7-day TTL (computed from the measured bytes)",
           "Telemetry GB (computed from measured item sizes)", "Client CPU-s (measured)")


def markdown(figures: list[PathFigures]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in money_rows(figures)]
    return "\n".join(lines)


# -- measuring on the local servers ---------------------------------------------------------------
def _measure(backend: str, stack: Any, messages: int, payments_cpu_ms: float | None) -> list[PathFigures]:
    from benchmarks.counting import CountingTransport, RequestCounter, classify
    from domain.http_payments import parse_payment
    from functions.services import build_services, real_stores
    from functions.settings import Settings
    from local_stack import COSMOS_LOCAL_KEY
    from shared._backends.sdk_transport import proxy_configured
    from shared._core.codec import is_record
    from shared._triggers.eventhubs import EventView
    from shared._triggers.servicebus import MessageView
    from simulator.check import scan
    from simulator.faults import FakeNotificationApi

    class Counter(RequestCounter):
        """Data-plane requests to either server (Table and Cosmos share one transport)."""

        def record(self, layer: str, method: str, url: str, request: Any = None) -> None:
            kind = classify("cosmos" if url.startswith(stack.cosmos_endpoint) else "table", method, url)
            with self._lock:
                self.counts[(layer, kind)] += 1
                self.requests[(method, kind)] += 1

        def reads(self) -> int:
            return self.requests[("GET", "data")]

    counter = Counter(backend)
    settings = Settings.from_env({
        "DEDUP_BACKEND": backend, "TABLE_CONNECTION_STRING": stack.table_connection_string,
        "COSMOS_ENDPOINT": stack.cosmos_endpoint, "COSMOS_KEY": COSMOS_LOCAL_KEY,
        "COSMOS_VERIFY_TLS": "false", "COSMOS_DATABASE": f"cost{uuid.uuid4().hex[:8]}",
        "NOTIFICATION_API_URL": "http://notifications.invalid/send",
        "PAYMENTS_HUB_NAME": f"payments-{uuid.uuid4().hex[:6]}"})
    # One counting transport (requests, one SSL context) for the app's sync store clients,
    # reading the environment for proxies only when the app's own transports would
    # (shared._backends.sdk_transport): per-request proxy and netrc lookups are not the app's cost.
    stores = real_stores(settings, transport=CountingTransport(
        counter, verify=False, use_env_settings=proxy_configured()))
    services = build_services(settings, stores=stores, sender=FakeNotificationApi())
    run = uuid.uuid4().hex[:6]
    loop = asyncio.Runner()  # the async consumers (orders, notify) on the counted sync stores

    def measured(action: Callable[[int], Any], n: int) -> tuple[float, float, float]:
        """(requests, reads, client CPU ms) per call of `action`."""
        before, reads = counter.data(), counter.reads()
        cpu = time.process_time()
        for i in range(n):
            action(i)
        spent = time.process_time() - cpu
        return (counter.data() - before) / n, (counter.reads() - reads) / n, spent * 1000 / n

    def order(i: int) -> bytes:
        return json.dumps({"orderId": f"ORD-{run}-{i}", "customerId": "C-1", "currency": "EUR",
                           "lines": [{"sku": "A", "quantity": 1, "unitPrice": 2.5}]}).encode()

    def _plain(row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if k not in ("_id", "_partition")}

    def newest_marker(store: Any, prefix: str | None = None) -> dict[str, Any]:
        return _plain([r for r in scan(store, prefix) if is_record(r)][-1])

    def size_of(row: dict[str, Any], table: bool) -> tuple[int, int]:
        props = [k for k in row if not k.startswith("_") and k not in ("PartitionKey", "RowKey", "id")]
        if table:
            return table_entity_bytes(row), len(props)
        return len(json.dumps(row, separators=(",", ":")).encode()), len(props)

    out = []
    cosmos = backend == "cosmos"

    def handle_order(i: int) -> Any:
        return loop.run(services.orders.handle(MessageView(f"ORD-{run}-{i}", order(i))))

    # orders: the order document is the marker; its commit carries the OrderAccepted message,
    # then the dispatch is recorded on it (two writes of the order document per new order)
    req, reads, cpu = measured(handle_order, messages)
    size, props = size_of(newest_marker(services.stores["orders"]), not cosmos)
    out.append(PathFigures("orders", backend, messages, req, reads, req - reads, 0, size, props, cpu,
                           kept=True))
    # duplicates (of orders): the same messages again (the create fails 409, the marker is read)
    req, reads, cpu = measured(handle_order, messages)
    out.append(PathFigures("duplicate (order)", backend, messages, req, reads, req - reads, 0, 0, props, cpu))
    # notifications: two-phase in Table Storage (notify records always there), plus the API call
    req, reads, cpu = measured(lambda i: loop.run(services.notify.handle(MessageView(
        f"N-{run}-{i}", json.dumps({"to": "a@example.com", "text": "shipped"}).encode()))), messages)
    size, props = size_of(newest_marker(services.stores["notifications"]), True)
    out.append(PathFigures("notifications (two-phase)", backend, messages, req, reads, req - reads, 0,
                           size, props, cpu, table_always=True))
    # payments: Event Hubs batches of 100 events over 20 accounts, grouped (one transaction per
    # account: the markers + the balance; one mark write per batch)
    batches = max(2, messages // 100)
    events = [EventView(sequence_number=n + 1, body=json.dumps({
        "specversion": "1.0", "id": f"pay-{run}-{n}", "source": "/cost", "type": "payment.credit",
        "datacontenttype": "application/json",
        "data": {"accountId": f"acct-{run}-{n % 20}", "amountCents": 5}}).encode(),
        content_type="application/cloudevents+json; charset=utf-8") for n in range(batches * 100)]
    services.payments.process_batch(events[:100], "0")  # first sight of the accounts (their reads)
    req, reads, cpu = measured(
        lambda b: services.payments.process_batch(events[(b + 1) * 100:(b + 2) * 100], "0"), batches - 1)
    # A group's one BalanceChanged rides on one of its markers (about 1 in 5 here): the mean.
    sizes = [size_of(_plain(row), not cosmos) for row in scan(services.stores["ledger"])
             if is_record(row)]
    size, props = round(sum(b for b, _ in sizes) / len(sizes)), max(p for _, p in sizes)
    out.append(PathFigures("payments (per event; batches of 100, 20 accounts)", backend,
                           (batches - 1) * 100, req / 100, reads / 100, 1, (20 + 1) / 100, size, props,
                           payments_cpu_ms if payments_cpu_ms is not None else cpu / 100))

    # HTTP: the Idempotency-Key record two-phase (create, complete) around the ledger's posting
    # (the balance read; marker + balance + BalanceChanged in one transaction; dispatch recorded)
    def http(i: int) -> Any:
        return services.http_payments.endpoint.answer(
            {"Content-Type": "application/json", "Idempotency-Key": f"k-{run}-{i}"},
            json.dumps({"type": "payment.credit", "accountId": f"h-{run}-{i % 20}",
                        "amountCents": 250}).encode(), services.http_payments.apply,
            parse=parse_payment)
    req, reads, cpu = measured(http, messages)
    size, props = size_of(newest_marker(services.stores["ledger"]), not cosmos)
    out.append(PathFigures("HTTP (Idempotency-Key)", backend, messages, req, reads, 1, req - reads - 1,
                           size, props, cpu))
    loop.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--payments-cpu-ms", default=None,
                        help="client CPU per event of the payments path by backend, from the latency "
                             "benchmark's 'app' (e.g. cosmos=0.69,table=0.58); default: measured here "
                             "on the sync service")
    args = parser.parse_args(argv)
    logging.getLogger("shared").setLevel(logging.ERROR)
    logging.getLogger("domain").setLevel(logging.ERROR)
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    warnings.filterwarnings("ignore")
    from local_stack import LocalStack

    figures: list[PathFigures] = []
    with LocalStack() as stack:
        given: dict[str, str] = {}
        for part in (args.payments_cpu_ms or "").split(","):
            if part:
                name, _, value = part.partition("=")
                given[name] = value
        for backend in ("cosmos", "table"):
            cpu = float(given[backend]) if backend in given else None
            figures += _measure(backend, stack, args.messages, cpu)
    for f in figures:
        print(f"# {f.path} / {f.backend}: {f.requests:.3f} req/msg ({f.reads:.3f} reads), "
              f"marker {f.marker_bytes} B "
              f"({f.marker_properties} properties), {f.cpu_ms:.3f} ms CPU/msg")
    print(markdown(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
