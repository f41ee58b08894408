"""The app as the real worker indexes, reports and loads it, with only the sample settings.

Each check reads what the worker itself answered (worker init, functions
metadata, function load), in a fresh process whose environment holds only
`local.settings.sample.json` (`tests.support.worker_probe`).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from local_stack.worker import sample_settings
from tests.support.worker_probe import ROOT, probe

FUNCTIONS = {"orders", "order_status", "notify", "audit", "payments", "balance_projection",
             "http_payments", "maintenance", "order_audit"}
SERVICE_BUS = {"orders": {"queueName": "%ORDERS_QUEUE_NAME%"},
               "order_status": {"queueName": "%ORDER_STATUS_QUEUE_NAME%"},
               "balance_projection": {"queueName": "%BALANCE_CHANGES_QUEUE%"},
               "notify": {"topicName": "%NOTIFICATIONS_TOPIC_NAME%",
                          "subscriptionName": "%NOTIFY_SUBSCRIPTION_NAME%"},
               "audit": {"topicName": "%NOTIFICATIONS_TOPIC_NAME%",
                         "subscriptionName": "%AUDIT_SUBSCRIPTION_NAME%"}}
APP_FILES = ("function_app.py", "functions", "shared", "domain", "host.json",
             "local.settings.sample.json", "requirements.txt")


def assert_worker_loads_the_app(report: dict[str, Any]) -> None:
    """Init (indexing) succeeded, every function is reported and loaded."""
    assert report["init"]["status"] == "Success", report["init"]["message"]
    assert set(report["functions"]) == FUNCTIONS
    assert {name: status["status"] for name, status in report["loads"].items()} == \
        dict.fromkeys(FUNCTIONS, "Success")


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return probe(ROOT)


def trigger(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(b for b in report["functions"][name]["raw_bindings"] if b["type"].endswith("Trigger"))


def test_worker_init_metadata_and_load_succeed_with_only_the_sample_settings(report):
    assert_worker_loads_the_app(report)
    assert report["worker"] == {"runtime_name": "python", "runtime_version": "3.13",
                                "worker_version": "1.3.0"}
    for meta in report["functions"].values():
        assert meta["language"] == "python" and meta["script_file"] == "function_app.py"
        assert meta["properties"] == {"worker_indexed": "True"}


def test_every_setting_a_binding_names_resolves_from_the_sample_settings(report):
    settings = sample_settings(ROOT)
    for name, meta in report["functions"].items():
        for binding in meta["raw_bindings"]:
            for value in binding.values():
                for setting in re.findall(r"%([^%]+)%", str(value)):
                    assert settings.get(setting), f"{name}: %{setting}% is not in the sample settings"
            if "connection" in binding:
                assert settings.get(binding["connection"]), f"{name}: {binding['connection']}"


def test_service_bus_triggers_settle_explicitly_with_the_sdk_type_binding(report):
    for name, names in SERVICE_BUS.items():
        binding = trigger(report, name)
        assert binding["type"] == "serviceBusTrigger" and binding["direction"] == "IN"
        assert binding["connection"] == "ServiceBusConnection"
        assert binding["autoCompleteMessages"] is False
        assert binding["properties"] == {"SupportsDeferredBinding": True}
        assert {key: binding[key] for key in names} == names
        # message_actions is no binding: the worker injects ServiceBusMessageActions.
        assert report["functions"][name]["bindings"] == {
            "message": {"type": "serviceBusTrigger", "direction": "in", "data_type": "undefined"}}
        assert report["functions"][name]["retry"] is None


def test_payments_takes_batches_and_reports_its_retry_policy(report):
    binding = trigger(report, "payments")
    assert binding["type"] == "eventHubTrigger" and binding["direction"] == "IN"
    assert binding["cardinality"].lower() == "many"
    assert binding["connection"] == "EventHubConnection"
    assert binding["eventHubName"] == "%PAYMENTS_HUB_NAME%"
    assert binding["consumerGroup"] == "%PAYMENTS_CONSUMER_GROUP%"
    assert "properties" not in binding  # a built-in type (EventHubEvent), no deferred binding
    assert report["functions"]["payments"]["retry"] == {
        "strategy": "exponential_backoff", "max_retry_count": -1, "minimum_interval": 5.0,
        "maximum_interval": 300.0, "delay_interval": None}


def test_order_audit_is_a_storage_queue_trigger_on_the_hosts_connection(report):
    """A built-in binding (azure.functions.QueueMessage): no deferred binding, no retry policy
    (the queue's own redelivery and maxDequeueCount are the retries)."""
    binding = trigger(report, "order_audit")
    assert binding == {"direction": "IN", "type": "queueTrigger", "name": "message",
                       "queueName": "%ORDER_AUDIT_QUEUE_NAME%", "connection": "AzureWebJobsStorage"}
    assert report["functions"]["order_audit"]["bindings"] == {
        "message": {"type": "queueTrigger", "direction": "in", "data_type": "undefined"}}
    assert report["functions"]["order_audit"]["retry"] is None


def test_http_and_timer_bindings(report):
    http = report["functions"]["http_payments"]
    assert trigger(report, "http_payments") == {
        "direction": "IN", "type": "httpTrigger", "name": "req", "methods": ["POST"],
        "authLevel": "FUNCTION", "route": "payments"}
    assert http["bindings"]["$return"] == {"type": "http", "direction": "out",
                                           "data_type": "undefined"}
    timer = trigger(report, "maintenance")
    assert timer["schedule"] == "%MAINTENANCE_SCHEDULE%" and timer["runOnStartup"] is False
    assert timer["useMonitor"] is True
    for name in FUNCTIONS - {"payments"}:
        assert report["functions"][name]["retry"] is None


def copy_app(target: Path) -> Path:
    for name in APP_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target / name)
    return target


def test_a_refused_annotation_fails_the_whole_app_and_the_check_above(tmp_path):
    """Regression: `list[func.EventHubEvent]` (not a class, not a typing generic) loads nothing."""
    app = copy_app(tmp_path)
    payments = app / "functions" / "payments.py"
    source = payments.read_text("utf-8")
    reverted = source.replace("typing.List[func.EventHubEvent]", "list[func.EventHubEvent]")
    assert reverted != source, "the annotation this test reverts is gone: update the test"
    payments.write_text(reverted, "utf-8")

    broken = probe(app)

    assert broken["init"]["status"] == "Failure"
    assert "cannot load the payments function" in broken["init"]["message"]
    assert "invalid non-type annotation list[azure.functions._eventhub.EventHubEvent]" in \
        broken["init"]["message"]
    assert broken["functions"] == {}
    with pytest.raises(AssertionError):
        assert_worker_loads_the_app(broken)


def test_the_unmodified_copy_loads(tmp_path):
    """The copy itself is sound: only the reverted annotation breaks it."""
    assert_worker_loads_the_app(probe(copy_app(tmp_path)))
