"""One telemetry export path: the app's own OpenTelemetry exporter, nothing else.

The choice (infra/README.md, "Telemetry"): host.json `telemetryMode: OpenTelemetry` plus the app
setting `PYTHON_ENABLE_OPENTELEMETRY=true`. With that flag the pinned Python worker
(azure-functions-runtime) reports the `WorkerOpenTelemetryEnabled` capability, and a host in
OpenTelemetry mode then drops the worker's log records instead of exporting them a second time;
the app exports them itself (azure-monitor-opentelemetry). `PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY`
stays unset: it makes the worker configure a second Azure Monitor exporter next to the app's.

The worker checks drive the real worker library in a child process the way the host's proxy
worker does (worker init, and the environment reload of a Flex Consumption specialization),
with the settings Bicep deploys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.infra.bicep_model import REPO, Unresolved, app_settings, evaluate, scope_of

HOST_JSON = REPO / "host.json"
SAMPLE = REPO / "local.settings.sample.json"
OTEL_FLAG = "PYTHON_ENABLE_OPENTELEMETRY"
WORKER_EXPORTER_FLAG = "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY"
CAPABILITY = "WorkerOpenTelemetryEnabled"
FAKE_CLIENT_ID = "11111111-2222-3333-4444-555555555555"


def _deployed_values() -> dict[str, str]:
    """The Bicep app settings with parameter defaults; runtime outputs get placeholder values."""
    scope = scope_of("resources.bicep", {"notificationApiUrl": "https://notify.example.test/api"})
    values = {}
    for key, expr in app_settings().items():
        try:
            values[key] = str(evaluate(expr, scope))
        except Unresolved:
            values[key] = f"<{key}>"
    return values


def _sample_values() -> dict[str, str]:
    return json.loads(SAMPLE.read_text())["Values"]


# --- The configuration ---------------------------------------------------------------------------
def test_host_runs_in_opentelemetry_mode():
    host = json.loads(HOST_JSON.read_text())
    assert host["telemetryMode"] == "OpenTelemetry"
    # Application Insights SDK settings would be inert in OpenTelemetry mode and suggest that the
    # host samples or forwards the app's records; keep them out.
    assert "applicationInsights" not in host.get("logging", {})


@pytest.mark.parametrize("source", ["bicep", "sample"])
def test_worker_flag_is_on_and_the_worker_exporter_is_off(source):
    values = _deployed_values() if source == "bicep" else _sample_values()
    assert values[OTEL_FLAG] == "true"
    assert WORKER_EXPORTER_FLAG not in values, f"{WORKER_EXPORTER_FLAG} would add a second exporter"
    assert "PYTHON_APPLICATIONINSIGHTS_LOGGER_NAME" not in values


def test_bicep_sets_the_flag_as_a_literal():
    """A literal, not a parameter: nobody turns the export path off by accident at deploy time."""
    assert app_settings()[OTEL_FLAG] == "true"


def test_app_exporter_authenticates_with_the_app_identity(monkeypatch):
    """Local auth is off on Application Insights: the exporter must find the identity in
    APPLICATIONINSIGHTS_AUTHENTICATION_STRING (the real exporter parses the deployed value)."""
    from azure.identity import ManagedIdentityCredential
    from azure.monitor.opentelemetry.exporter.export._base import _get_authentication_credential

    template = app_settings()["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]
    assert template == "ClientId=${identity.outputs.clientId};Authorization=AAD"
    monkeypatch.setenv("APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
                       template.replace("${identity.outputs.clientId}", FAKE_CLIENT_ID))
    credential = _get_authentication_credential()
    assert isinstance(credential, ManagedIdentityCredential)
    monkeypatch.setenv("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", "")
    assert _get_authentication_credential() is None, "counter-check: no identity without the setting"


# --- The pinned worker, driven like the host drives it ---------------------------------------------
_PROBE = textwrap.dedent("""
    import asyncio, json, os, sys, tempfile, types
    import azure.monitor.opentelemetry as distro
    calls = []
    distro.configure_azure_monitor = lambda **kw: calls.append(sorted(kw))
    from azure_functions_runtime import handle_event

    class Msg:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    class StatusResult(Msg):
        Success, Failure = 1, 0

    protos = types.SimpleNamespace(WorkerInitResponse=Msg, FunctionEnvironmentReloadResponse=Msg,
                                   WorkerMetadata=Msg, StatusResult=StatusResult)
    mode, env = sys.argv[1], json.loads(sys.argv[2])
    app_dir = tempfile.mkdtemp()
    props = {"host": "127.0.0.1", "protos": protos}
    if mode == "init":
        os.environ.update(env)
        inner = types.SimpleNamespace(capabilities={}, function_app_directory=app_dir)
        req = types.SimpleNamespace(request=types.SimpleNamespace(worker_init_request=inner),
                                    properties=props)
        resp = asyncio.run(handle_event.worker_init_request(req))
    else:
        inner = types.SimpleNamespace(function_app_directory=app_dir, environment_variables=env)
        req = types.SimpleNamespace(
            request=types.SimpleNamespace(function_environment_reload_request=inner), properties=props)
        resp = asyncio.run(handle_event.function_environment_reload_request(req))
    print(json.dumps({"status": resp.result.status, "capabilities": resp.capabilities,
                      "worker_exporters": len(calls), "environ": sorted(os.environ)}))
""")


def _run_worker(mode: str, env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in (OTEL_FLAG, WORKER_EXPORTER_FLAG, "APPLICATIONINSIGHTS_CONNECTION_STRING")}
    proc = subprocess.run([sys.executable, "-c", _PROBE, mode, json.dumps(env)], cwd=REPO, env=clean,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, "the worker reported a failed init"
    return result


def _telemetry_env(values: dict[str, str]) -> dict[str, str]:
    keys = (OTEL_FLAG, WORKER_EXPORTER_FLAG, "APPLICATIONINSIGHTS_CONNECTION_STRING",
            "APPLICATIONINSIGHTS_AUTHENTICATION_STRING")
    env = {k: values[k] for k in keys if k in values}
    env["APPLICATIONINSIGHTS_CONNECTION_STRING"] = "InstrumentationKey=00000000-0000-0000-0000-000000000000"
    return env


@pytest.mark.parametrize("mode", ["init", "reload"])
def test_deployed_settings_make_the_worker_stop_the_host_forwarding_and_export_nothing_itself(mode):
    """`reload` is the Flex Consumption path (placeholder specialization)."""
    result = _run_worker(mode, _telemetry_env(_deployed_values()))
    assert result["capabilities"].get(CAPABILITY) == "true", "the host would forward every record again"
    assert result["worker_exporters"] == 0, "the worker configured its own exporter next to the app's"


def test_counter_proofs_each_other_choice_exports_twice():
    deployed = _telemetry_env(_deployed_values())
    without_flag = {k: v for k, v in deployed.items() if k != OTEL_FLAG}
    result = _run_worker("init", without_flag)
    assert CAPABILITY not in result["capabilities"], "without the flag the host keeps forwarding"
    with_worker_exporter = {**deployed, WORKER_EXPORTER_FLAG: "true"}
    result = _run_worker("init", with_worker_exporter)
    assert result["worker_exporters"] == 1, "the worker exporter would run next to the app's"


def test_worker_environment_after_specialization_is_exactly_what_the_host_sends():
    """Why startup validation must not be gated on FUNCTIONS_WORKER_RUNTIME (an app setting Flex
    Consumption rejects): on specialization the worker clears os.environ and keeps only the
    variables the host passes, so a variable the host does not pass is simply absent."""
    result = _run_worker("reload", {OTEL_FLAG: "true", "ORDERS_QUEUE_NAME": "orders"})
    assert set(result["environ"]) == {OTEL_FLAG, "ORDERS_QUEUE_NAME"}
