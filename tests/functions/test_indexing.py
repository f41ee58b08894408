"""The app indexes as the worker reports it to the host."""

from __future__ import annotations

from tests.functions.conftest import registered_functions


def bindings() -> dict[str, list[dict]]:
    return {fn.get_function_name(): fn.get_bindings_dict()["bindings"] for fn in registered_functions()}


def trigger(name: str) -> dict:
    return next(b for b in bindings()[name] if b["direction"].name == "IN" or "Trigger" in b["type"])


def test_every_function_is_registered():
    assert set(bindings()) == {"orders", "order_status", "notify", "audit", "payments",
                               "balance_projection", "http_payments", "maintenance", "order_audit"}


def test_order_audit_reads_its_storage_queue_on_the_hosts_connection():
    binding = trigger("order_audit")
    assert binding["type"] == "queueTrigger"
    assert binding["queueName"] == "%ORDER_AUDIT_QUEUE_NAME%"
    assert binding["connection"] == "AzureWebJobsStorage"


def test_service_bus_triggers_settle_explicitly_on_named_entities():
    expected = {
        "orders": {"queueName": "%ORDERS_QUEUE_NAME%"},
        "order_status": {"queueName": "%ORDER_STATUS_QUEUE_NAME%"},
        "notify": {"topicName": "%NOTIFICATIONS_TOPIC_NAME%",
                   "subscriptionName": "%NOTIFY_SUBSCRIPTION_NAME%"},
        "audit": {"topicName": "%NOTIFICATIONS_TOPIC_NAME%",
                  "subscriptionName": "%AUDIT_SUBSCRIPTION_NAME%"},
        "balance_projection": {"queueName": "%BALANCE_CHANGES_QUEUE%"},
    }
    for name, names in expected.items():
        binding = trigger(name)
        assert binding["type"] == "serviceBusTrigger"
        assert binding["connection"] == "ServiceBusConnection"
        assert binding["autoCompleteMessages"] is False
        for field, value in names.items():
            assert binding[field] == value


def test_payments_reads_batches_from_its_consumer_group_with_a_retry_policy():
    binding = trigger("payments")
    assert binding["type"] == "eventHubTrigger"
    assert binding["connection"] == "EventHubConnection"
    assert binding["eventHubName"] == "%PAYMENTS_HUB_NAME%"
    assert binding["consumerGroup"] == "%PAYMENTS_CONSUMER_GROUP%"
    assert str(binding["cardinality"].value) == "many"
    fn = next(f for f in registered_functions() if f.get_function_name() == "payments")
    retry = fn.get_setting("retry_policy").get_dict_repr()
    assert retry["strategy"] == "exponential_backoff" and retry["max_retry_count"] == "-1"


def test_http_and_timer_triggers():
    http = trigger("http_payments")
    assert http["type"] == "httpTrigger" and http["route"] == "payments"
    assert [m.value for m in http["methods"]] == ["POST"]
    timer = trigger("maintenance")
    assert timer["type"] == "timerTrigger" and timer["schedule"] == "%MAINTENANCE_SCHEDULE%"
