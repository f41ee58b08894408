"""`shared/` has no import cycle, counting every import: under `TYPE_CHECKING` and inside
functions too (a lazy import dodges the interpreter, not the maintainer going round in
circles). The graph is read from the source with `ast`, so a new cycle fails here, named."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path, root: Path) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports (any import, anywhere)."""
    paths = {module_name(p, root): p for p in package.rglob("*.py")}
    top = module_name(package / "__init__.py", root)
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                           for alias in node.names]
            for target in targets:
                while target and target not in paths:  # `import a.b.c` names module a.b.c
                    target = target.rpartition(".")[0]
                if target.startswith(top) and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, list(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, list(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_shared_has_no_import_cycle():
    graph = import_graph(ROOT / "shared", ROOT)
    assert "shared._core.records" in graph and "shared._core.exceptions" in graph["shared._core.records"]
    assert cycles(graph) == [], "modules of shared/ that import each other in a cycle"


def test_exceptions_import_nothing_of_the_library():
    """Plain data at the bottom: the errors every module raises depend on no module."""
    assert import_graph(ROOT / "shared", ROOT)["shared._core.exceptions"] == set()


def test_counter_proof_a_cycle_under_type_checking_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import B\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from .c import C\nB = 1\n")
    (package / "c.py").write_text("def late():\n    import pkg.a\n")
    (package / "d.py").write_text("from pkg import a\n")  # imports into the cycle: not in it
    assert cycles(import_graph(package, tmp_path)) == [["pkg.a", "pkg.b", "pkg.c"]]


# -- the layers (docs/library.md opens with this picture) ------------------------------------
#: The layers, top first: the front door is three modules of `shared/`, every other layer one
#: folder of it, so a module's folder is its layer. A module imports only from the layers
#: `MAY_IMPORT` names for its own (its own layer included, without a cycle).
FRONT_DOOR = frozenset({"shared", "shared.aio", "shared.testing"})
LAYERS: dict[str, str] = {"front door": "shared", "triggers": "shared._triggers",
                          "flows": "shared._flows", "backends": "shared._backends",
                          "core": "shared._core"}
MAY_IMPORT: dict[str, frozenset[str]] = {
    "front door": frozenset(LAYERS),
    "triggers": frozenset({"triggers", "flows", "core"}),
    "flows": frozenset({"flows", "core"}),  # the flows know no SDK
    "backends": frozenset({"backends", "core"}),  # the backends run no flow
    "core": frozenset({"core"}),  # data and rules
}


def layer_of(module: str) -> str | None:
    """The layer of a module of `shared`: its folder's (None: a module beside the front door)."""
    if module in FRONT_DOOR:
        return "front door"
    return next((layer for layer, package in LAYERS.items() if package != "shared"
                 and (module == package or module.startswith(package + "."))), None)


def layer_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Each import that goes where its module's layer may not, and each module in no layer."""
    layers = {module: layer_of(module) for module in graph}
    problems = [f"{module} is in no layer" for module, layer in layers.items() if layer is None]
    for module, targets in graph.items():
        layer = layers[module]
        if layer is None:
            continue
        problems += [f"{module} ({layer}) imports {target} ({layer_of(target)})"
                     for target in sorted(targets) if (target_layer := layer_of(target))
                     and target_layer not in MAY_IMPORT[layer]]
    return problems


def test_shared_imports_follow_the_layers():
    graph = import_graph(ROOT / "shared", ROOT)
    assert {layer_of(module) for module in graph} == set(LAYERS)  # each folder holds modules
    assert layer_violations(graph) == []


def test_counter_proof_an_upward_import_is_named():
    graph = {module: set[str]() for module in import_graph(ROOT / "shared", ROOT)}
    graph["shared._flows.idempotency"].add("shared._backends.dispatch")  # a flow importing a dispatcher
    graph["shared.new_module"] = set()  # beside the front door, in no layer's folder
    assert layer_violations(graph) == [
        "shared.new_module is in no layer",
        "shared._flows.idempotency (flows) imports shared._backends.dispatch (backends)"]


def test_the_docs_picture_names_the_layers():
    """docs/library.md opens with the layers, top first, as this test holds them."""
    text = (ROOT / "docs" / "library.md").read_text()
    picture = text[: text.index("## The front door")]
    positions = [picture.find(layer) for layer in LAYERS]
    assert -1 not in positions and positions == sorted(positions), positions


# -- what an app imports --------------------------------------------------------------------
def beyond_the_front_door(source: str) -> list[str]:
    """The modules of `shared` a source file imports other than the front door's."""
    imported: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            imported.append(node.module)
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
    return [name for name in imported if name.split(".")[0] == "shared" and name not in FRONT_DOOR]


#: An app: the examples, and the sample's function app (its functions, its domain, its entry).
APP_FILES = ("examples", "functions", "domain", "function_app.py")


def test_the_apps_import_only_the_front_door():
    """What a user copies, and the sample app, import `shared`, `shared.aio` and
    `shared.testing`, nothing deeper."""
    paths = [path for name in APP_FILES for path in sorted(
        (ROOT / name).rglob("*.py") if (ROOT / name).is_dir() else [ROOT / name])]
    imports = {str(path.relative_to(ROOT)): beyond_the_front_door(path.read_text())
               for path in paths}
    assert len(imports) >= 20 and "functions/services.py" in imports
    assert {path: found for path, found in imports.items() if found} == {}


def test_counter_proof_an_import_past_the_front_door_is_named():
    source = ("from shared import Idempotency\nfrom shared.testing import InMemoryDispatcher\n"
              "from shared._core.cloudevents import parse_cloudevent\nimport shared._core.keys\n"
              "from sharedthings import x\n")
    assert beyond_the_front_door(source) == ["shared._core.cloudevents", "shared._core.keys"]



FRONT_DOOR = frozenset({"shared", "shared.aio", "shared.testing"})


def public_paths(modules: Iterable[str]) -> list[str]:
    """The modules an app could import by a public path: outside the front door, no part of
    the path starting with an underscore."""
    return sorted(module for module in modules if module not in FRONT_DOOR
                  and not any(part.startswith("_") for part in module.split(".")[1:]))


def test_only_the_front_door_has_a_public_path():
    """h11's rule: the implementation's modules are private, so `shared`, `shared.aio` and
    `shared.testing` are the only import points of an app."""
    modules = import_graph(ROOT / "shared", ROOT)
    assert set(modules) >= FRONT_DOOR and len(modules) > 30
    assert public_paths(modules) == []


def test_counter_proof_a_public_implementation_module_is_named():
    assert public_paths(["shared", "shared._core.keys", "shared.keys", "shared.stores._x",
                         "shared.stores.x"]) == ["shared.keys", "shared.stores.x"]

# -- module size ------------------------------------------------------------------------------
MAX_MODULE_LINES = 500


def oversized(package: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The modules of `package` longer than `limit` lines, with their length."""
    lengths = {str(path.relative_to(package.parent)): len(path.read_text().splitlines())
               for path in sorted(package.rglob("*.py"))}
    return {path: n for path, n in lengths.items() if n > limit}


def test_no_module_of_shared_is_over_500_lines():
    assert oversized(ROOT / "shared") == {}


def test_counter_proof_a_long_module_is_named(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (package / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert oversized(package) == {"pkg/long.py": MAX_MODULE_LINES + 1}


def test_every_module_has_a_row_in_the_docs_module_table():
    """docs/library.md's module table names each module of shared/ (a new one fails here)."""
    text = (ROOT / "docs" / "library.md").read_text()
    table = text[text.index("## Modules"):]
    modules = [str(path.relative_to(ROOT / "shared")) for path in sorted((ROOT / "shared").rglob("*.py"))
               if path.name != "__init__.py"]
    assert len(modules) > 40
    assert [module for module in modules if f"`{module}`" not in table] == []
