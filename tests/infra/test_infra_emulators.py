"""The Docker emulator configs declare the same entities as Bicep and the settings contract.

compose.yaml is read with the PyYAML of the infra venv (.venv-infra, created for
checkov); without that venv the compose checks skip locally and fail in CI.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.infra.bicep_model import (
    DOCKER,
    ENTITY_SETTINGS,
    infra_venv_bin,
    load_yaml,
    param_defaults,
)

SB_CONFIG = DOCKER / "servicebus" / "Config.json"
EH_CONFIG = DOCKER / "eventhubs" / "Config.json"
COMPOSE = DOCKER / "compose.yaml"
_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")


def seconds(iso: str) -> int:
    match = _DURATION.match(iso)
    assert match, iso
    days, hours, minutes, secs = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + secs


def _sb():
    (namespace,) = json.loads(SB_CONFIG.read_text())["UserConfig"]["Namespaces"]
    return namespace


def _eh():
    (namespace,) = json.loads(EH_CONFIG.read_text())["UserConfig"]["NamespaceConfig"]
    return namespace


def test_service_bus_emulator_declares_the_contract_entities():
    namespace = _sb()
    assert namespace["Name"] == "sbemulatorns", "the emulator accepts this namespace name only"
    queues = {q["Name"] for q in namespace["Queues"]}
    assert queues == {ENTITY_SETTINGS["ORDERS_QUEUE_NAME"], ENTITY_SETTINGS["ORDER_STATUS_QUEUE_NAME"],
                      ENTITY_SETTINGS["BALANCE_CHANGES_QUEUE"]}
    (topic,) = namespace["Topics"]
    assert topic["Name"] == ENTITY_SETTINGS["NOTIFICATIONS_TOPIC_NAME"]
    assert {s["Name"] for s in topic["Subscriptions"]} == {
        ENTITY_SETTINGS["NOTIFY_SUBSCRIPTION_NAME"], ENTITY_SETTINGS["AUDIT_SUBSCRIPTION_NAME"]}


def test_service_bus_emulator_delivery_settings_match_bicep():
    defaults = param_defaults("resources.bicep")
    namespace = _sb()
    receivers = [*namespace["Queues"], *namespace["Topics"][0]["Subscriptions"]]
    for entity in receivers:
        props = entity["Properties"]
        assert seconds(props["LockDuration"]) == defaults["serviceBusLockDurationSeconds"], entity["Name"]
        assert props["MaxDeliveryCount"] == defaults["serviceBusMaxDeliveryCount"], entity["Name"]
        assert props["DeadLetteringOnMessageExpiration"] is True, entity["Name"]
        assert props["RequiresSession"] is False, entity["Name"]
    orders = next(q for q in namespace["Queues"] if q["Name"] == ENTITY_SETTINGS["ORDERS_QUEUE_NAME"])
    assert orders["Properties"]["RequiresDuplicateDetection"] is True


def test_service_bus_emulator_limits_are_respected():
    """Emulator quotas: TTL <= 1 h, duplicate window 5 s..5 min, lock 5 s..5 min, <= 10 deliveries."""
    namespace = _sb()
    for entity in [*namespace["Queues"], *namespace["Topics"]]:
        props = entity["Properties"]
        assert seconds(props["DefaultMessageTimeToLive"]) <= 3600, entity["Name"]
        if props.get("RequiresDuplicateDetection"):
            assert 5 <= seconds(props["DuplicateDetectionHistoryTimeWindow"]) <= 300, entity["Name"]
    for entity in [*namespace["Queues"], *namespace["Topics"][0]["Subscriptions"]]:
        props = entity["Properties"]
        assert 5 <= seconds(props["LockDuration"]) <= 300, entity["Name"]
        assert 1 <= props["MaxDeliveryCount"] <= 10, entity["Name"]


def test_event_hubs_emulator_declares_the_contract_entities():
    namespace = _eh()
    assert namespace["Type"] == "EventHub"
    assert namespace["Name"] == "emulatorNs1", "the emulator accepts this namespace name only"
    (hub,) = namespace["Entities"]
    assert hub["Name"] == ENTITY_SETTINGS["PAYMENTS_HUB_NAME"]
    # The emulator's schema (2024 onwards) requires an integer; a quoted "4" is rejected at startup.
    count = hub["PartitionCount"]
    assert type(count) is int, f"PartitionCount must be a JSON integer, not {type(count).__name__}"
    assert count == param_defaults("resources.bicep")["eventHubPartitionCount"]
    assert [g["Name"] for g in hub["ConsumerGroups"]] == [ENTITY_SETTINGS["PAYMENTS_CONSUMER_GROUP"]]


@pytest.fixture(scope="module")
def compose():
    if not infra_venv_bin("python").exists():
        message = ("infra venv missing: python3 -m venv .venv-infra && "
                   ".venv-infra/bin/pip install -r requirements-infra.txt")
        pytest.fail(message)  # `./dev test` installs it; a missing tool must not pass quietly
    return load_yaml(COMPOSE)


def test_compose_separates_the_two_amqp_emulators(compose):
    services = compose["services"]
    assert services["servicebus"]["profiles"] == ["servicebus"]
    assert services["eventhubs"]["profiles"] == ["eventhubs"]
    for name in ("servicebus", "eventhubs"):
        assert "5672:5672" in services[name]["ports"], name
    amqp = [n for n, s in services.items() if any(str(p).startswith("5672:") for p in s.get("ports", []))]
    profiles = [tuple(services[n].get("profiles", [])) for n in amqp]
    assert all(profiles), "a service binding 5672 without a profile would clash with both emulators"
    assert len(set(profiles)) == len(profiles), "two services binding 5672 share a profile"


def test_compose_services(compose):
    services = compose["services"]
    assert "profiles" not in services["azurite"], "the Functions host always needs Azurite"
    assert services["cosmos"]["profiles"] == ["cosmos"]
    assert "8081:8081" in services["cosmos"]["ports"]
    sb = services["servicebus"]
    assert sb["environment"]["SQL_SERVER"] in services
    assert sb["environment"]["SQL_SERVER"] in sb["depends_on"]
    assert services[sb["environment"]["SQL_SERVER"]]["profiles"] == ["servicebus"]
    eh = services["eventhubs"]
    assert eh["environment"]["BLOB_SERVER"] == "azurite"
    assert eh["environment"]["METADATA_SERVER"] == "azurite"
    for name in ("servicebus", "eventhubs", "servicebus-sql"):
        eula = services[name]["environment"]["ACCEPT_EULA"]
        assert eula == "${ACCEPT_EULA:-N}", f"{name}: the user accepts the EULA, not the file"


@pytest.mark.parametrize(("service", "config", "target"), [
    ("servicebus", SB_CONFIG, "/ServiceBus_Emulator/ConfigFiles/Config.json"),
    ("eventhubs", EH_CONFIG, "/Eventhubs_Emulator/ConfigFiles/Config.json"),
])
def test_compose_mounts_the_entity_configs(compose, service, config, target):
    mounts = [v.split(":") for v in compose["services"][service]["volumes"]]
    (source, mounted, *_) = next(m for m in mounts if m[1] == target)
    assert mounted == target
    assert (COMPOSE.parent / source).resolve() == config.resolve()
