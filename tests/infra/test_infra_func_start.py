"""`func start` from the sample: the docs' func start section (docs/deploy.md) names only settings
that exist, the sample works as it is against the local servers, and the docs' Azure setting names
match the Bicep app settings.
"""

from __future__ import annotations

import base64
import json
import re
import uuid

from tests.functions.conftest import registered_functions
from tests.infra.bicep_model import IDENTITY_CONNECTIONS, REPO, app_settings

SAMPLE = REPO / "local.settings.sample.json"
DOCS = REPO / "docs" / "deploy.md"
# A setting name as the docs write it: UPPER_CASE, a connection name with `__suffix`, or a
# host switch `AzureWebJobs.<function>.Disabled`.
_NAME = re.compile(r"^(?:[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|AzureWebJobs\w*(?:__\w+)?|"
                   r"(?:ServiceBus|EventHub)Connection(?:__\w+)?|AzureWebJobs\.\w+\.Disabled)$")


def _sample() -> dict[str, str]:
    return json.loads(SAMPLE.read_text())["Values"]


def _section(title: str) -> str:
    text = DOCS.read_text()
    start = text.index(f"\n## {title}\n")
    return text[start:text.index("\n## ", start + 1)]


def _quoted_names(text: str) -> set[str]:
    found = set(re.findall(r"`([^`\s]+)`", text)) | set(re.findall(r'"([^"\s]+)":', text))
    return {name for name in found if _NAME.match(name)}


def test_every_setting_the_func_start_section_names_is_in_the_sample():
    section = _section("Run with func start")
    names = _quoted_names(section)
    assert {"AzureWebJobsStorage", "COSMOS_KEY", "AzureWebJobs.payments.Disabled"} <= names, names
    sample = _sample()
    missing = sorted(n for n in names if n not in sample)
    assert not missing, f"the func start section names settings the sample lacks: {missing}"


def test_every_disabled_switch_names_a_real_function():
    functions = {fn.get_function_name() for fn in registered_functions()}
    switches = {n for n in _sample() | dict.fromkeys(_quoted_names(_section("Run with func start")))
                if n.startswith("AzureWebJobs.") and n.endswith(".Disabled")}
    names = {s.split(".")[1] for s in switches}
    assert names, "no AzureWebJobs.<function>.Disabled entries"
    assert names <= functions, f"no such function: {sorted(names - functions)}"
    # Every broker-triggered function has its switch (one emulator runs at a time).
    assert {"orders", "order_status", "notify", "audit", "payments", "balance_projection"} <= names


def test_sample_runs_the_service_bus_profile_as_is():
    sample = _sample()
    assert sample["AzureWebJobs.payments.Disabled"] == "true"
    for name in ("orders", "order_status", "notify", "audit", "balance_projection"):
        assert sample[f"AzureWebJobs.{name}.Disabled"] == "false"


def test_sample_cosmos_key_is_a_real_key_not_a_placeholder():
    key = _sample()["COSMOS_KEY"]
    assert len(base64.b64decode(key, validate=True)) == 64


def test_sample_settings_build_the_stores_on_the_local_servers(stack):
    """The sample as it is, with only the local servers' ports (free ports here, 8081/10002 in the
    emulators) and a fresh database: the key authenticates and the app's stores work."""
    from functions.services import real_stores
    from functions.settings import Settings

    sample = _sample()
    database = f"sample-{uuid.uuid4().hex[:8]}"
    env = {**sample, "COSMOS_ENDPOINT": stack.cosmos_endpoint,
           "TABLE_CONNECTION_STRING": stack.table_connection_string,
           "AzureWebJobsStorage": stack.table_connection_string, "COSMOS_DATABASE": database}
    settings = Settings.from_env(env)
    assert settings.cosmos_key == sample["COSMOS_KEY"]
    stores = real_stores(settings)
    for role in ("orders", "parked"):  # one Cosmos, one Table store: both authenticate
        assert stores(role).get_record("p", f"missing-{uuid.uuid4().hex}") is None
    from azure.cosmos import CosmosClient

    CosmosClient(stack.cosmos_endpoint, sample["COSMOS_KEY"], connection_verify=False).delete_database(
        database)


def test_docs_azure_setting_names_match_bicep():
    """`__suffix` names the Settings table gives for each identity connection exist in Bicep."""
    deployed = set(app_settings())
    table = _section("Settings")
    for connection in IDENTITY_CONNECTIONS:
        rows = [line for line in table.splitlines() if line.startswith("|") and f"`{connection}`" in line]
        assert rows, f"the Settings table has no row for {connection}"
        suffixes = set(re.findall(r"`(__\w+)`", " ".join(rows)))
        assert suffixes, f"{connection}: no Azure setting names"
        for suffix in suffixes:
            assert f"{connection}{suffix}" in deployed, \
                f"docs/deploy.md names {connection}{suffix}, Bicep has not"
        bicep_suffixes = {name[len(connection):] for name in deployed if name.startswith(f"{connection}__")}
        assert bicep_suffixes <= suffixes, \
            f"{connection}: docs/deploy.md omits {sorted(bicep_suffixes - suffixes)}"
