"""Alert rules query the stable event names the app logs, named in one place."""

from __future__ import annotations

import re

from tests.infra.bicep_model import (
    ENTITY_SETTINGS,
    INFRA,
    LOG_EVENTS,
    bicep_files,
    body,
    evaluate,
    module_params,
    of_type,
    parse,
    scope_of,
)

ALERTS = "core/alerts.bicep"


def _query_rules():
    scope = scope_of(ALERTS)
    rules = {}
    for symbol, res in of_type(ALERTS, "Microsoft.Insights/scheduledQueryRules").items():
        (criterion,) = body(res)["properties"]["criteria"]["allOf"]
        rules[symbol] = (body(res), evaluate(criterion["query"], scope), criterion)
    return rules


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
    from shared import telemetry

    assert LOG_EVENTS["keyConflict"] == telemetry.EVENT_CONFLICT
    assert LOG_EVENTS["parked"] == telemetry.EVENT_PARKED
    assert LOG_EVENTS["duplicate"] == telemetry.EVENT_DUPLICATE


def test_one_log_alert_per_event_querying_traces_and_custom_events():
    rules = _query_rules()
    assert len(rules) == 3
    seen = set()
    for symbol, (rule, query, criterion) in rules.items():
        (event,) = [e for e in LOG_EVENTS.values() if e in query]
        seen.add(event)
        assert f'message has "{event}"' in query, symbol
        assert f'customEvents | where name == "{event}"' in query, symbol
        assert "${" not in query, f"{symbol}: unresolved interpolation"
        assert query.count("(") == query.count(")"), symbol
        assert query.count('"') % 2 == 0, symbol
        assert rule["kind"] == "LogAlert"
        assert rule["properties"]["enabled"] is True
        assert criterion["operator"] == "GreaterThan"
        assert criterion["threshold"] == 0
        assert criterion["timeAggregation"] == "Count"
        assert event in evaluate(rule["properties"]["displayName"], scope_of(ALERTS))
    assert seen == set(LOG_EVENTS.values())


def test_log_alerts_target_application_insights():
    for symbol, (rule, _, _) in _query_rules().items():
        assert rule["properties"]["scopes"] == ["applicationInsightsId"], symbol
    assert module_params("resources.bicep", "alerts")["applicationInsightsId"] == {
        "operator": {"type": "property_accessor", "operands": {
            "operand_1": "monitoring", "operand_2": {"operator": {"type": "property_accessor", "operands": {
                "operand_1": "outputs", "operand_2": "applicationInsightsId"}}}}}}


def test_duplicate_spike_compares_the_window_with_a_baseline():
    rules = _query_rules()
    (rule, query, _) = rules["duplicateSpikeAlert"]
    assert LOG_EVENTS["duplicate"] in query
    assert re.search(r"recentCount >= 20 and recentCount > 3 \* baselineCount", query)
    assert rule["properties"]["windowSize"] == "P1D"
    assert rule["properties"]["evaluationFrequency"] == "PT15M"


def test_conflict_and_parked_alert_on_any_occurrence():
    rules = _query_rules()
    for symbol in ("keyConflictAlert", "parkedAlert"):
        rule, _, _ = rules[symbol]
        assert rule["properties"]["windowSize"] == rule["properties"]["evaluationFrequency"], symbol


def test_dead_letter_metric_alert_covers_queues_and_topic():
    (alert,) = of_type(ALERTS, "Microsoft.Insights/metricAlerts").values()
    (criterion,) = body(alert)["properties"]["criteria"]["allOf"]
    assert criterion["metricName"] == "DeadletteredMessages"
    assert criterion["metricNamespace"] == "Microsoft.ServiceBus/namespaces"
    (dimension,) = criterion["dimensions"]
    assert dimension["name"] == "EntityName"
    assert dimension["values"] == "deadLetterEntityNames"
    scope = scope_of("resources.bicep")
    entities = evaluate(module_params("resources.bicep", "alerts")["deadLetterEntityNames"], scope)
    assert set(entities) == {ENTITY_SETTINGS["ORDERS_QUEUE_NAME"], ENTITY_SETTINGS["ORDER_STATUS_QUEUE_NAME"],
                             ENTITY_SETTINGS["NOTIFICATIONS_TOPIC_NAME"]}
    assert body(alert)["properties"]["scopes"] == ["serviceBusNamespaceId"]
