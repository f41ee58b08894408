"""Bytes the app's Azure Monitor exporter would send per message, on a small demo workload.

    .venv/bin/python -m benchmarks.telemetry_bytes                 # table backend, 1,000 + 1,000
    .venv/bin/python -m benchmarks.telemetry_bytes --backend cosmos --messages 2000 --events 2000

What runs: the demo's simulator scenario (simulator/scenario.py) through the real worker and the
real functions, on Azurite (and the Cosmos server for `--backend cosmos`), with a duplicate rate
of 3 % by default (`--duplicate-rate`; the simulator adds redeliveries of its own only when
faults are on, `--fault-rate`, default 0) and no hostile input (`--hostile` adds it). The worker's
settings are the sample settings plus an Application Insights connection string, so the app
configures the real `azure-monitor-opentelemetry` distro on import (function_app.py), with
whatever sampler and log levels the app sets (the sample settings carry the default
`TRACE_SAMPLING_RATIO`; `--setting TRACE_SAMPLING_RATIO=1` exports every trace, whose bytes
times the ratio are the expected trace bytes of a run, free of the sampling's luck). The root
logger is at INFO, as the Functions worker sets it.

What is counted: every HTTP request body the distro's exporters send to the ingestion endpoint
(`/v2.1/track`; the endpoint is a name that never resolves, and the HTTP transport answers it itself
with the ingestion service's 200 answer, so nothing leaves the machine), split by envelope type:
MessageData/ExceptionData (logs, the `traces`/`exceptions` tables), RequestData/RemoteDependencyData
(spans, and the exceptions recorded on them) and MetricData (`customMetrics` and performance
counters); also by item (a log's event, a span's name, a metric's name) and by function (a
record by its `consumer` field, a span by the function's span it descends from). Records the
harness itself causes (the live-metrics pings fail against the closed port they are pointed at)
are reported as `harness` and left out. The body is uncompressed JSON, which is what ingestion
bills, roughly (Log Analytics bills the stored columns; the envelope JSON is a close upper
bound). Statsbeat (the SDK's own usage telemetry, not billed) is off; live metrics is not
ingestion.

Metrics are exported once per interval whatever the message rate; the run sets the interval to
an hour and flushes once at the end, so the metric bytes here are one interval's worth for the
whole run. The report also projects them to the steady state at `--rate` messages/s with the
default 60 s interval.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any
from urllib.parse import urlsplit

INGEST_HOST = "ingest.telemetry.invalid"
CONNECTION_STRING = ("InstrumentationKey=00000000-0000-0000-0000-000000000000;"
                     f"IngestionEndpoint=https://{INGEST_HOST}/;LiveEndpoint=http://127.0.0.1:9/")
KINDS = {"MessageData": "logs", "ExceptionData": "logs", "RequestData": "traces",
         "RemoteDependencyData": "traces", "MetricData": "metrics", "EventData": "logs"}
DEFAULT_INTERVAL_SECONDS = 60.0
HARNESS_LOGGERS = ("azure.monitor.opentelemetry.exporter._quickpulse",)


class IngestionRecorder:
    """Answers the exporters' requests to the ingestion endpoint and keeps their bodies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        # by kind, each envelope's share of its request
        self.body_bytes: defaultdict[str, float] = defaultdict(float)
        self.envelopes: Counter[str] = Counter()  # by kind
        self.by_type: Counter[str] = Counter()  # envelopes by baseType
        self.by_event: Counter[str] = Counter()  # log envelopes by customDimensions.event
        self.metric_names: Counter[str] = Counter()
        self.traces: set[str] = set()  # operation ids of the exported spans: the sampled traces
        # per span: (id, parent id, the function's name when it is a request span, bytes); per
        # consumer: log bytes. Resolved by `by_consumer` once the run is over.
        self.spans: list[tuple[str, str, str | None, float]] = []
        self.log_bytes_by_consumer: defaultdict[str, float] = defaultdict(float)
        self.samples: dict[str, list[Any]] = {}  # the first envelopes of each baseType
        # bytes by what each envelope is: a log's event, a span's name, a metric's name
        self.bytes_by_item: defaultdict[str, float] = defaultdict(float)
        self.keep_all = False
        self.all: list[Any] = []

    def install(self) -> None:
        import requests
        from azure.core.pipeline.transport import RequestsTransport
        from azure.core.rest._requests_basic import RestRequestsTransportResponse

        original = RequestsTransport.send
        recorder = self

        def send(transport: Any, request: Any, **kwargs: Any) -> Any:
            if urlsplit(request.url).hostname != INGEST_HOST:
                return original(transport, request, **kwargs)
            content = request.content
            body = content.encode("utf-8") if isinstance(content, str) else bytes(content or b"")
            count = recorder.record(body)
            answer = requests.Response()
            answer.status_code = 200
            answer.headers["Content-Type"] = "application/json"
            answer.raw = io.BytesIO(json.dumps({"itemsReceived": count, "itemsAccepted": count,
                                                "errors": []}).encode())
            return RestRequestsTransportResponse(request=request, internal_response=answer)

        RequestsTransport.send = send

    def record(self, body: bytes) -> int:
        items = json.loads(body)
        if isinstance(items, dict):
            items = [items]
        # Each envelope's share of the request: its own JSON length, scaled to the body's.
        sizes = [len(json.dumps(item)) for item in items]
        scale = len(body) / max(1, sum(sizes))
        with self.lock:
            self.requests += 1
            for item, size in zip(items, sizes, strict=True):
                base_type = item.get("data", {}).get("baseType", "?")
                samples = self.samples.setdefault(base_type, [])
                if len(samples) < 3:
                    samples.append(item)
                if self.keep_all:
                    self.all.append(item)
                kind = KINDS.get(base_type, "other")
                logger_name = str(item.get("data", {}).get("baseData", {}).get("properties", {})
                                  .get("logger_name", ""))
                if base_type == "ExceptionData" and not logger_name:
                    kind = "traces"  # an exception recorded on a span: the trace exporter's
                if logger_name.startswith(HARNESS_LOGGERS):
                    kind = "harness"  # the live-metrics ping to the closed port: not in Azure
                self.body_bytes[kind] += size * scale
                self.envelopes[kind] += 1
                self.by_type[base_type] += 1
                base = item.get("data", {}).get("baseData", {})
                label = f"{kind} {_label(base_type, base)}"
                self.bytes_by_item[label] += size * scale
                tags = item.get("tags", {})
                if kind == "traces":
                    self.traces.add(str(tags.get("ai.operation.id")))
                    self.spans.append((str(base.get("id", "")), str(tags.get("ai.operation.parentId", "")),
                                       str(base.get("name")) if base_type == "RequestData" else None,
                                       size * scale))
                if kind == "logs":
                    consumer = str(base.get("properties", {}).get("consumer") or "other")
                    self.log_bytes_by_consumer[consumer] += size * scale
                    self.by_event[str(base.get("properties", {}).get("event")
                                      or base.get("message", "")[:40])] += 1
                elif kind == "metrics":
                    for metric in base.get("metrics", []):
                        self.metric_names[metric.get("name", "?")] += 1
        return len(items)


    def by_consumer(self) -> dict[str, dict[str, float]]:
        """Log and trace bytes by the function they belong to: a log record by its `consumer`
        field, a span by the request span (the function's) it descends from; the rest "other"
        (maintenance, a span whose parent was not exported)."""
        parents = {span_id: parent for span_id, parent, _, _ in self.spans}
        functions = {span_id: name for span_id, _, name, _ in self.spans if name}
        result: defaultdict[str, dict[str, float]] = defaultdict(lambda: {"logs": 0.0, "traces": 0.0})
        for span_id, _, _, size in self.spans:
            current, seen = span_id, 0
            while current not in functions and current in parents and seen < 50:
                current, seen = parents[current], seen + 1
            result[functions.get(current, "other")]["traces"] += size
        for consumer, size in self.log_bytes_by_consumer.items():
            result[consumer]["logs"] += size
        return dict(result)


def _label(base_type: str, base: dict[str, Any]) -> str:
    """What an envelope is, for the byte breakdown: a log's event (or its message's first word),
    a span's name without its variable part, a metric's name."""
    if base_type in ("MessageData", "ExceptionData", "EventData"):
        event = base.get("properties", {}).get("event")
        if event:
            return str(event)
        text = str(base.get("message") or (base.get("exceptions") or [{}])[0].get("typeName", ""))
        return text.split(" ", 1)[0][:40] or base_type
    if base_type in ("RequestData", "RemoteDependencyData"):
        name = str(base.get("name", "?"))
        return f"{base_type[:-4]} {name.split('(', 1)[0].split('?', 1)[0][:60]}"
    metrics = base.get("metrics") or [{}]
    return str(metrics[0].get("name", "?"))[:60]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry_bytes",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--backend", choices=("table", "cosmos"), default="table")
    parser.add_argument("--messages", type=int, default=1000, help="Service Bus messages")
    parser.add_argument("--events", type=int, default=1000, help="Event Hubs events")
    parser.add_argument("--duplicate-rate", type=float, default=0.03)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--hostile", action="store_true", help="include the hostile-input cases")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--rate", type=float, default=1000.0,
                        help="messages/s for the steady-state projection of the metric bytes")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra app setting for the worker (repeatable)")
    parser.add_argument("--azure-sdk-log-level", choices=("WARNING", "INFO"),
                        help="set the `azure` loggers to this level before the run (default: what "
                             "the app sets)")
    parser.add_argument("--dump", help="write the first envelopes of each type to this JSON file")
    parser.add_argument("--dump-all", help="write every envelope to this JSON file")
    parser.add_argument("--json", help="write the figures to this file")
    return parser.parse_args(argv)


def _flush() -> None:
    from opentelemetry import metrics, trace
    from opentelemetry._logs import get_logger_provider

    for provider in (trace.get_tracer_provider(), get_logger_provider(), metrics.get_meter_provider()):
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            flush()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import logging

    os.environ["APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL"] = "true"
    os.environ["OTEL_METRIC_EXPORT_INTERVAL"] = str(3600 * 1000)  # one export, at the end
    logging.getLogger().setLevel(logging.INFO)  # what the Functions worker sets
    if args.azure_sdk_log_level:
        logging.getLogger("azure").setLevel(args.azure_sdk_log_level)
    recorder = IngestionRecorder()
    recorder.keep_all = bool(args.dump_all)
    recorder.install()

    import simulator.host as host_module
    from local_stack.worker import sample_settings
    from simulator.scenario import ScenarioConfig, run_scenario
    from simulator.stack import stack_for

    extra = dict(item.split("=", 1) for item in args.setting)

    def settings_with_telemetry(app_dir: Any) -> dict[str, str]:
        return {**sample_settings(app_dir), "APPLICATIONINSIGHTS_CONNECTION_STRING": CONNECTION_STRING,
                **extra}

    host_module.sample_settings = settings_with_telemetry
    config = ScenarioConfig(backend=args.backend, seed=args.seed, messages=args.messages,
                            events=args.events, duplicate_rate=args.duplicate_rate,
                            fault_rate=args.fault_rate, outages=0, hostile=args.hostile,
                            oversize_bytes=10 * 1024 * 1024 if args.hostile else 0)
    with stack_for(args.backend) as endpoints:
        started = time.perf_counter()
        result = run_scenario(config, endpoints)
        wall = time.perf_counter() - started
    _flush()
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    # The app configured the distro on import: the global tracer provider is the SDK's.
    distro_configured = isinstance(trace.get_tracer_provider(), TracerProvider)

    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as handle:
            json.dump(recorder.samples, handle, indent=1)
    if args.dump_all:
        with open(args.dump_all, "w", encoding="utf-8") as handle:
            json.dump(recorder.all, handle, indent=1)

    deliveries = sum(result.stats.deliveries.values())
    duplicates = sum(result.stats.duplicates.values())
    total = sum(value for kind, value in recorder.body_bytes.items() if kind != "harness")
    metrics_bytes = recorder.body_bytes["metrics"]
    per_message = {kind: round(recorder.body_bytes[kind] / max(1, deliveries), 1)
                   for kind in ("logs", "traces", "metrics")}
    per_interval = args.rate * DEFAULT_INTERVAL_SECONDS
    return {
        "workload": {"backend": args.backend, "messages": args.messages, "events": args.events,
                     "duplicateRate": args.duplicate_rate, "faultRate": args.fault_rate,
                     "hostile": args.hostile, "seed": args.seed, "settings": extra},
        "ok": result.ok, "distroConfigured": distro_configured,
        "deliveries": dict(result.stats.deliveries), "deliveriesTotal": deliveries,
        "duplicateDeliveries": duplicates,
        "duplicateShare": round(duplicates / max(1, deliveries), 4),
        "batches": result.stats.batches,
        "meanBatchSize": round(sum(result.stats.batch_sizes) / max(1, len(result.stats.batch_sizes)), 1),
        "wallSeconds": round(wall, 1),
        "requests": recorder.requests, "envelopes": dict(recorder.envelopes),
        "sampledTraces": len(recorder.traces),
        "envelopesByType": dict(recorder.by_type),
        "bytes": {kind: round(value) for kind, value in recorder.body_bytes.items()},
        "bytesTotal": round(total),
        "bytesPerMessage": per_message,
        "bytesPerMessageTotal": round(total / max(1, deliveries), 1),
        "metricBytesPerInterval": round(metrics_bytes),
        "steadyStatePerMessage": round(per_message["logs"] + per_message["traces"]
                                       + metrics_bytes / per_interval, 1),
        "steadyStateRate": args.rate,
        "bytesPerDeliveryByConsumer": {
            consumer: {kind: round(value / max(1, result.stats.deliveries.get(consumer, 0)), 1)
                       for kind, value in sizes.items()}
            for consumer, sizes in sorted(recorder.by_consumer().items())
            if result.stats.deliveries.get(consumer)},
        "bytesNotPerConsumer": {kind: round(sum(sizes[kind] for consumer, sizes in
                                                recorder.by_consumer().items()
                                                if not result.stats.deliveries.get(consumer)))
                                for kind in ("logs", "traces")},
        "logEvents": dict(recorder.by_event.most_common(20)),
        "bytesByItem": {label: round(value) for label, value in
                        sorted(recorder.bytes_by_item.items(), key=lambda kv: -kv[1])[:40]},
        "metricNames": dict(recorder.metric_names.most_common(30)),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2))
    print(f"\n{report['bytesPerMessageTotal']} bytes per message over {report['deliveriesTotal']:,} "
          f"deliveries (logs {report['bytesPerMessage']['logs']}, traces "
          f"{report['bytesPerMessage']['traces']}, metrics {report['bytesPerMessage']['metrics']}); "
          f"steady state at {report['steadyStateRate']:g} msg/s: {report['steadyStatePerMessage']}",
          file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0 if report["ok"] and report["distroConfigured"] else 1


if __name__ == "__main__":
    sys.exit(main())
