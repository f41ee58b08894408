"""Load an app in the real worker in a fresh process and report what the worker said.

    python -m tests.support.worker_probe <app_dir>   # prints one JSON document

The worker keeps one app per process and indexing imports the app's modules,
so each probe is its own process, started with only the app's
`local.settings.sample.json` values in its environment (plus PATH). Used by
`tests/worker/` for indexing, metadata and load, and for the regression test
that loads a copy of the app with a refused annotation.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def report(app_dir: str) -> dict[str, Any]:
    """Start the worker host on `app_dir` (in this process) and describe the result."""
    from local_stack.worker import WorkerHost, WorkerInitError, sample_settings

    try:
        host = WorkerHost.start(app_dir, sample_settings(app_dir))
    except WorkerInitError as error:
        status = dataclasses.asdict(error.status) if error.status is not None else None
        return {"init": status, "functions": {}, "loads": {}}
    return {
        "init": dataclasses.asdict(host.init) if host.init is not None else None,
        "capabilities": host.capabilities,
        "worker": host.worker_metadata,
        "functions": {name: dataclasses.asdict(meta) for name, meta in host.metadata().items()},
        "loads": {name: dataclasses.asdict(status) for name, status in host.loads.items()},
    }


def probe(app_dir: str | Path, *, timeout: float = 120.0) -> dict[str, Any]:
    """Run `report` in a fresh interpreter whose environment holds only the sample settings."""
    from local_stack.worker import sample_settings

    env = {"PATH": os.environ.get("PATH", ""), **sample_settings(app_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.worker_probe", str(app_dir)], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=timeout, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"probe failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1])


if __name__ == "__main__":
    print(json.dumps(report(str(Path(sys.argv[1]).resolve()))), flush=True)
