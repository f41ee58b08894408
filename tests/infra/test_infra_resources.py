"""Resource properties the pattern and the security posture depend on."""

from __future__ import annotations

import pytest

from tests.infra.bicep_model import (
    COSMOS_CONTAINERS,
    COSMOS_DATABASE,
    COSMOS_TTL_CONTAINERS,
    ENTITY_SETTINGS,
    TABLES,
    Unresolved,
    app_settings,
    body,
    evaluate,
    module_params,
    of_type,
    param_defaults,
    parse,
    scope_of,
)

SB = "core/servicebus.bicep"
EH = "core/eventhubs.bicep"
COSMOS = "core/cosmos.bicep"
STORAGE = "core/storage.bicep"


def _sb_scope():
    """servicebus.bicep parameters as resources.bicep passes them (with its defaults)."""
    outer = scope_of("resources.bicep")
    passed = module_params("resources.bicep", "serviceBus")
    values = {}
    for name, expr in passed.items():
        try:
            values[name] = evaluate(expr, outer)
        except Unresolved:
            values[name] = None
    return scope_of(SB, values)


def _named(relative, rtype, scope):
    return {evaluate(body(r)["name"], scope): body(r) for r in of_type(relative, rtype).values()}


# --- Service Bus --------------------------------------------------------------------------------
def test_service_bus_namespace_has_local_auth_disabled_and_tls12():
    (ns,) = of_type(SB, "Microsoft.ServiceBus/namespaces").values()
    props = body(ns)["properties"]
    assert props["disableLocalAuth"] is True
    assert props["minimumTlsVersion"] == "1.2"
    assert body(ns)["sku"]["name"] in {"Standard", "Premium"}, "topics need Standard or Premium"


def test_service_bus_entities_have_the_contract_names():
    scope = _sb_scope()
    queues = _named(SB, "Microsoft.ServiceBus/namespaces/queues", scope)
    topics = _named(SB, "Microsoft.ServiceBus/namespaces/topics", scope)
    subs = _named(SB, "Microsoft.ServiceBus/namespaces/topics/subscriptions", scope)
    assert set(queues) == {ENTITY_SETTINGS["ORDERS_QUEUE_NAME"], ENTITY_SETTINGS["ORDER_STATUS_QUEUE_NAME"],
                           ENTITY_SETTINGS["BALANCE_CHANGES_QUEUE"]}
    assert set(topics) == {ENTITY_SETTINGS["NOTIFICATIONS_TOPIC_NAME"]}
    assert set(subs) == {ENTITY_SETTINGS["NOTIFY_SUBSCRIPTION_NAME"],
                         ENTITY_SETTINGS["AUDIT_SUBSCRIPTION_NAME"]}


def test_orders_queue_has_parameterized_duplicate_detection():
    scope = _sb_scope()
    orders = _named(SB, "Microsoft.ServiceBus/namespaces/queues", scope)["orders"]["properties"]
    assert orders["requiresDuplicateDetection"] is True
    # Parameterized (not a literal), and the default is inside Service Bus limits (20 s .. 7 days).
    assert orders["duplicateDetectionHistoryTimeWindow"] == "duplicateDetectionHistoryTimeWindow"
    assert "duplicateDetectionHistoryTimeWindow" in param_defaults("resources.bicep")
    assert scope["duplicateDetectionHistoryTimeWindow"] == "PT10M"


def test_outbox_destinations_detect_duplicates_over_the_outbox_window():
    """The notifications topic and the balance-changes queue: duplicate detection with the
    window of OUTBOX_DUPLICATE_DETECTION_SECONDS (the app checks it against the redelivery
    window at startup), from the one parameter that also sets that app setting."""
    scope = _sb_scope()
    destinations = {
        **_named(SB, "Microsoft.ServiceBus/namespaces/topics", scope),
        ENTITY_SETTINGS["BALANCE_CHANGES_QUEUE"]: _named(
            SB, "Microsoft.ServiceBus/namespaces/queues", scope)[ENTITY_SETTINGS["BALANCE_CHANGES_QUEUE"]],
    }
    assert set(destinations) == {ENTITY_SETTINGS["NOTIFICATIONS_TOPIC_NAME"],
                                 ENTITY_SETTINGS["BALANCE_CHANGES_QUEUE"]}
    for name, entity in destinations.items():
        props = entity["properties"]
        assert props["requiresDuplicateDetection"] is True, name
        assert props["duplicateDetectionHistoryTimeWindow"] == "PT${outboxDuplicateDetectionSeconds}S", name
    assert module_params("resources.bicep", "serviceBus")["outboxDuplicateDetectionSeconds"] == (
        "outboxDuplicateDetectionSeconds")
    assert app_settings()["OUTBOX_DUPLICATE_DETECTION_SECONDS"]["function"]["parameters"][
        "value_to_convert"] == "outboxDuplicateDetectionSeconds"


def test_every_receiving_entity_dead_letters_and_shares_lock_and_delivery_count():
    scope = _sb_scope()
    entities = {
        **_named(SB, "Microsoft.ServiceBus/namespaces/queues", scope),
        **_named(SB, "Microsoft.ServiceBus/namespaces/topics/subscriptions", scope),
    }
    for name, entity in entities.items():
        props = entity["properties"]
        assert props["deadLetteringOnMessageExpiration"] is True, name
        # The same two parameters everywhere: the retention rule is derived from them.
        assert props["lockDuration"] == "lockDuration", name
        assert props["maxDeliveryCount"] == "maxDeliveryCount", name
        assert evaluate(props["lockDuration"], scope) == "PT60S", name
        assert evaluate(props["maxDeliveryCount"], scope) == 10, name
        assert props.get("requiresSession", False) is False, name
    assert parse(SB)["variables"]["lockDuration"]["value"] == "PT${lockDurationSeconds}S"


# --- Event Hubs -----------------------------------------------------------------------------------
def test_event_hubs_namespace_hub_and_consumer_group():
    (ns,) = of_type(EH, "Microsoft.EventHub/namespaces").values()
    assert body(ns)["properties"]["disableLocalAuth"] is True
    assert body(ns)["properties"]["minimumTlsVersion"] == "1.2"
    assert body(ns)["sku"]["name"] != "Basic", "Basic has no consumer groups besides $Default"
    outer = scope_of("resources.bicep")
    passed = {k: evaluate(v, outer) for k, v in module_params("resources.bicep", "eventHubs").items()
              if k in {"paymentsHubName", "paymentsConsumerGroupName", "partitionCount"}}
    scope = scope_of(EH, passed)
    hubs = _named(EH, "Microsoft.EventHub/namespaces/eventhubs", scope)
    groups = _named(EH, "Microsoft.EventHub/namespaces/eventhubs/consumergroups", scope)
    assert set(hubs) == {ENTITY_SETTINGS["PAYMENTS_HUB_NAME"]}
    assert set(groups) == {ENTITY_SETTINGS["PAYMENTS_CONSUMER_GROUP"]}
    assert evaluate(hubs["payments"]["properties"]["partitionCount"], scope) >= 2


# --- Cosmos DB ------------------------------------------------------------------------------------
def test_cosmos_account_is_identity_only_and_serverless_by_default():
    (account,) = of_type(COSMOS, "Microsoft.DocumentDB/databaseAccounts").values()
    props = body(account)["properties"]
    assert props["disableLocalAuth"] is True
    assert props["disableKeyBasedMetadataWriteAccess"] is True
    assert props["minimalTlsVersion"] == "Tls12"
    scope = scope_of(COSMOS)
    assert scope["serverless"] is True
    assert evaluate(props["capabilities"], scope) == [{"name": "EnableServerless"}]
    assert evaluate(props["capabilities"], {**scope, "serverless": False}) == []
    assert param_defaults("resources.bicep")["cosmosServerless"] is True
    assert param_defaults("resources.bicep")["cosmosDatabaseName"] == COSMOS_DATABASE


def test_cosmos_containers_partition_keys_and_per_item_ttl():
    containers = {}
    for res in of_type(COSMOS, "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers").values():
        resource = body(res)["properties"]["resource"]
        assert resource["id"] == body(res)["name"]
        containers[resource["id"]] = resource
    assert set(containers) == set(COSMOS_CONTAINERS)
    for name, resource in containers.items():
        assert resource["partitionKey"]["paths"] == [COSMOS_CONTAINERS[name]], name
        if name in COSMOS_TTL_CONTAINERS:
            # Per-item TTL on, nothing expires unless the item sets `ttl`.
            assert evaluate(resource["defaultTtl"], {}) == -1, name
        else:
            # Business documents (the order itself is the marker) never expire on their own.
            assert evaluate(resource.get("defaultTtl"), {}) in (None, -1), name


# --- Storage --------------------------------------------------------------------------------------
def test_storage_disallows_shared_keys_and_public_blobs():
    (account,) = of_type(STORAGE, "Microsoft.Storage/storageAccounts").values()
    props = body(account)["properties"]
    assert props["allowSharedKeyAccess"] is False
    assert props["allowBlobPublicAccess"] is False
    assert props["minimumTlsVersion"] == "TLS1_2"
    assert props["supportsHttpsTrafficOnly"] is True
    assert props["defaultToOAuthAuthentication"] is True


def test_storage_tables_match_the_code():
    assert set(parse(STORAGE)["variables"]["tableNames"]["value"]) == TABLES
    (tables,) = of_type(STORAGE, "Microsoft.Storage/storageAccounts/tableServices/tables").values()
    assert tables["config"]["loop_type"]["detail"]["array_name"] == "tableNames"


# --- Monitoring and the Function App --------------------------------------------------------------
def test_application_insights_uses_entra_id_ingestion():
    (component,) = of_type("core/monitoring.bicep", "Microsoft.Insights/components").values()
    props = body(component)["properties"]
    assert props["DisableLocalAuth"] is True
    assert props["WorkspaceResourceId"]
    settings = parse("resources.bicep")["variables"]["appSettings"]["value"]
    assert settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == (
        "ClientId=${identity.outputs.clientId};Authorization=AAD")


def test_function_app_is_flex_consumption_python_313_with_user_assigned_identity():
    app_file = "app/function-app.bicep"
    (plan,) = of_type(app_file, "Microsoft.Web/serverfarms").values()
    assert body(plan)["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    assert body(plan)["properties"]["reserved"] is True
    (site,) = of_type(app_file, "Microsoft.Web/sites").values()
    site = body(site)
    assert site["kind"] == "functionapp,linux"
    assert site["identity"]["type"] == "UserAssigned"
    props = site["properties"]
    assert props["httpsOnly"] is True
    config = props["functionAppConfig"]
    assert config["runtime"]["name"] == "python"
    assert module_params("resources.bicep", "functionApp")["pythonVersion"] == "3.13"
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["authentication"]["type"] == "UserAssignedIdentity"
    assert storage["authentication"]["userAssignedIdentityResourceId"] == "identityId"
    # App settings come from the single contract object in resources.bicep.
    assert props["siteConfig"]["appSettings"]["loop_type"]["detail"]["array_name"] == {
        "function": {"type": "items", "parameters": {"arg_1": "appSettings"}}}
    assert module_params("resources.bicep", "functionApp")["appSettings"] == "appSettings"
    # azd deploys to the resource tagged with the service name of azure.yaml.
    assert parse(app_file)["variables"]["serviceTags"]["value"] == {"'azd-service-name'": "api"}


@pytest.mark.parametrize("policy", ["scm", "ftp"])
def test_basic_publishing_credentials_are_disabled(policy):
    policies = of_type("app/function-app.bicep", "Microsoft.Web/sites/basicPublishingCredentialsPolicies")
    by_name = {body(p)["name"]: body(p) for p in policies.values()}
    assert by_name[policy]["properties"]["allow"] is False


def test_event_hub_retains_events_for_seven_days_parameterised():
    """A consumer down over a weekend must find its payments still in the hub (Standard: 1..7 days)."""
    params = parse("resources.bicep")["parameters"]["eventHubMessageRetentionInDays"]
    bounds = {d["type"]: d["argument"] for d in params["decorators"]
              if d["type"] in ("min_value", "max_value")}
    assert bounds == {"min_value": 1, "max_value": 7}
    assert params["default"] == 7
    assert module_params("resources.bicep", "eventHubs")["messageRetentionInDays"] == (
        "eventHubMessageRetentionInDays")
    (hub,) = of_type(EH, "Microsoft.EventHub/namespaces/eventhubs").values()
    assert body(hub)["properties"]["messageRetentionInDays"] == "messageRetentionInDays"
    inner = parse(EH)["parameters"]["messageRetentionInDays"]
    assert inner["default"] == 7
    assert {d["type"]: d["argument"] for d in inner["decorators"]
            if d["type"] in ("min_value", "max_value")} == {"min_value": 1, "max_value": 7}
    (ns,) = of_type(EH, "Microsoft.EventHub/namespaces").values()
    assert body(ns)["sku"]["tier"] == "Standard", "7 days is the Standard maximum; revisit for Premium"
