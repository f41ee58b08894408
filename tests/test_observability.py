"""Azure Monitor configuration (only with a connection string) and downstream headers."""

from __future__ import annotations

import logging
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider

from shared._core.keys import DedupKey
from shared._core.observability import (
    CONNECTION_STRING_SETTING,
    DEFAULT_SAMPLING_RATIO,
    SAMPLING_RATIO_SETTING,
    configure_observability,
    context_from_message,
    downstream_headers,
    idempotency_key_value,
    incoming_traceparent,
    message_span,
)
from tests.support import observability as support_observability

PRODUCER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CONN = "InstrumentationKey=00000000-0000-0000-0000-000000000000"


@pytest.fixture(autouse=True)
def _fresh():
    support_observability.reset()
    yield
    support_observability.reset()


def test_no_connection_string_is_a_no_op():
    calls = []
    assert configure_observability(environ={}, configure=lambda **kw: calls.append(kw)) is False
    assert calls == []
    assert not support_observability.configured()


def test_connection_string_configures_once():
    calls = []
    env = {CONNECTION_STRING_SETTING: CONN}
    assert configure_observability(environ=env, configure=lambda **kw: calls.append(kw),
                                   logger_name="shared") is True
    assert configure_observability(environ=env, configure=lambda **kw: calls.append(kw)) is True
    assert calls == [{"connection_string": CONN, "sampling_ratio": DEFAULT_SAMPLING_RATIO,
                      "logger_name": "shared"}]
    assert support_observability.configured()


def test_the_sampler_is_always_explicit():
    """The distro's implicit sampler rate-limits (5 traces/s): a share of messages that depends
    on the load. The ratio is always passed: the setting, an explicit value, or the default."""
    def ratio(env, **kwargs):
        support_observability.reset()
        calls = []
        configure_observability(environ={CONNECTION_STRING_SETTING: CONN, **env},
                                configure=lambda **kw: calls.append(kw), **kwargs)
        return calls[0]["sampling_ratio"]

    assert ratio({}) == DEFAULT_SAMPLING_RATIO
    assert ratio({SAMPLING_RATIO_SETTING: "0.25"}) == 0.25
    assert ratio({SAMPLING_RATIO_SETTING: "0.25"}, sampling_ratio=1.0) == 1.0
    for bad in ("1.5", "-0.1", "all"):
        with pytest.raises(ValueError, match=SAMPLING_RATIO_SETTING):
            ratio({SAMPLING_RATIO_SETTING: bad})


def test_missing_distro_warns_and_does_not_raise(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "azure.monitor.opentelemetry", None)  # import fails
    with caplog.at_level(logging.WARNING, logger="shared._core.observability"):
        assert configure_observability(connection_string=CONN) is False
    assert "azure-monitor-opentelemetry is not installed" in caplog.text


def test_headers_carry_the_key_and_the_current_span():
    key = DedupKey.from_message_id("notify", "msg 1/2")
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("send") as span:
        headers = downstream_headers(key, "corr-7", headers={"Content-Type": "application/json"})
    context = span.get_span_context()
    assert headers["Idempotency-Key"] == key.encoded == "notify|msg!201!2F2"
    assert headers["X-Correlation-Id"] == "corr-7"
    assert headers["Content-Type"] == "application/json"
    assert headers["traceparent"] == (f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                                      f"{int(context.trace_flags):02x}")
    assert int(context.trace_flags) & 0x01  # sampled


def test_headers_without_a_span_pass_the_message_trace_on():
    key = DedupKey.from_message_id("notify", "m-1")
    assert "traceparent" not in downstream_headers(key)
    headers = downstream_headers(key, properties={"Diagnostic-Id": PRODUCER})
    assert headers["traceparent"] == PRODUCER


def test_message_span_continues_the_producer_trace():
    key = DedupKey.from_message_id("notify", "m-2")
    with message_span("notify process", properties={"Diagnostic-Id": PRODUCER}, key=key,
                      message_id="m-2", correlation_id="c"):
        headers = downstream_headers(key)
    assert headers["traceparent"].split("-")[1] == PRODUCER.split("-")[1]


def test_incoming_trace_context_is_validated():
    assert incoming_traceparent({"traceparent": PRODUCER}) == PRODUCER
    assert incoming_traceparent({"diagnostic-id": PRODUCER.upper()}) == PRODUCER
    assert incoming_traceparent({"Diagnostic-Id": "|abc.1."}) is None  # legacy Request-Id format
    assert incoming_traceparent({"traceparent": "ff" + PRODUCER[2:]}) is None
    assert incoming_traceparent(None) is None
    assert context_from_message({}) is None
    assert context_from_message({"traceparent": PRODUCER}) is not None


def test_idempotency_key_values_are_header_safe():
    key = DedupKey.from_message_id("orders", "ümlaut key")
    assert idempotency_key_value(key) == key.encoded
    assert idempotency_key_value(key, "charge") == f"{key.encoded}:charge"
    assert idempotency_key_value("plain-key_1") == "plain-key_1"
    unsafe = idempotency_key_value("two words\r\n")
    assert all(0x21 <= ord(c) <= 0x7E for c in unsafe)
    assert len(idempotency_key_value("x" * 1000)) <= 255


def test_the_real_distro_configures_export_in_a_fresh_process():
    """azure-monitor-opentelemetry (a runtime dependency) sets up the SDK providers.

    Run in a subprocess: it installs process-global providers. The ingestion
    endpoint is a closed loopback port; nothing is exported during the test.
    """
    import os
    import subprocess
    import sys

    script = (
        "from opentelemetry import metrics, trace\n"
        "from shared._core.observability import configure_observability\n"
        "ok = configure_observability(connection_string='InstrumentationKey="
        "00000000-0000-0000-0000-000000000000;IngestionEndpoint=http://127.0.0.1:9/',"
        " disable_offline_storage=True, sampling_ratio=0.05)\n"
        "print(ok, type(trace.get_tracer_provider()).__module__,"
        " type(metrics.get_meter_provider()).__module__,"
        " trace.get_tracer_provider().sampler.get_description())\n"
    )
    # Not the environment an in-process worker left behind (an empty connection string there
    # makes the exporter refuse the explicit one).
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLICATIONINSIGHTS_")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True, env=env)
    assert result.stdout.split()[:3] == ["True", "opentelemetry.sdk.trace",
                                         "opentelemetry.sdk.metrics._internal"]
    # The distro's fixed-percentage sampler with the app's ratio, not its rate-limited default.
    assert result.stdout.split()[3] == "ApplicationInsightsSampler0.05", result.stdout
