"""The Bicep templates parse, and their modules are wired consistently.

No Bicep CLI here: what `bicep build` would catch first (missing module files,
unknown or missing module parameters, parameters files that name nothing) is
checked on the pycep parse instead.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.infra.bicep_model import INFRA, bicep_files, parse

FILES = bicep_files()


def test_templates_exist():
    assert {"main.bicep", "resources.bicep"} <= set(FILES)
    assert len(FILES) >= 8


@pytest.mark.parametrize("relative", FILES)
def test_every_bicep_file_parses(relative):
    template = parse(relative)
    assert template.get("resources") or template.get("modules"), f"{relative} declares nothing"


@pytest.mark.parametrize("relative", FILES)
def test_no_syntax_pycep_cannot_read(relative):
    """Multi-line ternaries, filtered loops and user-defined types break pycep-parser."""
    text = (INFRA / relative).read_text()
    code = "\n".join(line.split("//", 1)[0] if "'" not in line else line for line in text.splitlines())
    assert not re.search(r"^\s*type\s+\w+\s*=", code, re.M), "user-defined type"
    assert not re.search(r"^\s*func\s+\w+", code, re.M), "user-defined function"
    assert not re.search(r"\bfor\b[^\n]*:\s*if\s*\(", code), "filtered for-loop"
    assert not re.search(r"\?\s*$", code, re.M), "ternary continued on the next line"
    assert not re.search(r"^\s*[?:]\s", code, re.M), "ternary continued on the next line"


@pytest.mark.parametrize("relative", FILES)
def test_api_versions_are_ga(relative):
    for name, res in parse(relative).get("resources", {}).items():
        assert "preview" not in res["api_version"], f"{relative}:{name} uses {res['api_version']}"


def _module_edges():
    for relative in FILES:
        for name, module in parse(relative).get("modules", {}).items():
            yield relative, name, module


@pytest.mark.parametrize(("relative", "name", "module"), list(_module_edges()),
                         ids=[f"{r}:{n}" for r, n, _ in _module_edges()])
def test_module_calls_match_module_parameters(relative, name, module):
    assert module["type"] == "local", f"{relative}:{name}: registry modules cannot be checked offline"
    target = ((INFRA / relative).parent / module["detail"]["path"]).resolve()
    assert target.exists(), f"{relative}:{name} -> missing {target}"
    declared = parse(str(target.relative_to(INFRA)))["parameters"]
    passed = set(module["config"].get("params", {}))
    unknown = passed - set(declared)
    assert not unknown, f"{relative}:{name} passes undeclared parameters {sorted(unknown)}"
    required = {p for p, d in declared.items() if d.get("default") is None}  # pycep: None = no default
    missing = required - passed
    assert not missing, f"{relative}:{name} misses required parameters {sorted(missing)}"


def test_main_parameters_file_matches_main_bicep():
    declared = parse("main.bicep")["parameters"]
    values = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    assert set(values) <= set(declared), sorted(set(values) - set(declared))
    required = {p for p, d in declared.items() if d.get("default") is None}  # pycep: None = no default
    assert required <= set(values), sorted(required - set(values))


def test_main_is_subscription_scoped_and_resources_group_scoped():
    assert parse("main.bicep")["globals"]["scope"]["value"] == "subscription"
    assert parse("resources.bicep")["globals"]["scope"]["value"] == "resourceGroup"
    module = parse("main.bicep")["modules"]["resources"]
    assert module["detail"]["path"] == "resources.bicep"
    assert module["config"]["scope"] == "rg"


def test_no_keys_or_connection_strings_are_read_from_resources():
    """Identity everywhere: no listKeys(), no connection strings built from account keys."""
    for relative in FILES:
        text = (INFRA / relative).read_text()
        assert "listKeys(" not in text, relative
        assert "listConnectionStrings(" not in text, relative
        assert "AccountKey=" not in text, relative
        assert "SharedAccessKey" not in text, relative


def test_azure_yaml_declares_the_function_service():
    text = (INFRA.parent / "azure.yaml").read_text()
    # Small, flat YAML: check the lines rather than pull in a YAML parser for the test venv.
    lines = [line.rstrip() for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert "services:" in lines
    service = lines[lines.index("services:") + 1:]
    assert service[0] == "  api:"
    fields = dict(line.strip().split(": ", 1) for line in service[1:4])
    assert fields == {"project": ".", "language": "python", "host": "function"}
    assert "  path: infra" in lines
    assert "  module: main" in lines
