"""`python -m demo`: start Azurite and the Cosmos server, run the chaos workload, print the report.

Each store backend runs in its own worker process (both at once by default),
so the two Python interpreters share the machine's cores; the parent draws
one progress bar per backend and exits non-zero if any invariant broke.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import sys
import tempfile
import time
from typing import Any

BACKENDS = ("table", "cosmos")
# The workload, in all (split across the backends unless --per-backend), by size. The quick
# default still provokes every cause of duplicates, every fault kind, both outbox hops and
# the same invariants, in a few minutes on 2 cores; --full is the long run. A new kind of
# input (another trigger's messages) adds its count to each size and an option defaulting
# to None.
WORKLOADS: dict[str, dict[str, int]] = {
    "quick": {"messages": 6_000, "events": 6_000},
    "full": {"messages": 20_000, "events": 20_000},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="./dev demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="At-least-once delivery with duplicates and faults, through the real "
                    "functions, against Azurite and the Cosmos server; checks exactly-once "
                    "effects from the stores.",
        epilog="examples:\n"
               "  ./dev demo                                          the default (quick) run\n"
               "  ./dev demo --full                                   20,000 messages + 20,000 "
               "events\n"
               "  ./dev demo --fault-rate 0.15 --duplicate-rate 0.4   harsher: 3x the faults, more "
               "duplicates;\n"
               "      must still report 0 double, 0 lost and 0 valid messages not effected\n"
               "  ./dev demo --outages 1 --outage-seconds 20 --outage-mode fail-fast\n"
               "      one sustained store outage (503 for 20 s of virtual time)")
    quick, full = WORKLOADS["quick"], WORKLOADS["full"]
    parser.add_argument("--full", action="store_true",
                        help=f"the full run: {full['messages']:,} Service Bus messages and "
                             f"{full['events']:,} Event Hubs events in all (default: "
                             f"{quick['messages']:,} + {quick['events']:,}); --messages and "
                             "--events still override")
    parser.add_argument("--messages", type=int, default=None,
                        help="Service Bus messages in all, split evenly across the backends "
                             f"(default {quick['messages']}; --full {full['messages']})")
    parser.add_argument("--events", type=int, default=None,
                        help="Event Hubs events in all, split evenly across the backends "
                             f"(default {quick['events']}; --full {full['events']})")
    parser.add_argument("--per-backend", action="store_true",
                        help="send --messages and --events to each backend instead of splitting")
    parser.add_argument("--seed", type=int, default=2024, help="seed of the workload and faults")
    parser.add_argument("--duplicate-rate", type=float, default=0.25,
                        help="duplicate deliveries to provoke, as a share of messages (default 0.25)")
    parser.add_argument("--fault-rate", type=float, default=0.05,
                        help="share of deliveries that hit a fault (default 0.05); 0 turns faults "
                             "and outages off")
    parser.add_argument("--consumers", type=int, default=4,
                        help="competing consumer instances (default 4)")
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    parser.add_argument("--partitions", type=int, default=4, help="event hub partitions (default 4)")
    parser.add_argument("--outages", type=int, default=None,
                        help="store outages (server paused) per backend (default 2 with faults on)")
    parser.add_argument("--outage-seconds", type=float, default=2.5,
                        help="length of each outage (default 2.5)")
    parser.add_argument("--outage-mode", choices=("auto", "pause", "fail-fast"), default="auto",
                        help="auto/pause: the server process is paused (SIGSTOP, wall time); "
                             "fail-fast: its stores answer 503 at once (virtual time)")
    parser.add_argument("--serial", action="store_true",
                        help="run the backends one after the other in this process")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--json", help="write the reports' numbers to this JSON file")
    parser.add_argument("--report-dir", default="demo-out",
                        help="folder for demo-report.txt and demo-report.html (default demo-out)")
    proofs = parser.add_argument_group("counter-proofs (harness flags; the app is unchanged)")
    proofs.add_argument("--dedup-off", action="store_true",
                        help="stores answer every claim as new: the checks must report double effects")
    proofs.add_argument("--non-atomic", choices=("effect-first", "marker-first"),
                        help="marker and effect written in separate steps, with crashes in between")
    proofs.add_argument("--api-ignores-idempotency-key", action="store_true",
                        help="the fake notification API does not deduplicate by Idempotency-Key")
    proofs.add_argument("--publish", choices=("before-commit", "after-commit", "mark-first"),
                        help="publish without the outbox: before the commit, right after it "
                             "(not recorded), or (payments) with the mark moved before the "
                             "dispatch: the checks must report phantoms, doubles or losses")
    proofs.add_argument("--transient-as-permanent", action="store_true",
                        help="the store client reports a transient failure (429/503) as a permanent "
                             "rejection: the checks must report valid messages not effected")
    args = parser.parse_args(argv)
    for name, count in WORKLOADS["full" if args.full else "quick"].items():
        if getattr(args, name) is None:
            setattr(args, name, count)
    if args.messages < 0 or args.events < 0 or args.consumers < 1:
        parser.error("--messages/--events must be >= 0 and --consumers >= 1")
    return args


class _Bars:
    def __init__(self, backends: list[str], enabled: bool) -> None:
        self.enabled = enabled
        self.bars: dict[str, Any] = {}
        self.backends = backends

    def total(self, backend: str, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        self.bars[backend] = tqdm(total=total, desc=f"{backend:>6}", unit="send",
                                  position=self.backends.index(backend), leave=True,
                                  dynamic_ncols=True, file=sys.stderr)

    def update(self, backend: str, n: int) -> None:
        if backend in self.bars:
            self.bars[backend].update(n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def write_reports(args: argparse.Namespace, backends: list[str],
                  results: dict[str, tuple[str, dict[str, Any], bool]], text: str) -> tuple[str, str]:
    """The text report and its HTML rendering (charts), side by side in --report-dir."""
    from simulator.html_report import render

    os.makedirs(args.report_dir, exist_ok=True)
    text_path = os.path.join(args.report_dir, "demo-report.txt")
    html_path = os.path.join(args.report_dir, "demo-report.html")
    with open(text_path, "w", encoding="utf-8") as handle:
        handle.write(text)
    subtitle = (f"{args.messages:,} Service Bus messages and {args.events:,} Event Hubs events per "
                f"backend, duplicate rate {args.duplicate_rate:g}, fault rate {args.fault_rate:g}, "
                f"{args.consumers} competing consumers, seed {args.seed}")
    page = render({b: results[b][1] for b in backends}, subtitle=subtitle,
                  text_reports={b: results[b][0] for b in backends})
    with open(html_path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return os.path.abspath(text_path), os.path.abspath(html_path)


Results = dict[str, tuple[str, dict[str, Any], bool]]  # backend -> (report, summary, ok)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from simulator.stack import stack_for

    backends = split_workload(args)
    log_dir = tempfile.mkdtemp(prefix="idempotency-demo-")
    print("Starting Azurite and the Cosmos DB-compatible server on loopback (one set per "
          "backend) ...", flush=True)
    started = time.perf_counter()
    with contextlib.ExitStack() as servers:
        endpoints = {backend: servers.enter_context(stack_for(backend)) for backend in backends}
        results = run_backends(args, backends, endpoints, log_dir)
    from demo.queue_run import run_demo as run_queue_demo  # the Storage queue, on a real queue

    queue_text, queue_numbers, queue_ok = run_queue_demo(
        backends, seed=args.seed, log_path=os.path.join(log_dir, "queue.log"))
    elapsed = time.perf_counter() - started
    ok = all(results[b][2] for b in backends) and queue_ok
    text = final_report(args, backends, results, ok=ok, elapsed=elapsed, log_dir=log_dir)
    text += "\n\n" + queue_text
    print()
    print(text)
    text_path, html_path = write_reports(args, backends, results, text + "\n")
    print(f"Reports: {text_path} and {html_path}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"ok": ok, "wallSeconds": elapsed, "args": vars(args),
                       "backends": {b: results[b][1] for b in backends},
                       "storageQueue": queue_numbers}, handle, indent=2,
                      default=str)
    return 0 if ok else 1


def split_workload(args: argparse.Namespace) -> list[str]:
    """The backends to run. --messages and --events become each backend's share (what its
    worker reads from `args`); the totals are announced."""
    backends: list[str] = list(BACKENDS) if args.backend == "both" else [args.backend]
    share = 1 if args.per_backend else len(backends)
    total_messages, total_events = args.messages, args.events
    args.messages, args.events = -(-total_messages // share), -(-total_events // share)
    print(f"Demo: {total_messages * len(backends) // share:,} Service Bus messages and "
          f"{total_events * len(backends) // share:,} Event Hubs events in all "
          f"({args.messages:,} + {args.events:,} on each of: {', '.join(backends)}), duplicate rate "
          f"{args.duplicate_rate:g}, fault rate {args.fault_rate:g}, {args.consumers} competing "
          f"consumers, seed {args.seed}.")
    return backends


def run_backends(args: argparse.Namespace, backends: list[str], endpoints: dict[str, Any],
                 log_dir: str) -> Results:
    """Each backend's scenario in a process of its own (with --serial, one after the other in
    this one), its progress drawn as it comes."""
    from demo.worker import run_backend, scenario_config

    context = multiprocessing.get_context("spawn")
    updates: Any = queue.Queue() if args.serial else context.Queue()
    jobs = [(scenario_config(args, backend), endpoints[backend], updates,
             os.path.join(log_dir, f"{backend}.log")) for backend in backends]
    workers = []
    if args.serial:
        for job in jobs:
            run_backend(*job)
    else:
        workers = [context.Process(target=run_backend, name=f"demo-{backend}", args=job)
                   for backend, job in zip(backends, jobs, strict=True)]
        for worker in workers:
            worker.start()
    try:
        return collect(updates, backends, workers, _Bars(backends, enabled=not args.no_progress))
    finally:
        for worker in workers:
            worker.join(timeout=30)


def collect(updates: Any, backends: list[str], workers: list[Any], bars: _Bars) -> Results:
    """Progress and results from the backends' workers, until each reported (or died)."""
    results: Results = {}
    try:
        while len(results) < len(backends):
            try:
                kind, backend, *rest = updates.get(timeout=1.0)
            except queue.Empty:
                if workers and not any(w.is_alive() for w in workers) and updates.empty():
                    for backend in backends:
                        results.setdefault(backend, ("worker died without a report", {}, False))
                continue
            if kind == "total":
                bars.total(backend, rest[0])
            elif kind == "progress":
                bars.update(backend, rest[0])
            else:
                results[backend] = (rest[0], rest[1], bool(rest[2]))
    finally:
        bars.close()
    return results


def final_report(args: argparse.Namespace, backends: list[str], results: Results, *, ok: bool,
                 elapsed: float, log_dir: str) -> str:
    """Each backend's report, its numbers (and each outbox hop's), the wall time and the verdict."""
    from simulator.report import hop_line

    report: list[str] = []
    for backend in backends:
        report += [results[backend][0], ""]
    for backend in backends:
        numbers = results[backend][1]
        if numbers:
            report.append(f"{backend}: double effects {numbers['doubleEffects']}, lost {numbers['lost']}, "
                          f"phantom {numbers['phantoms']}, pending {numbers['outboxPending']}, "
                          f"valid messages not effected {numbers['validNotEffected']}"
                          + (f" (+ {numbers['validAlsoRefused']} effected but also dead-lettered/parked)"
                             if numbers["validAlsoRefused"] else "")
                          + f", invalid input not rejected {sum(numbers['invalidNotRejected'].values())}")
            report.append(f"  {backend} outbox hops: {hop_line(numbers['hops'])}")
    mode = " in parallel" if not args.serial and len(backends) > 1 else ""
    report.append(f"Total wall time {elapsed:.0f} s ({', '.join(backends)}{mode}, including server start "
                  f"and checks). App logs: {log_dir}")
    report.append("RESULT: " + ("all invariants hold" if ok else "INVARIANT BROKEN (see FAIL above)"))
    return "\n".join(report)


if __name__ == "__main__":
    sys.exit(main())
