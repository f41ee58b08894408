"""The lift test: each example is a function app of its own, made of `shared/` and the example's
`function_app.py`, `host.json` and `requirements.txt`, nothing else. The real Python worker
indexes, loads and invokes it in a fresh process whose import path holds that folder and the
worker driver only (`lift_driver.py`), against Azurite and the Cosmos server (each started for
this module), through a relay the driver stops for a store outage: a new message, a duplicate,
a key reused for other content, bad input, an outage and the recovery after it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from azure.cosmos import CosmosClient, PartitionKey
from azure.data.tables import TableServiceClient

from local_stack import AZURITE_ACCOUNT, AZURITE_KEY, COSMOS_LOCAL_KEY, free_port
from local_stack.servers import azurite_tables, cosmos_server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: The example function apps (examples/testing is a test module to copy, not an app).
APPS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "function_app.py").is_file())
DRIVER = Path(__file__).resolve().parent / "lift_driver.py"
LIFTED = ("function_app.py", "host.json", "requirements.txt")


# -- the servers and the lifted apps ---------------------------------------------------------------
class Servers:
    """Azurite and the Cosmos server for the lifted apps, each with a relay port the driver
    listens on (the Cosmos server advertises its relay's port, so its SDK clients go there)."""

    def __init__(self) -> None:
        self.table_port, self.table_relay = free_port(), free_port()
        self.cosmos_port, self.cosmos_relay = free_port(), free_port()
        self.azurite = azurite_tables(self.table_port)
        self.cosmos = cosmos_server(self.cosmos_port, advertise_port=self.cosmos_relay)

    def table_connection(self, port: int) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"TableEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")

    def tables(self) -> TableServiceClient:
        return TableServiceClient.from_connection_string(self.table_connection(self.table_port))

    def cosmos_database(self, name: str) -> Any:
        client = CosmosClient(f"https://127.0.0.1:{self.cosmos_port}/", COSMOS_LOCAL_KEY,
                              connection_verify=False, enable_endpoint_discovery=False)
        return client.create_database_if_not_exists(name)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    found = Servers()
    found.azurite.start()
    try:
        found.cosmos.start()
        try:
            yield found
        finally:
            found.cosmos.stop()
    finally:
        found.azurite.stop()


def lift(example: str, target: Path) -> Path:
    """An app folder holding `shared/` and the example's own three files, nothing else."""
    app = target / "app"
    shutil.copytree(ROOT / "shared", app / "shared", ignore=shutil.ignore_patterns("__pycache__"))
    for name in LIFTED:
        shutil.copy2(EXAMPLES / example / name, app / name)
    return app


def run_lifted(app: Path, harness: Path, *, settings: dict[str, str], target_port: int,
               relay_port: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Index, load and invoke the app in a fresh worker process; what each step did."""
    harness.mkdir(exist_ok=True)
    (harness / "local_stack").symlink_to(ROOT / "local_stack", target_is_directory=True)
    shutil.copy2(DRIVER, harness / DRIVER.name)
    config = {"settings": settings, "target_port": target_port, "relay_port": relay_port,
              "steps": steps}
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(harness), **settings}
    done = subprocess.run([sys.executable, DRIVER.name, str(app), json.dumps(config)],
                          cwd=harness, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise AssertionError(f"lift driver failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-5000:]}")
    report = json.loads(lines[-1])
    report["stderr"] = done.stderr[-4000:]
    outside = {name: path for name, path in report["origins"].items()
               if path and not Path(path).resolve().is_relative_to(app.resolve())}
    assert not outside, f"app modules imported from outside the lifted folder: {outside}"
    return report


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["name"]: step for step in report["steps"]}


# -- what the examples may import -----------------------------------------------------------------
def imports_of(path: Path, *, module_level: bool = False) -> set[str]:
    """The dotted modules `path` imports (with `module_level`, only those its import runs:
    an import inside a function happens when that function is used)."""
    tree = ast.parse(path.read_text("utf-8"))
    nodes = tree.body if module_level else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)  # and what may be a submodule of it (a namespace package's)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


@functools.cache
def _files() -> dict[Path, str]:
    """Every installed file, by the distribution that installed it."""
    owners: dict[Path, str] = {}
    for dist in metadata.distributions():
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"].lower())
        for file in dist.files or ():
            owners[Path(str(dist.locate_file(file))).resolve()] = name
    return owners


def distribution_of(module: str) -> str | None:
    """The installed distribution that provides `module` (None: the standard library, a
    namespace package, or a name that is not a module)."""
    if module.split(".")[0] in sys.stdlib_module_names:
        return None
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    origin = Path(spec.origin).resolve()
    if origin.is_relative_to(ROOT) and ".venv" not in origin.parts:
        return None  # the project's own
    owner = _files().get(origin)
    assert owner is not None, f"no distribution provides {module} ({origin})"
    return owner


@pytest.mark.parametrize("example", APPS)
def test_an_example_imports_only_the_library_and_the_azure_sdks(example):
    code = EXAMPLES / example / "function_app.py"
    found = {m.split(".")[0] for m in imports_of(code)} - set(sys.stdlib_module_names)
    assert found <= {"shared", "azure", "azurefunctions"}, found
    assert not found & {"domain", "functions"}
    lines = [line for line in code.read_text("utf-8").splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) <= 60, f"{example}: {len(lines)} lines of code; an example stays small"


@pytest.mark.parametrize("example", APPS)
def test_an_examples_requirements_hold_what_it_and_the_library_import(example):
    """Every package the app's import needs (the example's and shared/'s module-level imports)
    is in the example's requirements.txt, pinned as the app's lock pins it."""
    pinned = {}
    for line in (EXAMPLES / example / "requirements.txt").read_text("utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line!r} is not pinned"
            pinned[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    modules = imports_of(EXAMPLES / example / "function_app.py", module_level=True)
    for source in (ROOT / "shared").rglob("*.py"):
        modules |= imports_of(source, module_level=True)
    needed = {dist for module in modules if not module.startswith("shared")
              if (dist := distribution_of(module)) is not None}
    needed |= {"azure-functions-runtime"}  # the worker the app pins (runtime version control)
    missing = needed - pinned.keys()
    assert not missing, f"{example}/requirements.txt lacks {sorted(missing)}"
    lock = {re.sub(r"[-_.]+", "-", n.lower()): v for n, _, v in (
        line.partition("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#"))}
    assert {n: v for n, v in pinned.items() if lock.get(n, v) != v} == {}, "pins differ from the app's"


# -- Service Bus: orders into Cosmos DB, an OrderAccepted sent on -------------------------------
def order(order_id: str, total: float = 25.0) -> str:
    return json.dumps({"orderId": order_id, "customerId": "C-1", "total": total})


def test_the_service_bus_example_lifted_into_an_empty_app_on_cosmos(servers, tmp_path):
    database = servers.cosmos_database("shop")
    container = database.create_container_if_not_exists("orders", PartitionKey("/pk"))
    first, second = f"ORD-{uuid.uuid4().hex[:8]}", f"ORD-{uuid.uuid4().hex[:8]}"

    def deliver(name: str, message_id: str | None, body: str, count: int = 1) -> dict[str, Any]:
        return {"name": name, "do": "service_bus", "function": "on_order",
                "message_id": message_id, "body": body, "delivery_count": count}

    report = run_lifted(
        lift("servicebus_orders", tmp_path), tmp_path / "harness",
        settings={"COSMOS_ENDPOINT": f"https://127.0.0.1:{servers.cosmos_relay}/",
                  "COSMOS_KEY": COSMOS_LOCAL_KEY, "COSMOS_VERIFY_TLS": "false",
                  "ServiceBusConnection": "Endpoint=sb://local/;SharedAccessKeyName=k;"
                                          "SharedAccessKey=a2V5",
                  "AZURE_TOKEN_CREDENTIALS": "ManagedIdentityCredential"},
        target_port=servers.cosmos_port, relay_port=servers.cosmos_relay, steps=[
            deliver("new", first, order(first)),
            deliver("redelivered", first, order(first), 2),
            deliver("producer copy", first, order(first)),
            deliver("reused key", first, order(first, total=99.0)),
            deliver("not json", f"ORD-{uuid.uuid4().hex[:8]}", "{not json"),
            deliver("no message id", None, order("ORD-x")),
            {"name": "outage", "do": "outage"},
            deliver("during the outage", second, order(second)),
            {"name": "recover", "do": "recover"},
            deliver("after the outage", second, order(second), 2),
        ])
    steps = by_name(report)
    assert report["functions"] == ["on_order"]
    assert all(step.get("ok", True) for step in report["steps"]), report["steps"]  # none raised
    assert steps["new"]["settled"] == [["complete", None]]
    assert steps["redelivered"]["settled"] == [["complete", None]]
    assert steps["producer copy"]["settled"] == [["complete", None]]
    assert steps["reused key"]["settled"] == [["deadletter", "IdempotencyKeyConflict"]]
    assert steps["not json"]["settled"] == [["deadletter", "MalformedJson"]]
    assert steps["no message id"]["settled"] == [["deadletter", "InvalidMessageId"]]
    assert steps["during the outage"]["settled"] == [["abandon", None]]  # transient: retried
    assert steps["after the outage"]["settled"] == [["complete", None]]
    # The effects, once each: the order's document and one OrderAccepted per order.
    for order_id, total in ((first, 25.0), (second, 25.0)):
        assert container.read_item("order", partition_key=order_id)["total"] == total
    accepted = [m for m in report["sent"] if m["body"]["type"] == "OrderAccepted"]
    assert sorted(m["body"]["orderId"] for m in accepted) == sorted([first, second])
    assert {m["destination"] for m in accepted} == {"order-events"}


# -- Event Hubs: payments on Table Storage ---------------------------------------------------------
def payment(event_id: str, account: str, cents: int) -> str:
    return json.dumps({"specversion": "1.0", "id": event_id, "source": "/shop", "type": "payment",
                       "datacontenttype": "application/json",
                       "data": {"account": account, "cents": cents}})


def test_the_event_hubs_example_lifted_into_an_empty_app_on_table_storage(servers, tmp_path):
    tables = servers.tables()
    for name in ("ledger", "marks", "parked"):
        tables.create_table_if_not_exists(name)
    run = uuid.uuid4().hex[:6]
    first = [(n, payment(f"{run}-{n}", f"acct-{run}-{n % 2}", 100)) for n in range(1, 7)]
    reused = [(7, payment(f"{run}-1", f"acct-{run}-1", 999)),  # id 1 again, other content
              (8, payment(f"{run}-8", f"acct-{run}-0", 5)), (9, "not a cloud event")]
    later = [(10, payment(f"{run}-10", f"acct-{run}-1", 7))]

    def batch(name: str, events: list[tuple[int, str]], retry: int = 0) -> dict[str, Any]:
        return {"name": name, "do": "event_hub", "function": "payments", "partition": "0",
                "events": events, "retry_count": retry}

    report = run_lifted(
        lift("eventhubs_payments", tmp_path), tmp_path / "harness",
        settings={"STORAGE_CONNECTION": servers.table_connection(servers.table_relay),
                  "EventHubConnection": "Endpoint=sb://local/;SharedAccessKeyName=k;SharedAccessKey=a2V5",
                  "AZURE_TOKEN_CREDENTIALS": "ManagedIdentityCredential"},
        target_port=servers.table_port, relay_port=servers.table_relay, steps=[
            batch("new", first), batch("replayed", first), batch("reused key", reused),
            {"name": "outage", "do": "outage"}, batch("during the outage", later),
            {"name": "recover", "do": "recover"}, batch("retried by the host", later, retry=1),
        ])
    steps = by_name(report)
    assert report["functions"] == ["payments"]
    for name in ("new", "replayed", "reused key", "retried by the host"):
        assert steps[name]["ok"], steps[name]
    assert not steps["during the outage"]["ok"]  # raised: the host retries before it checkpoints
    ledger = tables.get_table_client("ledger")
    balances = {account: ledger.get_entity(account, "balance")["cents"]
                for account in (f"acct-{run}-0", f"acct-{run}-1")}
    assert balances == {f"acct-{run}-0": 3 * 100 + 5, f"acct-{run}-1": 3 * 100 + 7}  # each once
    parked = {entity["reason"] for entity in tables.get_table_client("parked").list_entities()}
    assert {"IdempotencyKeyConflict", "MalformedJson"} <= parked


# -- HTTP: Idempotency-Key ---------------------------------------------------------------------
def request(name: str, key: str | None, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return {"name": name, "do": "http", "function": "create_payment", "headers": headers,
            "body": json.dumps(body)}


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_the_http_example_lifted_into_an_empty_app(servers, tmp_path, backend):
    tables = servers.tables()
    for name in ("keys", "payments"):
        tables.create_table_if_not_exists(name)
    settings = {"STORAGE_CONNECTION": servers.table_connection(servers.table_relay),
                "AZURE_TOKEN_CREDENTIALS": "ManagedIdentityCredential"}
    target, relay = servers.table_port, servers.table_relay
    if backend == "cosmos":
        servers.cosmos_database("shop").create_container_if_not_exists("keys", PartitionKey("/pk"))
        settings |= {"COSMOS_ENDPOINT": f"https://127.0.0.1:{servers.cosmos_relay}/",
                     "COSMOS_KEY": COSMOS_LOCAL_KEY, "COSMOS_VERIFY_TLS": "false",
                     # the payments table directly: the outage is the keys store's
                     "STORAGE_CONNECTION": servers.table_connection(servers.table_port)}
        target, relay = servers.cosmos_port, servers.cosmos_relay
    key, later = str(uuid.uuid4()), str(uuid.uuid4())
    report = run_lifted(
        lift("http_payments", tmp_path), tmp_path / "harness", settings=settings,
        target_port=target, relay_port=relay, steps=[
            request("new", key, {"amountCents": 250}),
            request("retried", key, {"amountCents": 250}),
            request("reused key", key, {"amountCents": 999}),
            request("no key", None, {"amountCents": 250}),
            request("refused", str(uuid.uuid4()), {"amountCents": -1}),
            {"name": "outage", "do": "outage"},
            request("during the outage", later, {"amountCents": 40}),
            {"name": "recover", "do": "recover"},
            request("after the outage", later, {"amountCents": 40}),
        ])
    steps = by_name(report)
    assert report["functions"] == ["create_payment"]
    new, retried = steps["new"], steps["retried"]
    assert (new["status"], retried["status"]) == (201, 201), report["stderr"]
    assert retried["json"] == new["json"] and retried["headers"]["idempotent-replayed"] == "true"
    assert (steps["reused key"]["status"], steps["reused key"]["json"]["type"].rsplit("/", 1)[-1]) \
        == (422, "idempotency-key-reused")
    assert steps["no key"]["status"] == 400
    assert (steps["refused"]["status"], steps["refused"]["json"]["reason"]) == (422, "InvalidAmount")
    outage = steps["during the outage"]
    assert (outage["status"], outage["headers"]["retry-after"]) == (503, "1")
    assert outage["headers"]["content-type"].startswith("application/problem+json")
    assert steps["after the outage"]["status"] == 201
    payments = tables.get_table_client("payments")
    rows = [payments.get_entity("payments", step["json"]["paymentId"])
            for step in (new, steps["after the outage"])]
    assert [row["cents"] for row in rows] == [250, 40]  # each request's effect, once


def test_a_lifted_app_without_shared_fails_indexing(servers, tmp_path):
    """The isolation is real: without `shared/` the worker cannot import it from elsewhere."""
    app = lift("http_payments", tmp_path)
    shutil.rmtree(app / "shared")
    with pytest.raises(AssertionError, match="shared"):
        run_lifted(app, tmp_path / "harness", settings={
            "STORAGE_CONNECTION": servers.table_connection(servers.table_relay)},
            target_port=servers.table_port, relay_port=servers.table_relay, steps=[])
