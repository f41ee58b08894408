"""The deployed package: only what runs in Azure, and the app indexes from that tree alone.

The package is built the way Core Tools builds it for `func azure functionapp publish` (and azd for
a Flex Consumption deploy): every file of the project folder except those `.funcignore` matches, with
gitignore pattern semantics (pathspec's GitIgnoreSpec). The real worker then indexes and loads the
app from a copy of that tree in a fresh process whose import path holds neither the repository
root nor anything else of the project (only the test's worker driver, `local_stack`, symlinked),
so a module the package lacks fails indexing instead of being imported from the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pathspec
import pytest

from local_stack.worker import sample_settings
from tests.worker.test_indexing import FUNCTIONS, assert_worker_loads_the_app

ROOT = Path(__file__).resolve().parents[2]
# What runs in Azure: the app's modules, the host's configuration, and what the remote build installs.
DEPLOYED = {"function_app.py", "functions", "shared", "domain", "host.json", "requirements.txt"}
APP_PACKAGES = ("function_app", "functions", "shared", "domain")

# Imports the app from `app_dir` in the real worker and reports where each app module came from.
_DRIVER = """
import dataclasses, json, sys
from local_stack.worker import WorkerHost, WorkerInitError
app_dir, settings = sys.argv[1], json.loads(sys.argv[2])
try:
    host = WorkerHost.start(app_dir, settings)
except WorkerInitError as error:
    print(json.dumps({"init": dataclasses.asdict(error.status), "functions": {}, "loads": {},
                      "origins": {}}))
    raise SystemExit(0)
packages = sys.argv[3].split(",")
origins = {name: getattr(module, "__file__", None) for name, module in sorted(sys.modules.items())
           if name.split(".")[0] in packages}
print(json.dumps({"init": dataclasses.asdict(host.init),
                  "functions": {n: dataclasses.asdict(m) for n, m in host.metadata().items()},
                  "loads": {n: dataclasses.asdict(s) for n, s in host.loads.items()},
                  "origins": origins}), flush=True)
"""


def funcignore() -> pathspec.GitIgnoreSpec:
    return pathspec.GitIgnoreSpec.from_lines((ROOT / ".funcignore").read_text().splitlines())


def package_files(root: Path, spec: pathspec.GitIgnoreSpec) -> list[str]:
    """Project files the package admits, as paths relative to `root` (ignored folders pruned)."""
    admitted = []
    for directory, folders, files in os.walk(root):
        rel_dir = Path(directory).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else f"{rel_dir}/"
        folders[:] = [f for f in folders if not spec.match_file(f"{prefix}{f}/")]
        admitted += [f"{prefix}{f}" for f in files if not spec.match_file(f"{prefix}{f}")]
    return sorted(admitted)


def build_package(target: Path, spec: pathspec.GitIgnoreSpec | None = None) -> list[str]:
    files = package_files(ROOT, spec or funcignore())
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target / rel)
    return files


def index_alone(app_dir: Path, harness: Path) -> dict[str, Any]:
    """The worker's answers for `app_dir`, imported with only the worker driver on the path."""
    harness.mkdir(exist_ok=True)
    link = harness / "local_stack"
    if not link.exists():
        link.symlink_to(ROOT / "local_stack", target_is_directory=True)
    settings = sample_settings(ROOT)  # the package carries no settings file; the host passes them
    env = {"PATH": os.environ.get("PATH", ""), **settings}
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(app_dir), json.dumps(settings),
                           ",".join(APP_PACKAGES)],
                          cwd=harness, env=env, capture_output=True, text=True, timeout=180,
                          check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"worker driver failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[Path, list[str]]:
    target = tmp_path_factory.mktemp("package")
    return target, build_package(target)


def test_the_package_holds_only_what_runs_in_azure(package):
    target, files = package
    top = {rel.split("/", 1)[0] for rel in files}
    assert top == DEPLOYED, f"unexpected in the package: {sorted(top - DEPLOYED)}; missing: " \
                            f"{sorted(DEPLOYED - top)}"
    assert not [rel for rel in files if rel.endswith((".pyc", ".md"))]
    size = sum((target / rel).stat().st_size for rel in files)
    print(f"\ndeployed package: {len(files)} files, {size:,} bytes ({size / 1024:.0f} KiB)")
    assert size < 2_000_000, "the package grew past 2 MB: check .funcignore"


def test_tools_that_run_outside_azure_stay_out():
    spec = funcignore()
    for rel in ("producer/__main__.py", "replay/__main__.py", ".cache/function-rpc/x.py", ".env",
                "benchmarks/__main__.py", "simulator/host.py", "demo/__main__.py", "local_stack/worker.py",
                "tools/cosmos-server/launch.js", "tests/conftest.py", "docker/compose.yaml",
                "infra/main.bicep", "node_modules/x/index.js", "dev", "requirements-dev.txt",
                "requirements.in", "local.settings.json", "demo-out/demo-report.html", ".venv/bin/python",
                "mkdocs.yml", "docs/index.md", ".cache/site/index.html",
                "examples/http_payments/function_app.py"):
        assert spec.match_file(rel), f"{rel} would be deployed"
    for rel in ("function_app.py", "functions/orders.py", "shared/_core/telemetry.py", "domain/orders.py",
                "host.json", "requirements.txt", ".python_packages/lib/site-packages/x.py"):
        assert not spec.match_file(rel), f"{rel} would be left out"


def test_the_app_indexes_from_the_package_alone_with_the_real_worker(package, tmp_path):
    target, _ = package
    report = index_alone(target, tmp_path / "harness")
    assert_worker_loads_the_app(report)
    assert set(report["functions"]) == FUNCTIONS
    print("\nindexed from the package: " + ", ".join(
        f"{name} ({next(b['type'] for b in meta['raw_bindings'] if b['type'].endswith('Trigger'))})"
        for name, meta in sorted(report["functions"].items())))
    origins = report["origins"]
    assert origins, "no app module was imported"
    outside = {name: path for name, path in origins.items()
               if path is not None and not Path(path).resolve().is_relative_to(target.resolve())}
    assert not outside, f"app modules imported from outside the package: {outside}"


def test_counter_proof_a_package_without_shared_fails_indexing(tmp_path):
    """The isolation above is real: without `shared/` the worker cannot fall back to the checkout."""
    target = tmp_path / "package"
    lines = [*(ROOT / ".funcignore").read_text().splitlines(), "shared/"]
    build_package(target, pathspec.GitIgnoreSpec.from_lines(lines))
    report = index_alone(target, tmp_path / "harness")
    assert report["init"]["status"] == "Failure"
    assert "shared" in report["init"]["message"]
