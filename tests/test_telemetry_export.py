"""One export path, counted: each of the app's records reaches the exporter once per invocation.

Through the real worker and the real azure-monitor-opentelemetry distro, in a
fresh process (tests/support/telemetry_probe.py). The host's forwarding of
worker logs, the path that doubled every record before, is switched off by the
`WorkerOpenTelemetryEnabled` capability together with host.json's
`telemetryMode: OpenTelemetry` (tests/infra/test_infra_telemetry.py): the
second test shows the capability disappears without the app setting.
"""

from __future__ import annotations

from tests.support.telemetry_probe import probe


def test_one_invocation_exports_each_app_record_exactly_once():
    report = probe()
    assert report["ok"] and report["settled"] == ["complete"]
    outcomes = [name for name in report["exported"] if name.startswith("DedupOutcome:")]
    assert len(outcomes) == 1, report["exported"]
    assert set(report["exported"].values()) == {1}, report["exported"]
    assert report["capabilities"].get("WorkerOpenTelemetryEnabled") == "true"


def test_without_the_app_setting_the_worker_would_let_the_host_forward_a_second_copy():
    report = probe(otel_flag=False)
    assert "WorkerOpenTelemetryEnabled" not in report["capabilities"]
