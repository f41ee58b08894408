"""Telemetry export, and trace context carried from producer to consumer and downstream.

`configure_observability()` turns on the Azure Monitor OpenTelemetry distro (traces, metrics
and logs to Application Insights) when `APPLICATIONINSIGHTS_CONNECTION_STRING` is set, and does
nothing otherwise; call it once at import time of `function_app.py`. The distro is imported
lazily: a missing package with a connection string set is logged as a warning, never raised.

The trace sampler is always set explicitly (`sampling_ratio`, else `TRACE_SAMPLING_RATIO`, else
`DEFAULT_SAMPLING_RATIO`, to the distro's fixed-percentage sampler): the distro's own default
rate-limits, a share that changes with the load. Traces are only examples of where a message's
time went; logs and metrics are never sampled. `OTEL_TRACES_SAMPLER` still takes precedence.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

try:  # installed with the distro; without it nothing instruments HTTP, so nothing to suppress
    from opentelemetry.instrumentation.utils import suppress_http_instrumentation
except ImportError:  # pragma: no cover - the distro's dependency is in the app's lock
    suppress_http_instrumentation = None

from shared._core.keys import DedupKey, store_safe_id

CONNECTION_STRING_SETTING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
SAMPLING_RATIO_SETTING = "TRACE_SAMPLING_RATIO"
# Share of traces (message spans and their store dependencies) exported: 1 in 1,000.
DEFAULT_SAMPLING_RATIO = 0.001
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
CORRELATION_ID_HEADER = "X-Correlation-Id"
# Application properties that carry the producer's W3C trace context on a message.
# Azure SDK producers with tracing on set Diagnostic-Id (a traceparent value).
TRACE_PROPERTIES = ("traceparent", "Diagnostic-Id")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
_HEADER_SAFE = re.compile(r"^[\x21-\x7e]{1,255}$")

logger = logging.getLogger(__name__)
tracer = trace.get_tracer("idempotent-consumer")

_lock = threading.Lock()
_configured = False


def sampling_ratio_from(environ: Mapping[str, str] | None = None) -> float:
    """The trace sampling ratio of `TRACE_SAMPLING_RATIO`, or the default when unset; ValueError
    naming the setting when it is not a number in [0, 1]."""
    env = os.environ if environ is None else environ
    raw = (env.get(SAMPLING_RATIO_SETTING) or "").strip()
    if not raw:
        return DEFAULT_SAMPLING_RATIO
    try:
        ratio = float(raw)
    except ValueError as error:
        raise ValueError(f"{SAMPLING_RATIO_SETTING}={raw!r} is not a number") from error
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"{SAMPLING_RATIO_SETTING}={raw!r} must be between 0 and 1")
    return ratio


def configure_observability(*, connection_string: str | None = None,
                            environ: Mapping[str, str] | None = None,
                            configure: Callable[..., Any] | None = None,
                            sampling_ratio: float | None = None,
                            **options: Any) -> bool:
    """Configure Azure Monitor export once per process; a no-op without a connection string.

    `connection_string` and `sampling_ratio` default to their settings; `options` go to
    `configure_azure_monitor`, which `configure` replaces (tests). Returns True when export is
    on (now or from an earlier call).
    """
    global _configured
    env = os.environ if environ is None else environ
    connection_string = connection_string or env.get(CONNECTION_STRING_SETTING) or None
    if not connection_string:
        return False
    if sampling_ratio is None:
        sampling_ratio = sampling_ratio_from(env)
    with _lock:
        if _configured:
            return True
        if configure is None:
            try:  # the distro declares its keyword options untyped (**kwargs): hence the ignores
                from azure.monitor.opentelemetry import (
                    configure_azure_monitor,  # pyright: ignore[reportUnknownVariableType]
                )
            except ImportError:
                logger.warning("%s is set but azure-monitor-opentelemetry is not installed: "
                               "telemetry is not exported", CONNECTION_STRING_SETTING)
                return False
            configure = configure_azure_monitor  # pyright: ignore[reportUnknownVariableType]
        configure(connection_string=connection_string, sampling_ratio=sampling_ratio, **options)
        _configured = True
        return True


@contextmanager
def sdk_request() -> Generator[None]:
    """Around an Azure SDK request sent through a client's pipeline directly (the Table `$batch`
    codec): azure-core traces it, so HTTP instrumentation must record no second span of it."""
    with nullcontext() if suppress_http_instrumentation is None else suppress_http_instrumentation():
        yield


# -- trace context in -----------------------------------------------------------------
def incoming_traceparent(properties: Mapping[str, Any] | None) -> str | None:
    """The producer's W3C traceparent from a message's application properties, if valid."""
    for name in TRACE_PROPERTIES:
        for key, value in (properties or {}).items():
            if str(key).lower() == name.lower() and isinstance(value, (str, bytes)):
                text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
                text = text.strip().lower()
                if _TRACEPARENT.match(text) and not text.startswith("ff"):
                    return text
    return None


def context_from_message(properties: Mapping[str, Any] | None) -> otel_context.Context | None:
    """An OpenTelemetry context whose parent is the producer's span, or None."""
    parent = incoming_traceparent(properties)
    if parent is None:
        return None
    carrier = {"traceparent": parent}
    state = next((v for k, v in (properties or {}).items()
                  if str(k).lower() == "tracestate" and isinstance(v, str)), None)
    if state:
        carrier["tracestate"] = state
    return TraceContextTextMapPropagator().extract(carrier)


@contextmanager
def message_span(name: str, *, properties: Mapping[str, Any] | None = None,
                 key: DedupKey | None = None, message_id: str | None = None,
                 correlation_id: str | None = None,
                 attributes: Mapping[str, Any] | None = None) -> Generator[trace.Span]:
    """A CONSUMER span for one message, child of the producer's span when the message has one.

    Without a tracer provider the span does not record, but the producer's trace context still
    becomes current, so `downstream_headers` passes it on.
    """
    span_attributes: dict[str, Any] = {k: v for k, v in (attributes or {}).items() if v is not None}
    if message_id is not None:
        span_attributes["messaging.message.id"] = message_id
    if correlation_id is not None:
        span_attributes["messaging.message.conversation_id"] = correlation_id
    if key is not None:
        span_attributes["dedup.consumer"] = key.consumer
        span_attributes["dedup.key"] = key.encoded
    with tracer.start_as_current_span(name, context=context_from_message(properties),
                                      kind=trace.SpanKind.CONSUMER,
                                      attributes=span_attributes) as span:
        yield span


@contextmanager
def batch_span(name: str, *, partition_id: str, events: int,
               attributes: Mapping[str, Any] | None = None) -> Generator[trace.Span]:
    """A CONSUMER span for one Event Hubs batch of `events` events from one partition. The
    events' producer contexts are not linked: a link per event would bloat the exported span."""
    span_attributes: dict[str, Any] = {
        "messaging.system": "eventhubs", "messaging.destination.partition.id": partition_id,
        "messaging.batch.message_count": events,
        **{k: v for k, v in (attributes or {}).items() if v is not None}}
    with tracer.start_as_current_span(name, kind=trace.SpanKind.CONSUMER,
                                      attributes=span_attributes) as span:
        yield span


# -- trace context out ------------------------------------------------------------------
def idempotency_key_value(key: DedupKey | str, operation: str | None = None) -> str:
    """Header-safe `Idempotency-Key` for one downstream call of one message: a DedupKey's
    store-safe encoding, plus `operation` when one message makes several distinct calls to the
    same service."""
    value = key.encoded if isinstance(key, DedupKey) else str(key)
    if not _HEADER_SAFE.match(value):
        value = store_safe_id(value)
    if operation:
        value = f"{value}:{store_safe_id(operation)}"
        if len(value) > 255:
            value = store_safe_id(value)
    return value


def downstream_headers(key: DedupKey | str, correlation_id: str | None = None, *,
                       operation: str | None = None,
                       properties: Mapping[str, Any] | None = None,
                       headers: Mapping[str, str] | None = None) -> dict[str, str]:
    """Headers for a call the consumer makes: Idempotency-Key + trace context, from the
    configured propagators, or the message's own `traceparent`/`Diagnostic-Id` (`properties`)
    when no span is current, so the trace is not broken."""
    out = dict(headers or {})
    out[IDEMPOTENCY_KEY_HEADER] = idempotency_key_value(key, operation)
    if correlation_id:
        out[CORRELATION_ID_HEADER] = correlation_id
    propagate.inject(out)
    if "traceparent" not in out:
        parent = incoming_traceparent(properties)
        if parent is not None:
            out["traceparent"] = parent
    return out
