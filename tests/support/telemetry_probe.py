"""Count what reaches Application Insights for two invocations, through the real worker.

    python -m tests.support.telemetry_probe   # prints one JSON document

A fresh process (the worker keeps one app per process and the exporter is
configured once): the sample settings plus a connection string, the real
`azure-monitor-opentelemetry` distro configured by the app on import, the real
worker loading the app, two `orders` invocations on in-memory stores: an order,
then the same order id with other content (a conflict, the kind of record the
app logs). The Azure Monitor log and metric exporters' `export` are replaced by
counters of each record and each `dedup.messages` point they would send. The
host's own forwarding of worker logs (the second path) cannot run here: what
turns it off is the `WorkerOpenTelemetryEnabled` capability the worker reports,
so the report carries the capabilities too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONNECTION_STRING = ("InstrumentationKey=00000000-0000-0000-0000-000000000000;"
                     "IngestionEndpoint=http://127.0.0.1:9/")


def report() -> dict[str, Any]:
    from azure.monitor.opentelemetry.exporter import AzureMonitorLogExporter, AzureMonitorMetricExporter
    from azure.monitor.opentelemetry.exporter.export._base import ExportResult
    from opentelemetry.sdk.metrics.export import MetricExportResult

    exported: Counter[str] = Counter()
    messages: Counter[str] = Counter()  # dedup.messages by outcome, summed over the points

    def count(self: Any, batch: Any, **_: Any) -> ExportResult:
        for data in batch:
            record = getattr(data, "log_record", data)
            event = (record.attributes or {}).get("event")
            if event:
                exported[f"{event}:{record.body}"] += 1
        return ExportResult.SUCCESS

    def count_points(self: Any, metrics_data: Any, **_: Any) -> MetricExportResult:
        for resource in metrics_data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == "dedup.messages":
                        for point in metric.data.data_points:
                            messages[str(point.attributes.get("outcome"))] += int(point.value)
        return MetricExportResult.SUCCESS

    # Patched on the classes: the distro builds its exporters itself, out of the test's reach.
    AzureMonitorLogExporter.export = count  # type: ignore[method-assign]
    AzureMonitorMetricExporter.export = count_points  # type: ignore[method-assign]

    from local_stack.host_data import SentMessage
    from local_stack.worker import WorkerHost, sample_settings

    settings = {**sample_settings(ROOT), "APPLICATIONINSIGHTS_CONNECTION_STRING": CONNECTION_STRING}
    if "PYTHON_ENABLE_OPENTELEMETRY" not in os.environ:
        settings.pop("PYTHON_ENABLE_OPENTELEMETRY", None)
    host = WorkerHost.start(ROOT, settings)

    from functions.services import build_services, use_services
    from functions.settings import Settings
    from shared.testing import InMemoryIdempotencyStore

    stores: dict[str, InMemoryIdempotencyStore] = {}
    services = build_services(Settings.from_env(),
                              stores=lambda role: stores.setdefault(role, InMemoryIdempotencyStore()))
    order_id = f"ORD-{uuid.uuid4().hex[:8]}"
    settled: list[Any] = []
    results = []
    with use_services(services):
        for quantity in (1, 2):  # the second is the same order id with other content: a conflict
            body = json.dumps({"orderId": order_id, "customerId": "C-1", "currency": "EUR",
                               "lines": [{"sku": "A", "quantity": quantity, "unitPrice": 2.5}]}).encode()
            results.append(host.invoke_service_bus("orders", SentMessage(body, message_id=order_id),
                                                   settle=settled.append))

    from opentelemetry import metrics
    from opentelemetry._logs import get_logger_provider

    get_logger_provider().force_flush()  # type: ignore[attr-defined]
    metrics.get_meter_provider().force_flush()  # type: ignore[attr-defined]
    return {"ok": all(result.ok for result in results), "capabilities": host.capabilities,
            "settled": [call.action for call in settled], "exported": dict(exported),
            "messages": dict(messages)}


def probe(*, otel_flag: bool = True, timeout: float = 180.0) -> dict[str, Any]:
    """Run `report` in a fresh interpreter with only the sample settings in its environment
    (without PYTHON_ENABLE_OPENTELEMETRY when `otel_flag` is False)."""
    from local_stack.worker import sample_settings

    env = {"PATH": os.environ.get("PATH", ""), **sample_settings(ROOT),
           "APPLICATIONINSIGHTS_CONNECTION_STRING": CONNECTION_STRING,
           "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true"}
    if not otel_flag:
        env.pop("PYTHON_ENABLE_OPENTELEMETRY", None)
    done = subprocess.run([sys.executable, "-m", "tests.support.telemetry_probe"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"probe failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    print(json.dumps(report()), flush=True)
