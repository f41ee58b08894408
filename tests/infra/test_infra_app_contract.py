"""Contract between the app code and its two configurations: the Bicep app settings
(Azure) and local.settings.sample.json (local runs).

Reads what the code declares, not a copy of it:
  * functions.settings.SETTING_NAMES: every setting the app reads (and, when the module
    declares them, LOCAL_ONLY_SETTINGS, COSMOS_CONTAINERS and TABLES);
  * function_app.app: the indexed functions, whose bindings name their connections
    (`connection=`) and entity settings (`%NAME%`).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys

import pytest

from tests.infra.bicep_model import (
    AZURE_ONLY_SETTINGS,
    COSMOS_CONTAINERS,
    ENTITY_SETTINGS,
    IDENTITY_CONNECTIONS,
    LOCAL_ONLY_SETTINGS,
    REPO,
    TABLES,
    app_settings,
    body,
    of_type,
    parse,
)

SAMPLE = REPO / "local.settings.sample.json"
_PERCENT = re.compile(r"%([A-Za-z0-9_]+)%")
# Bindings that send: the app would need a Data Sender role for these (it has none by design).
SENDING_BINDINGS = {"serviceBus", "eventHub"}


def _sample_values() -> dict[str, str]:
    assert SAMPLE.exists(), "local.settings.sample.json is missing at the repo root"
    return json.loads(SAMPLE.read_text())["Values"]


@pytest.fixture(scope="module")
def settings_module():
    return _import_code()[0]


@pytest.fixture(scope="module")
def code():
    """SETTING_NAMES and every binding dict, imported with the sample settings in the env."""
    from simulator.host_inputs import indexed_functions

    settings, _ = _import_code()
    bindings = []
    for function in indexed_functions():
        for binding in function.get_bindings_dict()["bindings"]:
            bindings.append({**binding, "function": function.get_function_name()})
    assert bindings, "function_app.app declares no bindings"
    return tuple(settings.SETTING_NAMES), bindings


def _import_code():
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    saved = dict(os.environ)
    # Import-time configuration reads see the documented local values, never the caller's.
    for key, value in _sample_values().items():
        os.environ.setdefault(key, str(value))
    try:
        return importlib.import_module("functions.settings"), importlib.import_module("function_app")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _connections(bindings: list[dict]) -> set[str]:
    return {b["connection"] for b in bindings if b.get("connection")}


def _percent_names(bindings: list[dict]) -> set[str]:
    names = set()
    for binding in bindings:
        for value in binding.values():
            if isinstance(value, str):
                names.update(_PERCENT.findall(value))
    return names


def _defined_in_bicep(name: str, deployed: set[str]) -> bool:
    """Defined directly, or (for a connection) through identity-based `name__*` settings."""
    return name in deployed or any(key.startswith(f"{name}__") for key in deployed)


def _defined_in_sample(name: str, values: dict[str, str]) -> bool:
    return name in values or any(key.startswith(f"{name}__") for key in values)


def test_every_binding_connection_is_configured_by_identity_and_locally(code):
    _, bindings = code
    deployed, sample = set(app_settings()), _sample_values()
    for connection in _connections(bindings):
        assert connection in IDENTITY_CONNECTIONS, f"unknown connection {connection}: add it to infra/"
        assert f"{connection}__credential" in deployed, connection
        assert f"{connection}__clientId" in deployed, connection
        assert _defined_in_sample(connection, sample), f"{connection} missing in local.settings.sample.json"


def test_every_percent_setting_is_defined_in_bicep_and_the_sample(code):
    _, bindings = code
    deployed, sample = set(app_settings()), _sample_values()
    names = _percent_names(bindings)
    assert names, "bindings use no %SETTING% expressions"
    assert not names - deployed, f"missing in Bicep app settings: {sorted(names - deployed)}"
    assert not names - set(sample), f"missing in local.settings.sample.json: {sorted(names - set(sample))}"


def _local_only(settings_module) -> set[str]:
    """Local-only settings: the contract's, plus those the code itself declares local-only."""
    return LOCAL_ONLY_SETTINGS | set(getattr(settings_module, "LOCAL_ONLY_SETTINGS", ()))


def test_every_setting_the_app_reads_is_defined_in_bicep(code, settings_module):
    setting_names, _ = code
    deployed = set(app_settings())
    local_only = _local_only(settings_module)
    missing = [n for n in setting_names if n not in local_only and not _defined_in_bicep(n, deployed)]
    assert not missing, f"read by the app, absent from infra/resources.bicep appSettings: {missing}"
    deployed_local_only = sorted(local_only & deployed)
    assert not deployed_local_only, f"local-only settings deployed to Azure: {deployed_local_only}"


def test_store_names_in_the_code_match_bicep(settings_module):
    containers = getattr(settings_module, "COSMOS_CONTAINERS", COSMOS_CONTAINERS)
    deployed = {}
    for res in of_type("core/cosmos.bicep",
                       "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers").values():
        resource = body(res)["properties"]["resource"]
        deployed[resource["id"]] = resource["partitionKey"]["paths"][0]
    assert dict(containers) == deployed
    tables = set(getattr(settings_module, "TABLES", TABLES))
    assert tables == set(parse("core/storage.bicep")["variables"]["tableNames"]["value"])


def test_every_setting_the_app_reads_is_defined_in_the_sample(code):
    setting_names, _ = code
    sample = _sample_values()
    missing = [n for n in setting_names
               if n not in AZURE_ONLY_SETTINGS and not _defined_in_sample(n, sample)]
    assert not missing, f"read by the app, absent from local.settings.sample.json: {missing}"
    # The Azure-only table endpoint has its local counterpart.
    if "TABLE_ENDPOINT" in setting_names:
        assert "TABLE_CONNECTION_STRING" in sample


def test_settings_read_by_the_code_cover_the_contract(code):
    setting_names, bindings = code
    read = set(setting_names) | _percent_names(bindings) | _connections(bindings)
    for name in ENTITY_SETTINGS:
        assert name in read, f"{name} is deployed but the code never reads it"


def test_sample_entity_names_match_bicep_and_the_emulators():
    sample = _sample_values()
    for setting, name in ENTITY_SETTINGS.items():
        assert sample.get(setting) == name, setting


def test_bindings_only_receive_so_no_sender_role_is_needed(code):
    _, bindings = code
    sending = [f"{b['function']}:{b['type']}" for b in bindings
               if b["type"] in SENDING_BINDINGS and str(b.get("direction")).upper().endswith("OUT")]
    assert not sending, f"output bindings {sending} need Data Sender roles in infra/"


def test_triggers_read_the_granted_entities(code):
    """Each broker trigger names its entity through the contract settings (granted in infra/)."""
    _, bindings = code
    allowed = {
        "serviceBusTrigger": {"queueName": {"ORDERS_QUEUE_NAME", "ORDER_STATUS_QUEUE_NAME",
                                            "BALANCE_CHANGES_QUEUE"},
                              "topicName": {"NOTIFICATIONS_TOPIC_NAME"},
                              "subscriptionName": {"NOTIFY_SUBSCRIPTION_NAME", "AUDIT_SUBSCRIPTION_NAME"}},
        "eventHubTrigger": {"eventHubName": {"PAYMENTS_HUB_NAME"},
                            "consumerGroup": {"PAYMENTS_CONSUMER_GROUP"}},
        "queueTrigger": {"queueName": {"ORDER_AUDIT_QUEUE_NAME"}},
    }
    seen = set()
    for binding in bindings:
        fields = allowed.get(binding["type"])
        if not fields:
            continue
        for field, settings in fields.items():
            if field in binding:
                names = set(_PERCENT.findall(binding[field]))
                assert names and names <= settings, f"{binding['function']}.{field} = {binding[field]}"
                seen |= names
    assert seen == set(ENTITY_SETTINGS), f"entities without a trigger: {sorted(set(ENTITY_SETTINGS) - seen)}"
