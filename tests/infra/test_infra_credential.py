"""The app's SDK credential is deterministic in Azure and keeps the developer chain locally.

In Azure the app settings select the managed identity through AZURE_TOKEN_CREDENTIALS, so
DefaultAzureCredential builds a chain of that one credential (no environment, CLI or broker
probes before it, and no surprise fallback after it). The local sample leaves it unset. The chain
is read from the credential the app itself builds (functions/services.py), with the installed
azure-identity deciding what the value means.
"""

from __future__ import annotations

import json

import pytest

from tests.infra.bicep_model import AZURE_ONLY_SETTINGS, REPO, app_settings

SETTING = "AZURE_TOKEN_CREDENTIALS"
SAMPLE = REPO / "local.settings.sample.json"


def _sample() -> dict[str, str]:
    return json.loads(SAMPLE.read_text())["Values"]


def _chain(monkeypatch, value: str | None, *, aio: bool = False) -> list[str]:
    import functions.services as services
    from functions.settings import Settings

    env = {**_sample(), "AZURE_CLIENT_ID": "00000000-0000-0000-0000-000000000001"}
    if value is None:
        monkeypatch.delenv(SETTING, raising=False)
    else:
        monkeypatch.setenv(SETTING, value)
    settings = Settings.from_env(env)
    credential = services.RealAsyncStores(settings)._identity() if aio else services._credential(settings)
    return [type(c).__name__ for c in credential.credentials]


def test_bicep_selects_the_managed_identity():
    assert app_settings()[SETTING] == "ManagedIdentityCredential"


@pytest.mark.parametrize("aio", [False, True], ids=["sync", "async"])
def test_the_deployed_value_makes_the_app_credential_managed_identity_only(monkeypatch, aio):
    chain = _chain(monkeypatch, app_settings()[SETTING], aio=aio)
    assert chain == ["ManagedIdentityCredential"]


def test_without_the_setting_the_chain_probes_more_than_the_managed_identity(monkeypatch):
    """The counter-proof: what the app had in Azure before, and what a local run keeps."""
    chain = _chain(monkeypatch, None)
    assert "ManagedIdentityCredential" in chain
    assert "AzureCliCredential" in chain and len(chain) > 1


def test_local_runs_keep_the_developer_chain():
    assert SETTING not in _sample()
    assert SETTING in AZURE_ONLY_SETTINGS
