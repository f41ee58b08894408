"""What invoking through the real worker costs per invocation, against calling the function directly.

    .venv/bin/python -m simulator.worker_overhead [--messages 2000] [--batches 100]

Both paths run the same function on the same services, on in-memory stores
so store latency does not hide the difference:

* **direct**: inputs decoded by the converters alone (`simulator.host_inputs`)
  and the user function called on this thread, settling on a recording stand-in
  (what the simulator did before it went through the worker);
* **worker**: an invocation request into `azure_functions_runtime` via
  `local_stack.worker` (protobuf messages, the worker's binding conversion, its
  thread pool, `ServiceBusMessageActions` settling over gRPC to the local
  settlement server).

Prints mean and median per invocation for each path and their difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import azure.functions as func

from domain.notifications import HttpResponse
from functions.services import build_services, use_services
from functions.settings import STORE_ROLES, Settings
from local_stack.host_data import SentEvent, SentMessage
from shared._backends import InMemoryIdempotencyStore
from simulator.host import worker_host
from simulator.host_inputs import (
    RecordingActions,
    event_hub_batch,
    indexed_functions,
    service_bus_message,
)

SETTINGS = {"DEDUP_BACKEND": "table", "TABLE_CONNECTION_STRING": "UseDevelopmentStorage=true",
            "NOTIFICATION_API_URL": "http://notifications.invalid/send",
            "PAYMENTS_HUB_NAME": "payments", "PAYMENTS_CONSUMER_GROUP": "payments-processor"}


def _order(order_id: str) -> bytes:
    return json.dumps({"orderId": order_id, "customerId": "C-1", "currency": "EUR",
                       "lines": [{"sku": "A", "quantity": 1, "unitPrice": 2.5}]}).encode()


def _event(n: int, account: str) -> SentEvent:
    body = json.dumps({"specversion": "1.0", "id": f"e{n}", "source": "/bench", "type": "payment.credit",
                       "data": {"accountId": account, "amountCents": 1}}).encode()
    return SentEvent(body, n)


def _time(direct: Callable[[], Any], worker: Callable[[], Any], repeat: int) -> dict[str, list[float]]:
    """Alternate the two paths so both see the same store sizes and machine load."""
    samples: dict[str, list[float]] = {"direct": [], "worker": []}
    for _ in range(repeat):
        for path, action in (("direct", direct), ("worker", worker)):
            started = time.perf_counter()
            action()
            samples[path].append(time.perf_counter() - started)
    return samples


def _unused_sender(url: str, body: bytes, headers: dict[str, str]) -> HttpResponse:
    raise AssertionError("the overhead run sends no notification")


def measure(messages: int, batches: int, batch_size: int) -> dict[str, dict[str, list[float]]]:
    """Per-invocation times (seconds) by kind and path."""
    stores = {role: InMemoryIdempotencyStore() for role in STORE_ROLES}
    services = build_services(Settings.from_env(SETTINGS), stores=stores.__getitem__,
                              sender=_unused_sender)
    worker = worker_host()
    # The app's own indexing, for the direct calls; `payments` is awaited on a loop of its own.
    user = {fn.get_function_name(): fn.get_user_function() for fn in indexed_functions()}
    loop = asyncio.new_event_loop()
    results: dict[str, dict[str, list[float]]] = {}
    with use_services(services):
        def direct_order() -> None:
            order_id = f"ORD-{uuid.uuid4().hex[:12]}"
            message = service_bus_message(SentMessage(_order(order_id), message_id=order_id))
            user["orders"](message=message, message_actions=RecordingActions())

        def worker_order() -> None:
            order_id = f"ORD-{uuid.uuid4().hex[:12]}"
            calls: list[Any] = []
            result = worker.invoke_service_bus("orders", SentMessage(_order(order_id),
                                                                     message_id=order_id),
                                               settle=calls.append)
            assert result.ok and calls[0].action == "complete", result.exception

        results["service bus message (orders)"] = _time(direct_order, worker_order, messages)

        sequence = iter(range(1, 10**9))

        def batch() -> list[SentEvent]:
            account = f"acct-{uuid.uuid4().hex[:8]}"
            return [_event(next(sequence), account) for _ in range(batch_size)]

        def direct_batch() -> None:
            loop.run_until_complete(user["payments"](
                events=event_hub_batch(batch(), partition_id=uuid.uuid4().hex[:6])))

        def worker_batch() -> None:
            result = worker.invoke_event_hub_batch("payments", batch(), partition_id=uuid.uuid4().hex[:6])
            assert result.ok, result.exception

        results[f"event hubs batch of {batch_size} (payments)"] = _time(direct_batch, worker_batch,
                                                                        batches)

        def body() -> tuple[dict[str, str], bytes]:
            return ({"Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())},
                    json.dumps({"type": "payment.credit", "accountId": "a", "amountCents": 1}).encode())

        def direct_http() -> None:
            headers, raw = body()
            response = user["http_payments"](req=func.HttpRequest("POST", "/api/payments",
                                                                   headers=headers, body=raw))
            assert response.status_code == 201

        def worker_http() -> None:
            headers, raw = body()
            assert worker.invoke_http("http_payments", headers=headers, body=raw).http.status == 201

        results["http request (http_payments)"] = _time(direct_http, worker_http, messages)
    loop.close()
    return results


def report(results: dict[str, dict[str, list[float]]]) -> str:
    lines = [f"{'invocation':<38} {'direct mean/median':>20} {'worker mean/median':>20} "
             f"{'overhead (median)':>18}"]
    for kind, paths in results.items():
        direct, worker = paths["direct"], paths["worker"]
        lines.append(
            f"{kind:<38} {statistics.mean(direct) * 1e3:>9.2f}/{statistics.median(direct) * 1e3:.2f} ms"
            f" {statistics.mean(worker) * 1e3:>9.2f}/{statistics.median(worker) * 1e3:.2f} ms"
            f" {(statistics.median(worker) - statistics.median(direct)) * 1e3:>14.2f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000,
                        help="Service Bus and HTTP invocations per path")
    parser.add_argument("--batches", type=int, default=100, help="Event Hubs batches per path")
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args(argv)
    print(report(measure(args.messages, args.batches, args.batch_size)))


if __name__ == "__main__":
    main()
