"""The demo's worker: one backend's scenario in its own process (importable for `spawn`)."""

from __future__ import annotations

import argparse
import logging
import traceback
import warnings
from typing import Any


def scenario_config(args: argparse.Namespace, backend: str) -> Any:
    from simulator.scenario import ScenarioConfig

    return ScenarioConfig(
        backend=backend, seed=args.seed, messages=args.messages, events=args.events,
        duplicate_rate=args.duplicate_rate, fault_rate=args.fault_rate, consumers=args.consumers,
        partitions=args.partitions, outages=args.outages, dedup_off=args.dedup_off,
        non_atomic=args.non_atomic, api_honours_key=not args.api_ignores_idempotency_key,
        outage_seconds=args.outage_seconds,
        outage_mode=args.outage_mode,
        transient_as_permanent=args.transient_as_permanent,
        publish=getattr(args, "publish", None) or "outbox")


def _quiet_logs(path: str) -> None:
    """The app logs every conflict and parked message at ERROR: keep them in a file."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    warnings.filterwarnings("ignore")


def run_backend(config: Any, endpoints: Any, updates: Any, log_path: str) -> None:
    """Worker: one backend's scenario; sends ("progress", backend, n) and a final ("done", ...)."""
    _quiet_logs(log_path)
    backend = config.backend
    try:
        from simulator.report import format_report, summary
        from simulator.scenario import run_scenario

        def progress(total: int, _config: Any) -> Any:
            updates.put(("total", backend, total))
            return lambda n: updates.put(("progress", backend, n))

        result = run_scenario(config, endpoints, progress=progress)
        updates.put(("done", backend, format_report(result), summary(result), result.ok))
    except BaseException:
        updates.put(("failed", backend, traceback.format_exc(), {}, False))
