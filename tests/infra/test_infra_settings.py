"""The deployed app settings: the contract names, identity-only connections, and the
retention rule holding by construction."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta

import pytest

from tests.infra.bicep_model import (
    CONTRACT_SETTINGS,
    ENTITY_SETTINGS,
    IDENTITY_CONNECTIONS,
    LOCAL_ONLY_SETTINGS,
    REPO,
    Unresolved,
    app_settings,
    evaluate,
    module_params,
    parse,
    scope_of,
)

HOST_RENEWAL = "AzureFunctionsJobHost__extensions__serviceBus__maxAutoLockRenewalDuration"
RETENTION_PARAMS = (
    "serviceBusLockDurationSeconds",
    "serviceBusMaxDeliveryCount",
    "serviceBusMaxAutoLockRenewalSeconds",
    "dedupRetentionMarginSeconds",
)


def _setting_values(overrides=None):
    scope = scope_of("resources.bicep", overrides)
    values = {}
    for key, expr in app_settings().items():
        try:
            values[key] = evaluate(expr, scope)
        except Unresolved:
            values[key] = None
    return values


def test_every_contract_setting_is_deployed():
    missing = CONTRACT_SETTINGS - set(app_settings())
    assert not missing, sorted(missing)


@pytest.mark.parametrize("connection", sorted(IDENTITY_CONNECTIONS))
def test_connections_are_identity_based(connection):
    settings = app_settings()
    assert connection not in settings, f"{connection} would be a connection string"
    assert settings[f"{connection}__credential"] == "managedidentity"
    assert f"{connection}__clientId" in settings


def test_no_local_only_secret_settings_are_deployed():
    assert not LOCAL_ONLY_SETTINGS & set(app_settings())
    for key in app_settings():
        assert not key.endswith(("_PASSWORD", "_SECRET", "_SAS")), key
        assert not key.endswith("_KEY") or key.endswith("IDEMPOTENCY_KEY"), key
        if key.endswith("CONNECTION_STRING"):
            # Not a secret with local auth disabled: ingestion is authorised by the identity.
            assert key == "APPLICATIONINSIGHTS_CONNECTION_STRING", key


def test_entity_settings_carry_the_contract_names():
    values = _setting_values()
    for setting, name in ENTITY_SETTINGS.items():
        assert values[setting] == name, setting


def test_entity_settings_and_broker_entities_come_from_the_same_parameters():
    settings = app_settings()
    sb = module_params("resources.bicep", "serviceBus")
    eh = module_params("resources.bicep", "eventHubs")
    assert settings["ORDERS_QUEUE_NAME"] == sb["ordersQueueName"]
    assert settings["ORDER_STATUS_QUEUE_NAME"] == sb["orderStatusQueueName"]
    assert settings["NOTIFICATIONS_TOPIC_NAME"] == sb["notificationsTopicName"]
    assert settings["NOTIFY_SUBSCRIPTION_NAME"] == sb["notifySubscriptionName"]
    assert settings["AUDIT_SUBSCRIPTION_NAME"] == sb["auditSubscriptionName"]
    assert settings["BALANCE_CHANGES_QUEUE"] == sb["balanceChangesQueueName"]
    assert settings["PAYMENTS_HUB_NAME"] == eh["paymentsHubName"]
    assert settings["PAYMENTS_CONSUMER_GROUP"] == eh["paymentsConsumerGroupName"]


def test_behaviour_setting_defaults():
    values = _setting_values()
    assert values["DEDUP_BACKEND"] == "cosmos"
    assert values["COSMOS_DATABASE"] == "idempotency"
    assert values["NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY"] == "false"
    assert _setting_values({"notificationApiHonoursIdempotencyKey": True})[
        "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY"] == "true"
    assert values["PAYMENTS_MISSING_KEY_POLICY"] == "park"
    assert values["PAYMENTS_MAX_ATTEMPTS"] == "3"
    assert values["MAINTENANCE_SCHEDULE"] == "0 */15 * * * *"
    assert len(values["MAINTENANCE_SCHEDULE"].split()) == 6, "NCRONTAB has six fields"
    assert values["DEDUP_LEASE_SECONDS"] == "54"
    assert int(values["DEDUP_LEASE_SECONDS"]) < int(values["SERVICEBUS_LOCK_DURATION_SECONDS"])
    assert values["SERVICEBUS_LOCK_DURATION_SECONDS"] == "60"
    assert values["SERVICEBUS_MAX_DELIVERY_COUNT"] == "10"
    assert values["SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS"] == "300"
    assert values["DEDUP_RETENTION_MARGIN_SECONDS"] == "86400"
    allowed = parse("resources.bicep")["parameters"]["dedupBackend"]["decorators"]
    assert {"type": "allowed", "argument": ["cosmos", "table"]} in allowed


def test_the_deployed_and_sample_trace_sampling_ratio_is_the_apps_default():
    """One default for the share of traces exported: the app's, Bicep's and the local sample's."""
    from shared._core.observability import DEFAULT_SAMPLING_RATIO

    assert float(_setting_values()["TRACE_SAMPLING_RATIO"]) == DEFAULT_SAMPLING_RATIO
    sample = json.loads((REPO / "local.settings.sample.json").read_text())["Values"]
    assert float(sample["TRACE_SAMPLING_RATIO"]) == DEFAULT_SAMPLING_RATIO


# --- The retention rule ---------------------------------------------------------------------
def test_lock_duration_of_the_queue_and_the_setting_share_one_parameter():
    settings = app_settings()
    sb = module_params("resources.bicep", "serviceBus")
    assert sb["lockDurationSeconds"] == "serviceBusLockDurationSeconds"
    assert settings["SERVICEBUS_LOCK_DURATION_SECONDS"]["function"]["parameters"][
        "value_to_convert"] == "serviceBusLockDurationSeconds"
    assert sb["maxDeliveryCount"] == "serviceBusMaxDeliveryCount"
    assert settings["SERVICEBUS_MAX_DELIVERY_COUNT"]["function"]["parameters"][
        "value_to_convert"] == "serviceBusMaxDeliveryCount"
    # Inside the module both feed every entity (checked per entity in test_infra_resources).
    assert parse("core/servicebus.bicep")["variables"]["lockDuration"]["value"] == "PT${lockDurationSeconds}S"


def test_dedup_ttl_setting_is_the_derived_value():
    settings = app_settings()
    assert settings["DEDUP_TTL_SECONDS"]["function"]["parameters"]["value_to_convert"] == "dedupTtlSeconds"
    for key, param in (("SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS", "serviceBusMaxAutoLockRenewalSeconds"),
                       ("DEDUP_RETENTION_MARGIN_SECONDS", "dedupRetentionMarginSeconds")):
        assert settings[key]["function"]["parameters"]["value_to_convert"] == param


def _rule(lock, count, renewal, margin):
    return max(lock, renewal) * count + margin


@pytest.mark.parametrize(("lock", "count", "renewal", "margin"), list(itertools.product(
    (5, 60, 300), (1, 10, 2000), (0, 59, 300, 3661, 86399), (0, 86400))))
def test_retention_rule_holds_for_any_parameter_values(lock, count, renewal, margin):
    values = _setting_values({
        "serviceBusLockDurationSeconds": lock,
        "serviceBusMaxDeliveryCount": count,
        "serviceBusMaxAutoLockRenewalSeconds": renewal,
        "dedupRetentionMarginSeconds": margin,
    })
    ttl = int(values["DEDUP_TTL_SECONDS"])
    hours, minutes, secs = (int(x) for x in values[HOST_RENEWAL].split(":"))
    assert hours * 3600 + minutes * 60 + secs == renewal, "the host renews exactly as long as the TTL assumes"
    assert int(values["SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS"]) == renewal
    assert ttl >= _rule(lock, count, renewal, margin)
    assert ttl == _rule(lock, count, renewal, margin), "derived exactly, no hidden slack"
    assert int(values["SERVICEBUS_LOCK_DURATION_SECONDS"]) == lock
    assert int(values["SERVICEBUS_MAX_DELIVERY_COUNT"]) == count


def test_default_ttl_matches_the_spec_defaults():
    assert int(_setting_values()["DEDUP_TTL_SECONDS"]) == max(60, 300) * 10 + 86400 == 89400
    assert int(_setting_values()["DEDUP_TTL_SECONDS"]) > int(_setting_values()["DEDUP_LEASE_SECONDS"])


def test_app_retention_check_accepts_the_deployed_values():
    """The app's own startup rule (shared._core.config) agrees with the Bicep derivation."""
    from shared._core.config import RedeliveryWindow, validate_retention
    from shared._core.exceptions import RetentionConfigError

    values = _setting_values()
    window = RedeliveryWindow(
        lock_duration=timedelta(seconds=int(values["SERVICEBUS_LOCK_DURATION_SECONDS"])),
        max_delivery_count=int(values["SERVICEBUS_MAX_DELIVERY_COUNT"]),
        max_auto_lock_renewal=timedelta(seconds=int(values["SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS"])),
        margin=timedelta(seconds=int(values["DEDUP_RETENTION_MARGIN_SECONDS"])),
    )
    ttl = timedelta(seconds=int(values["DEDUP_TTL_SECONDS"]))
    validate_retention(ttl, window)
    with pytest.raises(RetentionConfigError):
        validate_retention(ttl - timedelta(seconds=1), window)


def test_retention_parameters_are_bounded_like_service_bus():
    params = parse("resources.bicep")["parameters"]
    lock = {d["type"]: d["argument"] for d in params["serviceBusLockDurationSeconds"]["decorators"]
            if d["type"] in ("min_value", "max_value")}
    assert lock == {"min_value": 5, "max_value": 300}
    for name in RETENTION_PARAMS:
        assert params[name]["type"] == "int", name


def test_host_json_renewal_matches_the_bicep_default():
    """Locally (func start) host.json decides the renewal; in Azure the app setting overrides it."""
    host = json.loads((REPO / "host.json").read_text())
    configured = host["extensions"]["serviceBus"]["maxAutoLockRenewalDuration"]
    assert configured == _setting_values()[HOST_RENEWAL] == "00:05:00"
    assert app_settings()[HOST_RENEWAL] == "maxAutoLockRenewalDuration"


# --- NOTIFICATION_API_URL: never silently empty ---------------------------------------------------
@pytest.mark.parametrize("template", ["main.bicep", "resources.bicep"])
def test_notification_api_url_is_a_required_non_empty_parameter(template):
    """An empty URL fails every notify/audit delivery until MaxDeliveryCountExceeded."""
    param = parse(template)["parameters"]["notificationApiUrl"]
    assert param.get("default") is None, f"{template}: a default would let the URL be silently empty"
    min_length = [d["argument"] for d in param.get("decorators", []) if d["type"] == "min_length"]
    assert min_length and min_length[0] >= 1, f"{template}: '' must be rejected at deployment"


def test_notification_api_url_reaches_the_app_setting_unchanged():
    assert app_settings()["NOTIFICATION_API_URL"] == "notificationApiUrl"
    main_module = parse("main.bicep")["modules"]["resources"]["config"]["params"]
    assert main_module["notificationApiUrl"] == "notificationApiUrl"
    values = json.loads((REPO / "infra" / "main.parameters.json").read_text())["parameters"]
    # No `=fallback`: with the variable unset azd prompts (or fails with --no-prompt).
    assert values["notificationApiUrl"]["value"] == "${NOTIFICATION_API_URL}"
    sample = json.loads((REPO / "local.settings.sample.json").read_text())["Values"]
    assert sample["NOTIFICATION_API_URL"].startswith(("http://", "https://"))


# --- Flex Consumption: settings the platform owns ---------------------------------------------------
FLEX_DEPRECATED_SETTINGS = {
    "FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION", "WEBSITE_RUN_FROM_PACKAGE",
    "WEBSITE_CONTENTSHARE", "WEBSITE_CONTENTAZUREFILECONNECTIONSTRING", "SCM_DO_BUILD_DURING_DEPLOYMENT",
    "ENABLE_ORYX_BUILD", "WEBSITE_MAX_DYNAMIC_APPLICATION_SCALE_OUT", "WEBSITE_TIME_ZONE", "TZ",
}


def test_no_flex_deprecated_settings_are_deployed():
    """Runtime and version live in functionAppConfig.runtime on Flex Consumption; so the deployed
    app cannot rely on FUNCTIONS_WORKER_RUNTIME being in its environment (see
    test_infra_telemetry: after specialization the worker sees only what the host passes)."""
    assert not FLEX_DEPRECATED_SETTINGS & set(app_settings())


def test_sample_names_the_worker_runtime_for_core_tools():
    sample = json.loads((REPO / "local.settings.sample.json").read_text())["Values"]
    assert sample["FUNCTIONS_WORKER_RUNTIME"] == "python"


# --- The Storage queue trigger: one dequeue limit for the host and the app ---------------------
QUEUE_HOST_LIMIT = "AzureFunctionsJobHost__extensions__queues__maxDequeueCount"
QUEUE_HOST_RETRY = "AzureFunctionsJobHost__extensions__queues__visibilityTimeout"


def test_queue_dequeue_limit_of_the_host_and_the_app_share_one_parameter():
    """The consumer poisons a message with its reason on the delivery the host would give up on:
    both numbers come from `queueMaxDequeueCount` (host.json's default 5 when unset)."""
    settings = app_settings()
    for name in ("QUEUE_MAX_DEQUEUE_COUNT", QUEUE_HOST_LIMIT):
        assert settings[name]["function"]["parameters"]["value_to_convert"] == "queueMaxDequeueCount"
    for count in (1, 5, 17):
        values = _setting_values({"queueMaxDequeueCount": count})
        assert values["QUEUE_MAX_DEQUEUE_COUNT"] == values[QUEUE_HOST_LIMIT] == str(count)
    from functions.settings import Settings

    sample = json.loads((REPO / "local.settings.sample.json").read_text())["Values"]
    host = json.loads((REPO / "host.json").read_text())["extensions"].get("queues", {})
    assert sample["QUEUE_MAX_DEQUEUE_COUNT"] == _setting_values()["QUEUE_MAX_DEQUEUE_COUNT"] == \
        str(host.get("maxDequeueCount", 5)) == str(Settings.queue_max_dequeue_count)


@pytest.mark.parametrize(("seconds", "timespan"), [(0, "00:00:00"), (30, "00:00:30"),
                                                   (61, "00:01:01"), (3599, "00:59:59")])
def test_queue_retry_delay_is_written_as_the_host_reads_it(seconds, timespan):
    assert _setting_values({"queueVisibilityTimeoutSeconds": seconds})[QUEUE_HOST_RETRY] == timespan
    assert _setting_values()[QUEUE_HOST_RETRY] == "00:00:30"


def test_the_audit_queue_setting_and_the_queue_come_from_one_parameter():
    assert app_settings()["ORDER_AUDIT_QUEUE_NAME"] == "orderAuditQueueName"
    assert module_params("resources.bicep", "storage")["auditQueueName"] == "orderAuditQueueName"
    from tests.infra.bicep_model import accessor_path

    # The trigger's identity-based connection reaches the queues of the account that holds them.
    assert accessor_path(app_settings()["AzureWebJobsStorage__queueServiceUri"]) == [
        "storage", "outputs", "queueEndpoint"]
