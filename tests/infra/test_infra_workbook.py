"""The workbook: deployed next to Application Insights, and every chart reads what the app emits.

Metric names come from shared/_core/telemetry.py's METRIC_* constants and event names from its EVENT_*
constants, so a renamed metric or event fails here instead of leaving an empty chart. Where the
metric points land is checked against the real exporter: the app's telemetry is recorded on an SDK
meter provider and each point converted by azure-monitor-opentelemetry's metric exporter, which
decides the Application Insights item (MetricData = `customMetrics`), its `name` and the
customDimensions a query may read.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.infra.bicep_model import INFRA, body, module_params, of_type, parse

WORKBOOK = "core/workbook.bicep"
WORKBOOK_JSON = INFRA / "core" / "workbook.json"
# Item types of the workbook format: 1 text, 3 query, 9 parameters.
QUERY_ITEM = 3
TABLES = ("customMetrics", "traces")
# Every chart the issue asks for, by a phrase of its title.
CHARTS = (
    "messages by consumer and outcome",
    "duplicates by cause",
    "key conflicts",
    "parked and dead-lettered",
    "store latency by backend",
    "mark lag per partition",
)


def _workbook() -> dict[str, Any]:
    return json.loads(WORKBOOK_JSON.read_text())


def _queries() -> list[dict[str, Any]]:
    return [item["content"] for item in _workbook()["items"] if item["type"] == QUERY_ITEM]


def _constants(prefix: str) -> set[str]:
    from shared._core import telemetry

    return {value for name, value in vars(telemetry).items()
            if name.startswith(prefix) and isinstance(value, str)}


def _tables(query: str) -> set[str]:
    return {t for t in TABLES if re.search(rf"^\s*{t}\b", query, re.M)}


def _metric_names(query: str) -> set[str]:
    names = set(re.findall(r'\bwhere name\s*==\s*"([^"]+)"', query))
    for group in re.findall(r'\bwhere name\s+in\s*\(([^)]*)\)', query):
        names |= set(re.findall(r'"([^"]+)"', group))
    return names


def _event_names(query: str) -> set[str]:
    names = set(re.findall(r'customDimensions\.event\)\s*==\s*"([^"]+)"', query))
    for group in re.findall(r'customDimensions\.event\)\s*in\s*\(([^)]*)\)', query):
        names |= set(re.findall(r'"([^"]+)"', group))
    return names


def _dimensions(query: str) -> set[str]:
    return set(re.findall(r"customDimensions\.(\w+)", query))


# --- Bicep ---------------------------------------------------------------------------------------
def test_workbook_is_a_shared_workbook_of_the_application_insights_component():
    (workbook,) = of_type(WORKBOOK, "Microsoft.Insights/workbooks").values()
    config = body(workbook)
    assert config["kind"] == "shared"
    props = config["properties"]
    assert props["category"] == "workbook"
    assert props["sourceId"]["function"]["parameters"]["string_to_change"] == "applicationInsightsId"
    # The name of a workbook must be a GUID: derived from the component, stable across deployments.
    assert config["name"]["function"]["type"] == "guid"
    data = parse(WORKBOOK)["variables"]["serializedData"]["value"]["function"]
    assert data["type"] == "replace"
    loaded = data["parameters"]["original_string"]["function"]
    assert loaded["type"] == "load_text_content"
    assert (INFRA / "core" / loaded["parameters"]["file_path"]) == WORKBOOK_JSON
    placeholder = data["parameters"]["old_string"]
    assert data["parameters"]["new_string"] == "applicationInsightsId"
    assert _workbook()["fallbackResourceIds"] == [placeholder]


def test_resources_wire_the_workbook_to_the_component():
    params = module_params("resources.bicep", "workbook")
    assert params["applicationInsightsId"] == {
        "operator": {"type": "property_accessor", "operands": {
            "operand_1": "monitoring",
            "operand_2": {"operator": {"type": "property_accessor", "operands": {
                "operand_1": "outputs", "operand_2": "applicationInsightsId"}}}}}}


# --- The charts ----------------------------------------------------------------------------------
def test_workbook_json_is_a_notebook_with_a_time_range():
    workbook = _workbook()
    assert workbook["version"] == "Notebook/1.0"
    (parameters,) = [i for i in workbook["items"] if i["type"] == 9]
    assert [p["name"] for p in parameters["content"]["parameters"]] == ["TimeRange"]
    for query in _queries():
        assert query["timeContextFromParameter"] == "TimeRange", query["title"]
        assert query["resourceType"] == "microsoft.insights/components", query["title"]


def test_every_asked_for_chart_is_there():
    titles = [q["title"].lower() for q in _queries()]
    for chart in CHARTS:
        assert any(chart in title for title in titles), f"no chart of {chart}: {titles}"


def test_every_query_reads_one_table_the_app_writes():
    for query in _queries():
        tables = _tables(query["query"])
        assert len(tables) == 1, (query["title"], tables)


def test_every_metric_query_names_a_metric_the_app_emits():
    emitted = _constants("METRIC_")
    seen = set()
    for query in _queries():
        if _tables(query["query"]) != {"customMetrics"}:
            continue
        names = _metric_names(query["query"])
        assert names, f"{query['title']}: no metric name"
        assert names <= emitted, f"{query['title']} names {names - emitted}, emitted: {sorted(emitted)}"
        seen |= names
    from shared._core import telemetry

    # The metrics the operators asked for are all charted.
    assert {telemetry.METRIC_MESSAGES, telemetry.METRIC_STORE_LATENCY, telemetry.METRIC_PARKED,
            telemetry.METRIC_DEAD_LETTERED, telemetry.METRIC_MARK_LAG} <= seen


def test_every_trace_query_names_an_event_the_app_logs():
    from shared._core import telemetry

    emitted = _constants("EVENT_")
    seen = set()
    for query in _queries():
        if _tables(query["query"]) != {"traces"}:
            continue
        names = _event_names(query["query"])
        assert names, f"{query['title']}: no event filter"
        assert names <= emitted, f"{query['title']} names {names - emitted}"
        seen |= names
    assert {telemetry.EVENT_CONFLICT, telemetry.EVENT_PARKED, telemetry.EVENT_DEAD_LETTERED} <= seen


@pytest.fixture(scope="module")
def exported_metrics() -> dict[str, set[str]]:
    """customDimensions keys per metric name, as the Azure Monitor exporter makes them of the app's
    own telemetry calls (every outcome, a parked and a dead-lettered message, a replay skip, the
    mark lag, the results of a full-state event applied by version)."""
    from azure.monitor.opentelemetry.exporter.export.metrics._exporter import _convert_point_to_envelope
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from shared._core.keys import DedupKey
    from shared._core.records import Outcome, OutcomeStatus
    from shared._core.telemetry import Telemetry

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(meter_provider=provider)
    key = DedupKey("orders", "order-1")
    for status in OutcomeStatus:
        telemetry.outcome(Outcome(status, key, "hash"), latency=0.002, backend="cosmos",
                          context={"delivery_count": 2})
    telemetry.parked(consumer="payments", reason="MaxAttempts")
    telemetry.dead_lettered(consumer="orders", reason="StoreRejected")
    telemetry.replay_skipped(3, consumer="payments", partition_id="0")
    telemetry.mark_lagging(1.0, consumer="payments", partition_id="0")
    for result in ("applied", "unchanged", "stale"):
        telemetry.versioned(result, consumer="order_status", backend="cosmos", delivery_count=2)
    found: dict[str, set[str]] = {}
    for resource_metrics in reader.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    envelope = _convert_point_to_envelope(point, metric.name)
                    assert envelope.data.base_type == "MetricData"  # the customMetrics table
                    data: Any = envelope.data.base_data  # a MetricsData (typed as its base class)
                    (data_point,) = data.metrics
                    found.setdefault(data_point.name, set()).update(data.properties)
    provider.shutdown()
    return found


def test_metric_queries_read_only_dimensions_the_exporter_writes(exported_metrics):
    """A chart split by an attribute the app never sets draws one empty series."""
    checked = 0
    for query in _queries():
        if _tables(query["query"]) != {"customMetrics"}:
            continue
        for name in _metric_names(query["query"]):
            if name not in exported_metrics:
                continue  # emitted by code this test does not drive (checked by name above)
            missing = _dimensions(query["query"]) - exported_metrics[name]
            assert not missing, f"{query['title']}: {name} has no dimension {missing}"
            checked += 1
    assert checked >= 6  # every metric chart, the mark lag included


def test_duplicate_chart_splits_by_the_cause_the_app_records(exported_metrics):
    from shared._core import telemetry

    assert "cause" in exported_metrics[telemetry.METRIC_MESSAGES]
    (query,) = [q for q in _queries() if "duplicates by cause" in q["title"].lower()]
    assert '"duplicate"' in query["query"] and "customDimensions.cause" in query["query"]


def test_latency_query_uses_the_histogram_columns():
    """Histograms land as valueSum/valueCount/valueMin/valueMax per export interval."""
    (query,) = [q for q in _queries() if "store latency" in q["title"].lower()]
    text = query["query"]
    assert "valueSum / valueCount" in text and "valueMax" in text
    assert "customDimensions.backend" in text
