"""Least-privilege role assignments for the app identity, next to the resources they grant.

Every identity-based connection the app uses has a data-plane role on the right
scope; the app never gets a sender or management role, and Service Bus Data Owner (the
Manage claim target-based scaling needs) only on the entities its triggers read; the
optional developer assignments exist only when a developer principal id is given.
"""

from __future__ import annotations

import json

import pytest

from tests.infra.bicep_model import (
    APP_PRINCIPAL,
    DEVELOPER_PRINCIPAL,
    ENTITY_SETTINGS,
    IDENTITY_CONNECTIONS,
    INFRA,
    ROLE,
    ROLE_NAME,
    accessor_path,
    app_roles_on,
    app_settings,
    bicep_files,
    body,
    entity_resource,
    evaluate,
    module_file,
    module_params,
    of_type,
    parse,
    role_assignments,
    scope_of,
)

# What the app identity must hold, per template: (role, scope resource type).
EXPECTED_APP_ROLES = {
    "core/storage.bicep": {
        ("storageBlobDataOwner", "Microsoft.Storage/storageAccounts"),
        ("storageTableDataContributor", "Microsoft.Storage/storageAccounts"),
        # The order_audit trigger's queue and its poison queue, each on its own (never the account).
        ("storageQueueDataContributor", "Microsoft.Storage/storageAccounts/queueServices/queues"),
    },
    "core/servicebus.bicep": {
        ("serviceBusDataOwner", "Microsoft.ServiceBus/namespaces/queues"),
        ("serviceBusDataOwner", "Microsoft.ServiceBus/namespaces/topics/subscriptions"),
        # The outbox destinations: send, nothing else (orders publishes OrderAccepted to the
        # topic; payments publishes BalanceChanged to a queue, which also holds a trigger's
        # Data Owner above).
        ("serviceBusDataSender", "Microsoft.ServiceBus/namespaces/topics"),
        ("serviceBusDataSender", "Microsoft.ServiceBus/namespaces/queues"),
    },
    "core/eventhubs.bicep": {
        ("eventHubsDataReceiver", "Microsoft.EventHub/namespaces/eventhubs"),
    },
    "core/monitoring.bicep": {
        ("monitoringMetricsPublisher", "Microsoft.Insights/components"),
    },
    "core/cosmos.bicep": {
        ("cosmosDataContributor", "database"),
    },
}
FORBIDDEN_FOR_APP = {
    "eventHubsDataSender", "eventHubsDataOwner", "owner", "contributor",
}
# Receiving entities of the bindings: setting -> role the app needs on that very entity.
# Service Bus: Data Owner, because the target-based scaler reads the entity's runtime properties
# (message counts) through the administration API, which needs the Manage claim.
RECEIVING_ENTITIES = {
    "ORDERS_QUEUE_NAME": "serviceBusDataOwner",
    "ORDER_STATUS_QUEUE_NAME": "serviceBusDataOwner",
    "NOTIFY_SUBSCRIPTION_NAME": "serviceBusDataOwner",
    "AUDIT_SUBSCRIPTION_NAME": "serviceBusDataOwner",
    "BALANCE_CHANGES_QUEUE": "serviceBusDataOwner",
    "PAYMENTS_HUB_NAME": "eventHubsDataReceiver",
}
SERVICE_BUS_TRIGGER_ENTITIES = {s for s, role in RECEIVING_ENTITIES.items() if role == "serviceBusDataOwner"}

ALL_ASSIGNMENTS = [(f, a) for f in bicep_files() for a in role_assignments(f)]


def _scope_type(relative, assignment):
    if assignment["kind"] == "cosmos":
        database_scope = "${account.id}/dbs/${databaseName}"
        return "database" if assignment["scope"] == database_scope else assignment["scope"]
    return parse(relative)["resources"][assignment["scope"]]["type"]


@pytest.mark.parametrize("relative", sorted(EXPECTED_APP_ROLES))
def test_app_identity_has_exactly_the_expected_roles(relative):
    granted = {(ROLE_NAME.get(a["role"], a["role"]), _scope_type(relative, a))
               for a in role_assignments(relative) if a["principal"] == APP_PRINCIPAL}
    assert granted == EXPECTED_APP_ROLES[relative]


def test_role_assignments_live_next_to_their_resources():
    """Each assignment's scope is a resource declared in the same template (not an `existing` ref)."""
    for relative, assignment in ALL_ASSIGNMENTS:
        if assignment["kind"] == "rbac":
            scope = parse(relative)["resources"].get(assignment["scope"])
            assert scope is not None, f"{relative}:{assignment['name']} scope is not a local resource"
            assert scope["existing"] is False, f"{relative}:{assignment['name']} scopes an existing resource"


# The entities the app's outbox publishes to: setting -> who publishes there.
OUTBOX_DESTINATIONS = {"NOTIFICATIONS_TOPIC_NAME": "orders", "BALANCE_CHANGES_QUEUE": "payments"}


def test_app_sends_only_to_the_outbox_destinations():
    """Data Sender on exactly the entities the outbox publishes to (the notifications topic,
    the balance-changes queue), each the entity its setting names."""
    senders = {a["scope"] for a in role_assignments("core/servicebus.bicep")
               if a["principal"] == APP_PRINCIPAL
               and ROLE_NAME.get(a["role"], a["role"]) == "serviceBusDataSender"}
    assert senders == {entity_resource(setting)[2] for setting in OUTBOX_DESTINATIONS}
    assert senders == {"notificationsTopic", "balanceChangesQueue"}


def test_the_outbox_destinations_are_the_ones_the_app_sends_to():
    """What the app's dispatcher is told are topics, and the queue payments sends to, are the
    entities holding the Data Sender role (by their settings)."""
    from functions.services import _topics
    from functions.settings import Settings

    settings = Settings.from_env({"TABLE_CONNECTION_STRING": "UseDevelopmentStorage=true",
                                  "COSMOS_ENDPOINT": "https://localhost:8081/",
                                  "NOTIFICATION_API_URL": "https://notifications.example/send"})
    assert set(_topics(settings)) == {settings.notifications_topic}
    assert settings.balance_changes_queue == "balance-changes"


def test_app_identity_never_gets_send_owner_or_management_roles():
    for relative, assignment in ALL_ASSIGNMENTS:
        if assignment["principal"] == APP_PRINCIPAL:
            role = ROLE_NAME.get(assignment["role"], assignment["role"])
            assert role not in FORBIDDEN_FOR_APP, f"{relative}:{assignment['name']} grants {role}"


def test_app_queue_role_is_scoped_to_exactly_the_audit_queue_and_its_poison_queue():
    """Storage Queue Data Contributor (the trigger updates messages: Message Processor lacks
    messages/write) on the queue ORDER_AUDIT_QUEUE_NAME names and on `<that>-poison`, nothing else."""
    _, relative, queue = entity_resource("ORDER_AUDIT_QUEUE_NAME")
    assert relative == "core/storage.bicep"
    queues = of_type(relative, "Microsoft.Storage/storageAccounts/queueServices/queues")
    (poison,) = [symbol for symbol in queues if symbol != queue]
    scope = scope_of(relative, {"auditQueueName": ENTITY_SETTINGS["ORDER_AUDIT_QUEUE_NAME"]})
    assert evaluate(body(queues[poison])["name"], scope) == "order-audit-poison"
    granted = {a["scope"] for a in role_assignments(relative) if a["principal"] == APP_PRINCIPAL
               and ROLE_NAME.get(a["role"]) == "storageQueueDataContributor"}
    assert granted == {queue, poison}
    (account,) = of_type(relative, "Microsoft.Storage/storageAccounts")
    assert "storageQueueDataContributor" not in app_roles_on(relative, account)


def test_app_assignments_are_unconditional_and_developer_ones_optional():
    principals = set()
    for relative, assignment in ALL_ASSIGNMENTS:
        principals.add(assignment["principal"])
        if assignment["principal"] == APP_PRINCIPAL:
            assert not assignment["conditional"], f"{relative}:{assignment['name']}"
        else:
            assert assignment["principal"] == DEVELOPER_PRINCIPAL, f"{relative}:{assignment['name']}"
            assert assignment["conditional"], f"{relative}:{assignment['name']} must be `if (!empty(...))`"
    assert principals == {APP_PRINCIPAL, DEVELOPER_PRINCIPAL}


def test_rbac_assignment_names_are_deterministic_per_scope_principal_and_role():
    for relative, assignment in ALL_ASSIGNMENTS:
        name = assignment["body"]["name"]["function"]
        assert name["type"] == "guid", f"{relative}:{assignment['name']}"
        args = list(name["parameters"].values())
        assert assignment["principal"] in args, f"{relative}:{assignment['name']}"
        if assignment["kind"] == "rbac":
            assert accessor_path(args[0]) == [assignment["scope"], "id"], f"{relative}:{assignment['name']}"
        assert assignment["body"]["properties"].get("principalType", "ServicePrincipal") in (
            "ServicePrincipal", "developerPrincipalType")


@pytest.mark.parametrize("setting", sorted(RECEIVING_ENTITIES))
def test_each_receiving_entity_grants_the_app_its_receiver_role_on_that_entity(setting):
    module, relative, symbol = entity_resource(setting)
    assert RECEIVING_ENTITIES[setting] in app_roles_on(relative, symbol), (
        f"{setting} -> {module}/{symbol}: app identity lacks {RECEIVING_ENTITIES[setting]}")


def test_consumer_group_belongs_to_the_granted_hub():
    _, relative, group = entity_resource("PAYMENTS_CONSUMER_GROUP")
    _, _, hub = entity_resource("PAYMENTS_HUB_NAME")
    assert body(parse(relative)["resources"][group])["parent"] == hub
    assert set(ENTITY_SETTINGS) >= set(RECEIVING_ENTITIES)


def test_one_identity_runs_the_app_holds_the_roles_and_is_named_by_the_connections():
    settings = app_settings()
    modules = parse("resources.bicep")["modules"]
    for name, module in modules.items():
        params = module["config"].get("params", {})
        if "appPrincipalId" in params:
            assert accessor_path(params["appPrincipalId"]) == ["identity", "outputs", "principalId"], name
    assert accessor_path(module_params("resources.bicep", "functionApp")["identityId"]) == [
        "identity", "outputs", "id"]
    for connection, module in IDENTITY_CONNECTIONS.items():
        assert settings[f"{connection}__credential"] == "managedidentity"
        assert accessor_path(settings[f"{connection}__clientId"]) == ["identity", "outputs", "clientId"]
        endpoint_kinds = {"fullyQualifiedNamespace", "blobServiceUri", "accountName"}
        endpoint_keys = [k for k in settings if k.startswith(f"{connection}__")
                         and k.split("__", 1)[1] in endpoint_kinds]
        assert endpoint_keys, f"{connection} has no identity-based endpoint setting"
        for key in endpoint_keys:
            # The endpoint comes from the module that grants the app its roles.
            assert accessor_path(settings[key])[0] == module, key
            assert "appPrincipalId" in module_params("resources.bicep", module), key
    assert accessor_path(settings["AZURE_CLIENT_ID"]) == ["identity", "outputs", "clientId"]
    assert accessor_path(settings["COSMOS_ENDPOINT"])[0] == "cosmos"
    assert accessor_path(settings["TABLE_ENDPOINT"])[0] == "storage"
    assert accessor_path(settings["APPLICATIONINSIGHTS_CONNECTION_STRING"])[0] == "monitoring"


def test_cosmos_data_role_is_scoped_to_the_app_database():
    (assignment,) = [a for a in role_assignments("core/cosmos.bicep") if a["principal"] == APP_PRINCIPAL]
    assert assignment["role"] == ROLE["cosmosDataContributor"]
    assert assignment["scope"] == "${account.id}/dbs/${databaseName}"
    assert module_params("resources.bicep", "cosmos")["databaseName"] == "cosmosDatabaseName"
    assert app_settings()["COSMOS_DATABASE"] == "cosmosDatabaseName"
    (database,) = of_type("core/cosmos.bicep", "Microsoft.DocumentDB/databaseAccounts/sqlDatabases").values()
    assert body(database)["name"] == "databaseName"


def test_storage_role_covers_host_storage_and_tables_of_the_same_account():
    assert module_file("storage") == "core/storage.bicep"
    (account,) = of_type("core/storage.bicep", "Microsoft.Storage/storageAccounts")
    assert app_roles_on("core/storage.bicep", account) == {
        "storageBlobDataOwner", "storageTableDataContributor"}


# --- Service Bus: the Manage claim for target-based scaling, on the trigger entities only -----------
def test_service_bus_data_owner_only_on_the_entities_the_triggers_read():
    granted = {a["scope"] for a in role_assignments("core/servicebus.bicep")
               if a["principal"] == APP_PRINCIPAL and a["role"] == ROLE["serviceBusDataOwner"]}
    triggers = {entity_resource(setting)[2] for setting in SERVICE_BUS_TRIGGER_ENTITIES}
    assert granted == triggers
    namespace = next(iter(of_type("core/servicebus.bicep", "Microsoft.ServiceBus/namespaces")))
    topic = next(iter(of_type("core/servicebus.bicep", "Microsoft.ServiceBus/namespaces/topics")))
    assert namespace not in granted and topic not in granted


def test_app_holds_no_redundant_receiver_role_next_to_data_owner():
    """Data Owner on what the triggers read, Data Sender on the outbox destinations: no
    Data Receiver next to either."""
    for a in role_assignments("core/servicebus.bicep"):
        if a["principal"] == APP_PRINCIPAL:
            assert a["role"] in (ROLE["serviceBusDataOwner"], ROLE["serviceBusDataSender"]), a["name"]


def test_scaling_rights_are_documented():
    readme = (INFRA / "README.md").read_text()
    assert "Azure Service Bus Data Owner" in readme
    assert "target-based scaling" in readme.lower()
    assert "Manage" in readme


# --- Deployer data-plane roles: opt-in ----------------------------------------------------------------
def test_deployer_data_roles_are_opt_in_and_off_by_default():
    main = parse("main.bicep")
    param = main["parameters"]["grantDeployerDataRoles"]
    assert param["type"] == "bool" and param["default"] is False
    passed = main["modules"]["resources"]["config"]["params"]["principalId"]
    scope = scope_of("main.bicep", {"principalId": "0000-deployer"})
    assert evaluate(passed, scope) == "", "default: no developer role assignments"
    assert evaluate(passed, {**scope, "grantDeployerDataRoles": True}) == "0000-deployer"
    values = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert values["grantDeployerDataRoles"]["value"] == "${GRANT_DEPLOYER_DATA_ROLES=false}"


def test_every_developer_assignment_hangs_on_the_gated_principal():
    """The opt-in gates everything: every developer assignment is conditional on the principal id
    main.bicep passes only when grantDeployerDataRoles is true."""
    modules = parse("resources.bicep")["modules"]
    for name, module in modules.items():
        params = module["config"].get("params", {})
        if DEVELOPER_PRINCIPAL in params:
            assert params[DEVELOPER_PRINCIPAL] == "principalId", name
    for relative, assignment in ALL_ASSIGNMENTS:
        if assignment["principal"] == DEVELOPER_PRINCIPAL:
            assert assignment["conditional"], f"{relative}:{assignment['name']}"

