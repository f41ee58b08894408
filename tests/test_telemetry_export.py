"""One export path, counted: each of the app's records reaches the exporter once, and a processed
message reaches it as a metric point, not as a record.

Through the real worker and the real azure-monitor-opentelemetry distro, in a
fresh process (tests/support/telemetry_probe.py). The host's forwarding of
worker logs, the path that doubled every record before, is switched off by the
`WorkerOpenTelemetryEnabled` capability together with host.json's
`telemetryMode: OpenTelemetry` (tests/infra/test_infra_telemetry.py): the
second test shows the capability disappears without the app setting.
"""

from __future__ import annotations

from tests.support.telemetry_probe import probe


def test_each_app_record_is_exported_exactly_once_and_processed_messages_only_as_metrics():
    report = probe()
    assert report["ok"] and report["settled"] == ["complete", "deadletter"]
    conflicts = [name for name in report["exported"] if name.startswith("IdempotencyKeyConflict:")]
    assert len(conflicts) == 1, report["exported"]
    assert set(report["exported"].values()) == {1}, report["exported"]
    # The processed order is no log record at the app's level: it is one point on the metric.
    assert not [name for name in report["exported"] if name.startswith("DedupOutcome:")], report
    assert report["messages"] == {"processed": 1, "conflict": 1}, report["messages"]
    assert report["capabilities"].get("WorkerOpenTelemetryEnabled") == "true"


def test_without_the_app_setting_the_worker_would_let_the_host_forward_a_second_copy():
    report = probe(otel_flag=False)
    assert "WorkerOpenTelemetryEnabled" not in report["capabilities"]
