"""Alert rules: each log alert reads one table (where the app's records really land), fires on new
events of its window, and says what it watches; the dead-letter metric alert never goes quiet
while a dead-letter queue holds messages.

The tables are checked against the real exporter: the app's own telemetry calls are run through
azure-monitor-opentelemetry's log and metric exporter conversions, which decide the Application
Insights item type (MessageData = `traces`, MetricData = `customMetrics`), its name and its
customDimensions. The event rules read `traces`; the duplicate spike rule reads the
`dedup.messages` metric, since duplicates are no longer one log record each.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from tests.infra.bicep_model import (
    ENTITY_SETTINGS,
    INFRA,
    LOG_EVENTS,
    REPO,
    bicep_files,
    body,
    evaluate,
    module_params,
    of_type,
    parse,
    scope_of,
)

ALERTS = "core/alerts.bicep"
# Application Insights (classic and workspace) tables a query could name.
KNOWN_TABLES = {
    "traces", "customEvents", "requests", "exceptions", "dependencies", "customMetrics",
    "pageViews", "availabilityResults", "AppTraces", "AppEvents", "AppExceptions", "AppRequests",
    "AppDependencies", "AzureMetrics", "AzureDiagnostics",
}
# The rule watching each event, and what its name must say.
EVENT_RULES = {
    "keyConflict": ("keyConflictAlert", ("conflict",)),
    "parked": ("parkedAlert", ("parked", "payments", "notifications")),
    "deadLettered": ("deadLetteredAlert", ("dead-lettered",)),
    "duplicate": ("duplicateSpikeAlert", ("duplicate", "spike")),
    "sequenceReset": ("sequenceResetAlert", ("sequence", "event hub", "restarted")),
}
NEW_EVENT_RULES = ("keyConflict", "parked", "deadLettered", "sequenceReset")
MESSAGES_METRIC = "dedup.messages"
APP_CODE_DIRS = ("shared", "domain", "functions")


def _query_rules():
    scope = scope_of(ALERTS)
    rules = {}
    for symbol, res in of_type(ALERTS, "Microsoft.Insights/scheduledQueryRules").items():
        (criterion,) = body(res)["properties"]["criteria"]["allOf"]
        rules[symbol] = (body(res), evaluate(criterion["query"], scope), criterion)
    return rules


def _tables(query: str) -> set[str]:
    return {t for t in KNOWN_TABLES if re.search(rf"(?<![\w.]){t}(?![\w])", query)}


def _event_filter(event: str) -> str:
    return f'tostring(customDimensions.event) == "{event}"'


# --- Event names ---------------------------------------------------------------------------------
def test_event_names_are_declared_once():
    assert parse(ALERTS)["variables"]["logEvents"]["value"] == LOG_EVENTS
    for relative in bicep_files():
        code = [line for line in (INFRA / relative).read_text().splitlines()
                if not line.lstrip().startswith("//")]
        for event in LOG_EVENTS.values():
            hits = [line for line in code if event in line]
            expected = 1 if relative == ALERTS else 0
            assert len(hits) == expected, f"{relative} names {event} outside the logEvents variable"


def test_event_names_match_the_app_telemetry():
    from shared._core import telemetry

    assert LOG_EVENTS["keyConflict"] == telemetry.EVENT_CONFLICT
    assert LOG_EVENTS["parked"] == telemetry.EVENT_PARKED
    assert LOG_EVENTS["duplicate"] == telemetry.EVENT_DUPLICATE
    dead_lettered = getattr(telemetry, "EVENT_DEAD_LETTERED", LOG_EVENTS["deadLettered"])
    assert dead_lettered == LOG_EVENTS["deadLettered"]
    assert LOG_EVENTS["sequenceReset"] == telemetry.EVENT_SEQUENCE_RESET


def test_the_app_emits_every_watched_event():
    """An alert on an event no code emits can never fire."""
    sources = "\n".join(p.read_text() for d in APP_CODE_DIRS for p in sorted((REPO / d).rglob("*.py")))
    for name, event in LOG_EVENTS.items():
        assert f'"{event}"' in sources, f"no app code emits {event} ({name})"


# --- Where the records land ----------------------------------------------------------------------
@pytest.fixture
def exported():
    """Envelopes the real Azure Monitor log exporter makes of the app's telemetry records."""
    from azure.monitor.opentelemetry.exporter.export.logs._exporter import _convert_log_to_envelope
    from opentelemetry.instrumentation.logging.handler import LoggingHandler  # the distro's handler
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    handler = LoggingHandler(logger_provider=provider)
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(logging.INFO)
    try:
        yield lambda: [_convert_log_to_envelope(r) for r in memory.get_finished_logs()]
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)
        provider.shutdown()


def test_app_records_land_in_traces_with_the_event_dimension(exported):
    from shared._core.keys import DedupKey
    from shared._core.records import Outcome, OutcomeStatus
    from shared._core.telemetry import Telemetry

    telemetry = Telemetry(log_duplicates=True)  # DuplicateDetected is a record only then
    key = DedupKey("orders", "order-1")
    telemetry.outcome(Outcome(OutcomeStatus.CONFLICT, key, "hash-b"), latency=0.001, backend="cosmos")
    telemetry.outcome(Outcome(OutcomeStatus.DUPLICATE, key, "hash-a"), latency=0.001, backend="cosmos")
    telemetry.parked(consumer="payments", reason="MaxAttempts")
    telemetry.parked(consumer="notify", reason="OutcomeUnknown")
    telemetry.dead_lettered(consumer="orders", reason="StoreRejected")
    telemetry.sequence_reset(consumer="payments", partition_id="0", mark=5099, first=0)

    envelopes = exported()
    by_event = {}
    for envelope in envelopes:
        data = envelope.data.base_data
        # MessageData is the `traces` table; ExceptionData or EventData would land elsewhere.
        assert envelope.data.base_type == "MessageData", envelope.data.base_type
        by_event.setdefault(data.properties.get("event"), []).append(data.properties)
    assert set(by_event) == set(LOG_EVENTS.values())
    assert {p["consumer"] for p in by_event[LOG_EVENTS["parked"]]} == {"payments", "notify"}
    for event in (LOG_EVENTS["parked"], LOG_EVENTS["deadLettered"]):
        assert all(p.get("reason") for p in by_event[event]), "the reason dimension would be empty"
    assert all(p.get("consumer") for props in by_event.values() for p in props)


def test_duplicates_land_in_custom_metrics_with_the_outcome_dimension():
    """One MetricData item (`customMetrics`) per attribute set and interval, whatever the number of
    messages: `name` is the metric, the value the interval's count, the attributes customDimensions."""
    from azure.monitor.opentelemetry.exporter.export.metrics._exporter import (
        APPLICATION_INSIGHTS_METRIC_TEMPORALITIES,
        _convert_point_to_envelope,
    )
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from shared._core.keys import DedupKey
    from shared._core.records import Outcome, OutcomeStatus
    from shared._core.telemetry import METRIC_MESSAGES, Telemetry

    reader = InMemoryMetricReader(preferred_temporality=APPLICATION_INSIGHTS_METRIC_TEMPORALITIES)
    provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(meter_provider=provider)
    key = DedupKey("orders", "order-1")
    for delivery_count in (2, 2, 2, 1):
        telemetry.outcome(Outcome(OutcomeStatus.DUPLICATE, key, "hash-a"), latency=0.001,
                          backend="cosmos", context={"delivery_count": delivery_count})
    telemetry.outcome(Outcome(OutcomeStatus.PROCESSED, key, "hash-a"), latency=0.001, backend="cosmos")
    envelopes = []
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    envelopes.append(_convert_point_to_envelope(point, metric.name, resource.resource,
                                                                scope.scope))
    provider.shutdown()
    assert METRIC_MESSAGES == MESSAGES_METRIC
    rows = []
    for envelope in envelopes:
        assert envelope.data.base_type == "MetricData"
        (point,) = envelope.data.base_data.metrics
        if point.name == MESSAGES_METRIC:
            rows.append((envelope.data.base_data.properties, point.value))
    duplicates = {props["cause"]: value for props, value in rows if props["outcome"] == "duplicate"}
    assert duplicates == {"redelivery": 3, "producer_retry": 1}
    assert all(props["consumer"] == "orders" for props, _ in rows)


# --- The log alerts ------------------------------------------------------------------------------
# Rules on the app's metrics rather than its log events.
METRIC_RULES = {"outboxPendingAlert"}


def test_the_outbox_pending_rule_watches_the_oldest_pending_age_gauge():
    rule, query, criterion = _query_rules()["outboxPendingAlert"]
    from shared._core.telemetry import METRIC_OLDEST_PENDING

    assert query.startswith("customMetrics ") and f'name == "{METRIC_OLDEST_PENDING}"' in query
    assert "where value > 3600" in query  # the default threshold, resolved
    assert rule["properties"]["enabled"] is True
    assert criterion["operator"] == "GreaterThan" and criterion["threshold"] == 0


def test_each_event_has_one_rule_reading_only_traces():
    rules = {symbol: rule for symbol, rule in _query_rules().items() if symbol not in METRIC_RULES}
    assert set(rules) == {symbol for symbol, _ in EVENT_RULES.values()}
    for name in NEW_EVENT_RULES:
        symbol, _ = EVENT_RULES[name]
        rule, query, criterion = rules[symbol]
        assert _tables(query) == {"traces"}, f"{symbol} reads {_tables(query)}"
        assert "union" not in query, symbol
        assert _event_filter(LOG_EVENTS[name]) in query, symbol
        others = [e for n, e in LOG_EVENTS.items() if n != name]
        assert not [e for e in others if e in query], f"{symbol} watches more than one event"
        assert "${" not in query, f"{symbol}: unresolved interpolation"
        assert query.count("(") == query.count(")"), symbol
        assert query.count('"') % 2 == 0, symbol
        assert rule["kind"] == "LogAlert"
        assert rule["properties"]["enabled"] is True
        assert rule["properties"]["scopes"] == ["applicationInsightsId"], symbol
        assert criterion["operator"] == "GreaterThan"
        assert criterion["threshold"] == 0
        assert criterion["timeAggregation"] == "Count"


@pytest.mark.parametrize("name", NEW_EVENT_RULES)
def test_event_rules_fire_on_new_events_of_each_window(name):
    symbol, _ = EVENT_RULES[name]
    rule, query, criterion = _query_rules()[symbol]
    props = rule["properties"]
    # The window is the evaluation period: each event is counted exactly once, as new.
    assert props["windowSize"] == props["evaluationFrequency"] == "PT5M"
    assert "ago(" not in query and "between" not in query, "the query must not widen the window"
    # Stateless: a rule that already fired does not swallow the next events.
    assert props["autoMitigate"] is False
    assert criterion["failingPeriods"] == {"numberOfEvaluationPeriods": 1, "minFailingPeriodsToAlert": 1}


@pytest.mark.parametrize("name", NEW_EVENT_RULES)
def test_event_rules_split_by_the_dimensions_the_query_projects(name):
    symbol, _ = EVENT_RULES[name]
    _, query, criterion = _query_rules()[symbol]
    # A variable holding literal objects (evaluate() would read their `operator` keys as operators).
    dimensions = parse(ALERTS)["variables"][criterion["dimensions"]]["value"]
    names = [d["name"] for d in dimensions]
    assert "consumer" in names
    project = query.rsplit("| project", 1)[1]
    for dimension in dimensions:
        assert dimension["operator"] == "Include" and dimension["values"] == ["*"]
        assert f"{dimension['name']} = tostring(customDimensions.{dimension['name']})" in query
        assert dimension["name"] in project, f"{symbol}: dimension {dimension['name']} not projected"


@pytest.mark.parametrize("name", sorted(EVENT_RULES))
def test_rule_names_say_what_they_watch(name):
    symbol, words = EVENT_RULES[name]
    rule, _, _ = _query_rules()[symbol]
    scope = scope_of(ALERTS)
    display = evaluate(rule["properties"]["displayName"], scope)
    name_text = evaluate(rule["name"], {**scope, "namePrefix": "x"})
    text = f"{display} {rule['properties']['description']} {name_text}"
    assert (MESSAGES_METRIC if name == "duplicate" else LOG_EVENTS[name]) in display
    for word in words:
        assert word.lower() in text.lower(), f"{symbol} does not say it watches {word}"


def test_parked_rule_is_not_about_payments_only():
    rule, _, _ = _query_rules()["parkedAlert"]
    display = evaluate(rule["properties"]["displayName"], scope_of(ALERTS))
    assert not display.startswith("Payment event parked")
    for consumer in ("notify", "audit", "payment"):
        assert consumer in rule["properties"]["description"]


def test_duplicate_spike_reads_the_messages_metric_not_per_message_logs():
    rule, query, criterion = _query_rules()["duplicateSpikeAlert"]
    assert _tables(query) == {"customMetrics"}, _tables(query)
    assert f'name == "{MESSAGES_METRIC}"' in query
    assert 'tostring(customDimensions.outcome) == "duplicate"' in query
    # A counter row holds the interval's count: sum the values, never count the rows.
    assert query.count("summarize sum(valueSum)") == 2 and "| count" not in query
    assert LOG_EVENTS["duplicate"] not in query and "customDimensions.event" not in query
    assert "${" not in query and query.count("(") == query.count(")") and query.count('"') % 2 == 0
    assert rule["kind"] == "LogAlert" and rule["properties"]["enabled"] is True
    assert rule["properties"]["scopes"] == ["applicationInsightsId"]
    assert (criterion["operator"], criterion["threshold"], criterion["timeAggregation"]) == (
        "GreaterThan", 0, "Count")


def test_duplicate_spike_compares_the_window_with_a_baseline():
    rule, query, _ = _query_rules()["duplicateSpikeAlert"]
    assert re.search(r"recentCount >= 20 and recentCount > 3 \* baselineCount", query)
    assert "timestamp > ago(15m)" in query and "between (ago(1d) .. ago(15m))" in query
    assert "/ 95.0" in query
    assert rule["properties"]["windowSize"] == "P1D"
    assert rule["properties"]["evaluationFrequency"] == "PT15M"


def test_log_alerts_target_application_insights():
    assert module_params("resources.bicep", "alerts")["applicationInsightsId"] == {
        "operator": {"type": "property_accessor", "operands": {
            "operand_1": "monitoring", "operand_2": {"operator": {"type": "property_accessor", "operands": {
                "operand_1": "outputs", "operand_2": "applicationInsightsId"}}}}}}


# --- The dead-letter metric alert ----------------------------------------------------------------
def _dead_letter_alert():
    (alert,) = of_type(ALERTS, "Microsoft.Insights/metricAlerts").values()
    return body(alert)


def test_dead_letter_metric_alert_covers_queues_and_topic():
    alert = _dead_letter_alert()
    (criterion,) = alert["properties"]["criteria"]["allOf"]
    assert criterion["metricName"] == "DeadletteredMessages"
    assert criterion["metricNamespace"] == "Microsoft.ServiceBus/namespaces"
    (dimension,) = criterion["dimensions"]
    assert dimension["name"] == "EntityName"
    assert dimension["values"] == "deadLetterEntityNames"
    scope = scope_of("resources.bicep")
    entities = evaluate(module_params("resources.bicep", "alerts")["deadLetterEntityNames"], scope)
    assert set(entities) == {ENTITY_SETTINGS["ORDERS_QUEUE_NAME"], ENTITY_SETTINGS["ORDER_STATUS_QUEUE_NAME"],
                             ENTITY_SETTINGS["NOTIFICATIONS_TOPIC_NAME"],
                             ENTITY_SETTINGS["BALANCE_CHANGES_QUEUE"]}
    assert alert["properties"]["scopes"] == ["serviceBusNamespaceId"]


def test_dead_letter_metric_alert_does_not_go_quiet_after_firing():
    """DeadletteredMessages is a gauge: a stateful rule fires once and hides every later
    dead-letter until the queue is drained. Stateless + Maximum fires again each evaluation in
    which a dead-letter queue held a message, however briefly."""
    alert = _dead_letter_alert()
    props = alert["properties"]
    assert props["autoMitigate"] is False
    (criterion,) = props["criteria"]["allOf"]
    assert criterion["timeAggregation"] == "Maximum", "Minimum or Average miss a briefly held message"
    assert criterion["operator"] == "GreaterThan" and criterion["threshold"] == 0
    assert props["windowSize"] == props["evaluationFrequency"]
    assert "not-empty" in evaluate(alert["name"], {"namePrefix": "x"})


def test_alerts_readme_describes_the_rules():
    readme = Path(INFRA / "README.md").read_text()
    for event in LOG_EVENTS.values():
        assert event in readme, f"infra/README.md does not mention the {event} alert"
    assert "DeadletteredMessages" in readme
