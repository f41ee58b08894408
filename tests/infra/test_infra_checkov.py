"""checkov passes over infra/, and every skipped check carries a justification.

checkov lives in its own venv (.venv-infra, from requirements-infra.txt) because it
pins many dependencies. CHECKOV_BIN overrides the path. Missing checkov fails the
test (the test command always installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.infra.bicep_model import INFRA, REPO, infra_venv_bin


def _checkov() -> Path:
    path = Path(os.environ.get("CHECKOV_BIN", infra_venv_bin("checkov")))
    if not path.exists():
        message = (f"checkov not found at {path}: python3 -m venv .venv-infra && "
                   ".venv-infra/bin/pip install -r requirements-infra.txt")
        pytest.fail(message)  # `./dev test` installs it; a missing tool must not pass quietly
    return path


@pytest.fixture(scope="module")
def report():
    checkov = _checkov()
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}
    proc = subprocess.run(
        [str(checkov), "-d", str(INFRA), "--framework", "bicep", "--skip-download", "--output", "json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.stdout.strip(), f"checkov printed nothing (rc={proc.returncode}): {proc.stderr[-2000:]}"
    data = json.loads(proc.stdout)
    results = data if isinstance(data, list) else [data]
    (bicep,) = [r for r in results if r.get("check_type") == "bicep"]
    return proc.returncode, bicep["results"]


def test_checkov_passes(report):
    returncode, results = report
    failed = [f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
              for c in results["failed_checks"]]
    assert not failed, "\n".join(failed)
    assert returncode == 0
    assert len(results["passed_checks"]) >= 20, "checkov scanned (almost) nothing"


def test_every_skip_is_justified_inline(report):
    _, results = report
    assert results["skipped_checks"], "expected the documented skips (no VNet in this template)"
    for check in results["skipped_checks"]:
        comment = check["check_result"].get("suppress_comment", "")
        where = f"{check['check_id']} {check['resource']}"
        assert comment and comment != "No comment provided", f"{where} skipped without a reason"
        assert len(comment.split()) >= 8, f"{where}: reason too thin: {comment!r}"
