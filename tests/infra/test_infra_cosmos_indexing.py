"""Cosmos indexing policies: Bicep matches the app's definition, and every query is indexed.

Containers exclude `/*` and include only what queries filter on (point operations need
no index). These tests hold three things together: the policies in infra/core/cosmos.bicep,
`COSMOS_INDEXING` in functions/settings.py (what local runs create), and the queries the
code issues, captured by running the code that builds them against a recording container
and parsed for their `c.<property>` / `c[@param]` references.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from functions.settings import COSMOS_CONTAINERS, COSMOS_INDEXING
from replay.stores import document_lister, scan_reused_keys
from shared._backends import CosmosIdempotencyStore
from shared._backends.cosmos_indexing import point_indexing_policy, record_indexing_policy
from simulator.check import scan
from tests.infra.bicep_model import COSMOS_CONTAINERS as CONTRACT_CONTAINERS
from tests.infra.bicep_model import REPO, body, evaluate, of_type, scope_of
from tests.support.doubles import single_region_connection

COSMOS = "core/cosmos.bicep"
# Where queries are issued. A new `query_items` call elsewhere fails
# `test_every_module_that_queries_cosmos_is_covered` until a case below captures it.
QUERY_SOURCES = ("shared", "domain", "replay", "functions", "simulator")
QUERY_METHODS = {"query_items", "query_items_change_feed"}
CAPTURED_MODULES = {"shared/_backends/cosmos.py", "replay/stores.py", "simulator/check/stores.py"}

_DOT_REF = re.compile(r"\bc\.([A-Za-z_][A-Za-z0-9_]*)")
_BRACKET_REF = re.compile(r"\bc\[\s*(@[A-Za-z_][A-Za-z0-9_]*|'[^']*'|\"[^\"]*\")\s*\]")



def indexed_properties(policy: dict[str, Any]) -> frozenset[str]:
    """Top-level property names a policy indexes (`/iV/?` -> `iV`)."""
    names: set[str] = set()
    included_paths: list[dict[str, Any]] = policy.get("includedPaths", [])
    for included in included_paths:
        path = str(included["path"])
        if path.endswith("/?"):
            names.add(path[1:-2])
    return frozenset(names)

def referenced_properties(query: str, parameters: list[dict[str, Any]] | None = None) -> set[str]:
    """Top-level properties a Cosmos SQL query filters on (`c.x`, `c["x"]`, `c[@p]` with @p bound)."""
    bound = {p["name"]: p["value"] for p in parameters or []}
    names = set(_DOT_REF.findall(query))
    for ref in _BRACKET_REF.findall(query):
        names.add(str(bound[ref]) if ref.startswith("@") else ref[1:-1])
    return names


class RecordingContainer:
    """Stands in for a ContainerProxy: records each query, answers with no items."""

    id = "recording"
    client_connection = single_region_connection()  # what the store's account check reads

    def __init__(self, partition_key_path: str) -> None:
        self.partition_key_path = partition_key_path
        self.queries: list[tuple[str, list[dict[str, Any]]]] = []

    def read(self) -> dict[str, Any]:
        return {"partitionKey": {"paths": [self.partition_key_path]}}

    def query_items(self, query: str, parameters: list[dict[str, Any]] | None = None,
                    **_: Any) -> Iterator[dict[str, Any]]:
        self.queries.append((query, list(parameters or [])))
        return iter(())


def issued_queries(partition_key_path: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every query shape the code sends to a container with this partition key."""
    container = RecordingContainer(partition_key_path)
    store = CosmosIdempotencyStore.from_container(container, partition_key_path)
    # The maintenance sweep (stale claims, expired markers) and a full record listing.
    list(store.iter_records())
    list(store.iter_records(in_progress_before=1.0))
    list(store.iter_records(expired_before=1.0))
    list(store.iter_records(in_progress_before=1.0, expired_before=1.0))
    # The outbox sweep: markers whose outgoing messages are still pending.
    list(store.iter_pending(since_before=1.0))
    # The replay tool's listing: all documents, and one partition's.
    lister = document_lister(store)
    list(lister(None))
    list(lister("p"))
    # The replay tool's search for one key in several partitions.
    scan_reused_keys(store)
    # The simulator's invariant scan (local stack only), all and by partition prefix.
    scan(store)
    scan(store, "p")
    return container.queries


def test_the_parser_reads_dot_bracket_and_bound_references():
    assert referenced_properties("SELECT * FROM c WHERE IS_DEFINED(c.iV) AND c.a < @x") == {
        "iV", "a"}
    assert referenced_properties("SELECT * FROM c WHERE c[@f] = @v AND c['b'] = 1",
                                 [{"name": "@f", "value": "pk"}]) == {"pk", "b"}
    assert referenced_properties("SELECT * FROM c") == set()


def test_bicep_declares_the_apps_indexing_policy_for_each_container():
    scope = scope_of(COSMOS)
    declared = {}
    for res in of_type(COSMOS, "Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers").values():
        resource = body(res)["properties"]["resource"]
        declared[resource["id"]] = evaluate(resource.get("indexingPolicy"), scope)
    assert set(declared) == set(COSMOS_CONTAINERS) == set(CONTRACT_CONTAINERS)
    for name, policy in declared.items():
        assert policy == COSMOS_INDEXING[name], name


@pytest.mark.parametrize("name", sorted(COSMOS_CONTAINERS))
def test_each_policy_excludes_everything_but_what_is_queried(name):
    policy = COSMOS_INDEXING[name]
    assert policy["indexingMode"] == "consistent"
    assert policy["excludedPaths"] == [{"path": "/*"}]
    queried: set[str] = set()
    for query, parameters in issued_queries(COSMOS_CONTAINERS[name]):
        queried |= referenced_properties(query, parameters)
    # Every reference is indexed, and nothing is indexed that no query uses.
    assert queried == indexed_properties(policy), name


def test_a_query_on_an_unindexed_property_would_fail_the_contract():
    policy = record_indexing_policy("/pk")
    assert "amount" not in indexed_properties(policy)
    assert not referenced_properties("SELECT * FROM c WHERE c.amount > 1") <= indexed_properties(policy)


def test_policy_paths_are_validated():
    with pytest.raises(ValueError, match="must look like"):
        point_indexing_policy("/iV")


def _query_modules() -> set[str]:
    found = set()
    for top in QUERY_SOURCES:
        for path in (REPO / top).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in QUERY_METHODS:
                    found.add(path.relative_to(REPO).as_posix())
    return found


def test_every_module_that_queries_cosmos_is_covered():
    assert _query_modules() == CAPTURED_MODULES


def test_static_query_fragments_in_those_modules_reference_only_indexed_properties():
    """A literal clause added to a covered module but not reached above still gets checked."""
    indexed = set().union(*(indexed_properties(p) for p in COSMOS_INDEXING.values()))
    for module in CAPTURED_MODULES:
        tree = ast.parse(Path(REPO / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "c." in node.value:
                assert set(_DOT_REF.findall(node.value)) <= indexed, (module, node.value)
