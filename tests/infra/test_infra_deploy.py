"""`azd provision` as a service principal: the preprovision hook sets AZURE_PRINCIPAL_TYPE.

The bash hook runs for real against a stand-in `azd` on PATH that serves the access token a
user or a service principal would get and records `azd env set`. (No PowerShell on these
machines: the Windows hook is checked for making the same decision.)
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.infra.bicep_model import INFRA, REPO, load_yaml, parse

HOOKS = INFRA / "hooks"
BASH_HOOK = HOOKS / "principal-type.sh"
PWSH_HOOK = HOOKS / "principal-type.ps1"
USER_CLAIMS = {"aud": "https://management.core.windows.net/", "oid": "user-oid", "scp": "user_impersonation",
               "upn": "dev@example.test", "name": "Dev ~~~ >>> ???"}
APP_CLAIMS = {"aud": "https://management.core.windows.net/", "oid": "sp-oid", "appid": "ci-app",
              "idtyp": "app", "roles": [], "note": "~~~ >>> ??? ~"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _jwt(claims: dict) -> str:
    header = _b64url(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    return f"{header}.{_b64url(json.dumps(claims).encode())}.c2lnbmF0dXJl"


def _fake_azd(tmp_path: Path, token_json: str | None) -> Path:
    """A stand-in `azd`: `auth token --output json` prints token_json (or fails), `env set` logs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "token.json").write_text(token_json or "")
    script = bin_dir / "azd"
    script.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        if [ "$1 $2 $3 $4" = "auth token --output json" ]; then
          {"cat " + str(tmp_path / "token.json") if token_json is not None else
           "echo 'ERROR: not logged in, run azd auth login' >&2; exit 1"}
        elif [ "$1 $2" = "env set" ]; then
          echo "$3=$4" >> {tmp_path / "env-set.log"}
        else
          echo "unexpected azd call: $*" >&2; exit 2
        fi
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _run_hook(tmp_path: Path, token_json: str | None) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = _fake_azd(tmp_path, token_json)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("AZURE_PRINCIPAL_TYPE", None)
    proc = subprocess.run(["bash", str(BASH_HOOK)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    log = tmp_path / "env-set.log"
    return proc, (log.read_text().splitlines() if log.exists() else [])


def test_test_tokens_exercise_base64url_and_padding():
    """The claims above encode with '-' / '_' and without padding, as real tokens do."""
    for claims in (USER_CLAIMS, APP_CLAIMS):
        payload = _jwt(claims).split(".")[1]
        assert set(payload) & {"-", "_"}, "payload should contain base64url-only characters"
        assert len(payload) % 4 != 0, "payload should need padding"


@pytest.mark.parametrize(("claims", "expected"), [(USER_CLAIMS, "User"), (APP_CLAIMS, "ServicePrincipal")])
@pytest.mark.parametrize("pretty", [False, True])
def test_bash_hook_sets_the_principal_type_of_the_signed_in_identity(tmp_path, claims, expected, pretty):
    token_json = json.dumps({"token": _jwt(claims), "expiresOn": "2030-01-01T00:00:00Z"},
                            indent=2 if pretty else None)
    proc, calls = _run_hook(tmp_path, token_json)
    assert proc.returncode == 0, proc.stderr
    assert calls == [f"AZURE_PRINCIPAL_TYPE={expected}"]


def test_bash_hook_fails_loudly_without_a_login(tmp_path):
    proc, calls = _run_hook(tmp_path, None)
    assert proc.returncode != 0
    assert calls == [], "no principal type may be guessed without a token"


def test_bash_hook_rejects_output_that_is_not_a_token(tmp_path):
    proc, calls = _run_hook(tmp_path, json.dumps({"token": _jwt({"hello": "world"})}))
    assert proc.returncode != 0
    assert "azd auth login" in proc.stderr
    assert calls == []


def test_powershell_hook_makes_the_same_decision():
    text = PWSH_HOOK.read_text()
    assert "azd auth token --output json" in text
    assert "Replace('-', '+').Replace('_', '/')" in text, "base64url must be mapped before decoding"
    assert "-contains 'scp'" in text
    assert "azd env set AZURE_PRINCIPAL_TYPE $type" in text
    assert "$ErrorActionPreference = 'Stop'" in text
    assert text.count("$LASTEXITCODE -ne 0") == 2, "both azd calls must be checked"


def test_azure_yaml_runs_the_hook_before_provisioning():
    config = load_yaml(REPO / "azure.yaml")
    hook = config["hooks"]["preprovision"]
    assert hook["posix"] == {"shell": "sh", "run": "./infra/hooks/principal-type.sh",
                             "continueOnError": False}
    assert hook["windows"] == {"shell": "pwsh", "run": "./infra/hooks/principal-type.ps1",
                               "continueOnError": False}
    for entry in hook.values():
        assert (REPO / entry["run"]).is_file()
    assert os.access(BASH_HOOK, os.X_OK)


def test_hook_output_reaches_the_principal_type_parameter():
    values = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert values["principalType"]["value"] == "${AZURE_PRINCIPAL_TYPE=User}"
    assert values["principalId"]["value"] == "${AZURE_PRINCIPAL_ID}"
    allowed = next(d["argument"] for d in parse("main.bicep")["parameters"]["principalType"]["decorators"]
                   if d["type"] == "allowed")
    assert {"User", "ServicePrincipal"} <= set(allowed)
    module = parse("main.bicep")["modules"]["resources"]["config"]["params"]
    assert module["principalType"] == "principalType"


def test_hooks_are_not_deployed_with_the_app():
    ignored = (REPO / ".funcignore").read_text().splitlines()
    assert "infra/" in ignored and "azure.yaml" in ignored
