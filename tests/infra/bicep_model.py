"""Offline model of the Bicep templates in infra/, built with pycep-parser.

There is no Bicep CLI on these machines, so the tests read the templates through
pycep-parser and evaluate the few expression shapes the templates use (parameter
references, string interpolation, max/min/string, + and *). pycep does not tell
identifiers from string literals: a bare string that names a known parameter or
variable is treated as a reference.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
DOCKER = REPO / "docker"

# --- The settings contract (shared with the app code; see infra/README.md) -------------------
ENTITY_SETTINGS = {
    "ORDERS_QUEUE_NAME": "orders",
    "ORDER_STATUS_QUEUE_NAME": "order-status",
    "NOTIFICATIONS_TOPIC_NAME": "notifications",
    "NOTIFY_SUBSCRIPTION_NAME": "notify",
    "AUDIT_SUBSCRIPTION_NAME": "audit",
    "BALANCE_CHANGES_QUEUE": "balance-changes",
    "PAYMENTS_HUB_NAME": "payments",
    "PAYMENTS_CONSUMER_GROUP": "payments-processor",
    "ORDER_AUDIT_QUEUE_NAME": "order-audit",
}
COSMOS_DATABASE = "idempotency"
COSMOS_CONTAINERS = {"orders": "/orderId", "order-status": "/orderId", "ledger": "/pk", "dedup": "/pk"}
COSMOS_TTL_CONTAINERS = {"ledger", "dedup"}
TABLES = {"dedup", "parked", "ledger", "orders", "orderstatus"}
LOG_EVENTS = {
    "keyConflict": "IdempotencyKeyConflict",
    "parked": "EventParked",
    "deadLettered": "MessageDeadLettered",
    "duplicate": "DuplicateDetected",
    "sequenceReset": "SequenceReset",
}
# Settings every deployed app gets (the brief's contract), beyond the connections.
CONTRACT_SETTINGS = {
    *ENTITY_SETTINGS,
    "DEDUP_BACKEND",
    "COSMOS_ENDPOINT",
    "COSMOS_DATABASE",
    "TABLE_ENDPOINT",
    "NOTIFICATION_API_URL",
    "NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY",
    "DEDUP_TTL_SECONDS",
    "DEDUP_LEASE_SECONDS",
    "SERVICEBUS_LOCK_DURATION_SECONDS",
    "SERVICEBUS_MAX_DELIVERY_COUNT",
    "SERVICEBUS_MAX_AUTO_LOCK_RENEWAL_SECONDS",
    "DEDUP_RETENTION_MARGIN_SECONDS",
    "PAYMENTS_MISSING_KEY_POLICY",
    "PAYMENTS_MAX_ATTEMPTS",
    "PAYMENTS_MAX_CONCURRENCY",
    "MAINTENANCE_SCHEDULE",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "AZURE_CLIENT_ID",
}
# Identity-based connections: connection name -> module whose resource it reaches.
IDENTITY_CONNECTIONS = {
    "AzureWebJobsStorage": "storage",
    "ServiceBusConnection": "serviceBus",
    "EventHubConnection": "eventHubs",
}
# Read only when running locally against emulators; never deployed (no keys in Azure).
LOCAL_ONLY_SETTINGS = {"COSMOS_KEY", "TABLE_CONNECTION_STRING"}
# Deployed only; a local run uses the local alternative or does without.
AZURE_ONLY_SETTINGS = {"TABLE_ENDPOINT", "AZURE_CLIENT_ID", "AZURE_TOKEN_CREDENTIALS",
                       "APPLICATIONINSIGHTS_CONNECTION_STRING", "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"}

ROLE = {
    "storageBlobDataOwner": "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
    "storageTableDataContributor": "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3",
    "storageQueueDataContributor": "974c5e8b-45b9-4653-ba55-5f855dd0fb88",
    "serviceBusDataReceiver": "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0",
    "serviceBusDataSender": "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39",
    "serviceBusDataOwner": "090c5cfd-751d-490a-894a-3ce6f1109419",
    "eventHubsDataReceiver": "a638d3c7-ab3a-418d-83e6-5f17a39d4fde",
    "eventHubsDataSender": "2b629674-e913-4c01-ae53-ef4638d8f975",
    "eventHubsDataOwner": "f526a384-b230-433a-b45c-95f59c4a2dec",
    "monitoringMetricsPublisher": "3913510d-42f4-4e42-8a64-420c390055eb",
    "owner": "8e3af657-a8ff-443c-a75c-2fe8c4bcb635",
    "contributor": "b24988ac-6180-42a0-ab88-20f7382dd24c",
    "cosmosDataContributor": "00000000-0000-0000-0000-000000000002",
}
ROLE_NAME = {v: k for k, v in ROLE.items()}


@cache
def parse(relative: str) -> dict[str, Any]:
    """Parsed template (pycep JSON) of a file under infra/."""
    return dict(BicepParser().parse(file_path=INFRA / relative))


def bicep_files() -> list[str]:
    return sorted(str(p.relative_to(INFRA)) for p in INFRA.rglob("*.bicep"))


def resources(relative: str) -> dict[str, dict[str, Any]]:
    return parse(relative).get("resources", {})


def body(resource: dict[str, Any]) -> dict[str, Any]:
    """Resource body, unwrapping `= if (...)` conditions."""
    cfg = resource["config"]
    return cfg["config"] if "condition" in cfg and "config" in cfg else cfg


def condition(resource: dict[str, Any]) -> Any:
    cfg = resource["config"]
    return cfg.get("condition") if "config" in cfg else None


def of_type(relative: str, rtype: str) -> dict[str, dict[str, Any]]:
    return {n: r for n, r in resources(relative).items() if r["type"] == rtype}


def param_defaults(relative: str) -> dict[str, Any]:
    return {n: p.get("default") for n, p in parse(relative).get("parameters", {}).items()}


def module_params(relative: str, module: str) -> dict[str, Any]:
    return parse(relative)["modules"][module]["config"]["params"]


# --- A small evaluator for the expression shapes the templates use ----------------------------
class Unresolved(Exception):
    """The expression depends on a runtime value (resource output, function result)."""


_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")


def evaluate(expr: Any, scope: dict[str, Any]) -> Any:
    """Value of a pycep expression given parameter/variable values in `scope`."""
    if isinstance(expr, bool | int | float) or expr is None:
        return expr
    if isinstance(expr, str):
        if expr in scope:
            return evaluate(scope[expr], scope)
        if "${" in expr:
            def replace(match: re.Match[str]) -> str:
                head, *path = match.group(1).strip().split(".")
                if head not in scope:
                    raise Unresolved(match.group(1))
                value = evaluate(scope[head], scope)
                for part in path:
                    if not isinstance(value, dict) or part not in value:
                        raise Unresolved(match.group(1))
                    value = evaluate(value[part], scope)
                return str(value)
            return _INTERPOLATION.sub(replace, expr)
        return expr
    if isinstance(expr, list):
        return [evaluate(e, scope) for e in expr]
    if isinstance(expr, dict):
        if "operator" in expr:
            op = expr["operator"]
            kind, operands = op["type"], op["operands"]
            if kind == "add":
                return evaluate(operands["operand_1"], scope) + evaluate(operands["operand_2"], scope)
            if kind == "subtract":
                return evaluate(operands["operand_1"], scope) - evaluate(operands["operand_2"], scope)
            if kind == "multiply":
                return evaluate(operands["operand_1"], scope) * evaluate(operands["operand_2"], scope)
            if kind == "divide":
                return evaluate(operands["operand_1"], scope) // evaluate(operands["operand_2"], scope)
            if kind == "modulo":
                return evaluate(operands["operand_1"], scope) % evaluate(operands["operand_2"], scope)
            if kind == "minus":
                return -evaluate(operands["integer_value"], scope)
            if kind == "conditional":
                branch = "true_value" if evaluate(operands["condition"], scope) else "false_value"
                return evaluate(operands[branch], scope)
            if kind == "property_accessor":
                base = evaluate(operands["operand_1"], scope)
                if isinstance(base, dict) and isinstance(operands["operand_2"], str):
                    return evaluate(base[operands["operand_2"]], scope)
            raise Unresolved(json.dumps(expr)[:120])
        if "function" in expr:
            fn = expr["function"]
            args = [evaluate(a, scope) for a in fn["parameters"].values() if a is not None]
            if fn["type"] == "max":
                return max(args)
            if fn["type"] == "min":
                return min(args)
            if fn["type"] == "string":
                value = args[0]
                return ("True" if value else "False") if isinstance(value, bool) else str(value)
            if fn["type"] == "pad_left":
                return str(args[0]).rjust(int(args[1]), str(args[2]))
            if fn["type"] == "empty":
                return not args[0]
            raise Unresolved(fn["type"])
        return {k: evaluate(v, scope) for k, v in expr.items()}
    raise Unresolved(repr(expr))


def scope_of(relative: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parameters (defaults, then overrides) and variables of a template, for `evaluate`."""
    template = parse(relative)
    scope: dict[str, Any] = {n: p.get("default") for n, p in template.get("parameters", {}).items()}
    scope.update(overrides or {})
    scope.update({n: v["value"] for n, v in template.get("variables", {}).items()})
    return scope


def references(expr: Any) -> set[str]:
    """Every bare string (identifier or literal) and interpolated name inside an expression."""
    found: set[str] = set()
    if isinstance(expr, str):
        found.add(expr)
        found.update(m.strip() for m in _INTERPOLATION.findall(expr))
    elif isinstance(expr, dict):
        for value in expr.values():
            found |= references(value)
    elif isinstance(expr, list):
        for value in expr:
            found |= references(value)
    return found


def accessor_path(expr: Any) -> list[str]:
    """`a.b.c` as ['a', 'b', 'c'] (pycep nests property accessors to the right)."""
    if isinstance(expr, str):
        return [expr]
    if isinstance(expr, dict) and expr.get("operator", {}).get("type") == "property_accessor":
        ops = expr["operator"]["operands"]
        return accessor_path(ops["operand_1"]) + accessor_path(ops["operand_2"])
    return []


def app_settings() -> dict[str, Any]:
    """The app settings object of the deployed Function App (resources.bicep)."""
    return parse("resources.bicep")["variables"]["appSettings"]["value"]


# --- Role assignments --------------------------------------------------------------------------
def role_assignments(relative: str) -> list[dict[str, Any]]:
    """Azure RBAC and Cosmos DB data-plane role assignments declared in one template."""
    found = []
    for name, res in resources(relative).items():
        if res["type"] == "Microsoft.Authorization/roleAssignments":
            props = body(res)["properties"]
            role_ref = props["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]
            role_id = evaluate(role_ref, scope_of(relative))
            found.append({"name": name, "kind": "rbac", "scope": body(res).get("scope"),
                          "role": role_id, "principal": props["principalId"],
                          "conditional": condition(res) is not None, "body": body(res)})
        elif res["type"] == "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments":
            props = body(res)["properties"]
            role_id = str(props["roleDefinitionId"]).rsplit("/", 1)[-1]
            role_id = evaluate(role_id, scope_of(relative))
            found.append({"name": name, "kind": "cosmos", "scope": props["scope"], "role": role_id,
                          "principal": props["principalId"], "conditional": condition(res) is not None,
                          "body": body(res)})
    return found


# --- Tools outside this venv -------------------------------------------------------------------
def infra_venv_bin(tool: str) -> Path:
    return REPO / ".venv-infra" / "bin" / tool


def load_yaml(path: Path) -> Any:
    """YAML through the infra venv's PyYAML (a checkov dependency); the test venv has none."""
    python = infra_venv_bin("python")
    if not python.exists():
        raise FileNotFoundError(python)
    out = subprocess.run(
        [str(python), "-c", "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
         str(path)],
        check=True, capture_output=True, text=True, timeout=60,
    )
    return json.loads(out.stdout)


def module_file(module: str, parent: str = "resources.bicep") -> str:
    """infra-relative path of a module called from `parent`."""
    path = parse(parent)["modules"][module]["detail"]["path"]
    return str(((INFRA / parent).parent / path).resolve().relative_to(INFRA))


def entity_resource(setting: str) -> tuple[str, str, str]:
    """(module, template, resource symbol) of the broker entity an app setting names.

    Follows the chain: app setting -> resources.bicep parameter -> module parameter
    -> the resource whose `name` is that module parameter.
    """
    parameter = app_settings()[setting]
    for module_name, module in parse("resources.bicep")["modules"].items():
        relative = module_file(module_name)
        for module_param, expr in module["config"].get("params", {}).items():
            if expr != parameter:
                continue
            for symbol, res in resources(relative).items():
                if body(res).get("name") == module_param:
                    return module_name, relative, symbol
    raise LookupError(f"no resource is named by setting {setting}")


APP_PRINCIPAL = "appPrincipalId"
DEVELOPER_PRINCIPAL = "developerPrincipalId"


def app_roles_on(relative: str, symbol: str) -> set[str | None]:
    """Role names the app identity holds with `symbol` as scope in one template."""
    return {ROLE_NAME.get(a["role"], a["role"]) for a in role_assignments(relative)
            if a["principal"] == APP_PRINCIPAL and a["kind"] == "rbac" and a["scope"] == symbol}
