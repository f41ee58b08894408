"""`python -m benchmarks`: start the local servers, run every variant, report."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from benchmarks import latency_report
from benchmarks.harness import BACKENDS, Endpoints, run_benchmark
from benchmarks.latency import LatencySizes, RttNotVerifiedError, run_latency
from benchmarks.latency_variants import LATENCY_VARIANTS
from benchmarks.report import markdown, targets, text_table, write_outputs
from benchmarks.variants import VARIANTS
from benchmarks.workload import Sizes

OUT = Path(__file__).resolve().parent / "out"


def _parser() -> argparse.ArgumentParser:
    d = Sizes()
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--messages", type=int, default=d.messages, help="new messages per variant")
    p.add_argument("--duplicates", type=int, default=None,
                   help="redeliveries per variant (default: as many as --messages)")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"events per Event Hubs batch (default {d.batch_size}; latency mode "
                        f"{LatencySizes().batch_size})")
    p.add_argument("--batches", type=int, default=d.batches, help="Event Hubs batches (then replayed)")
    p.add_argument("--concurrent", type=int, default=d.concurrent,
                   help="messages delivered as simultaneous copies")
    p.add_argument("--copies", type=int, default=d.copies, help="simultaneous copies per message")
    p.add_argument("--rounds", type=int, default=d.rounds,
                   help="interleaved rounds of the new-message phase")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    p.add_argument("--variants", default=None,
                   help="comma-separated subset of: " + ", ".join(VARIANTS) + "; latency mode: "
                        + ", ".join(LATENCY_VARIANTS))
    p.add_argument("--out", type=Path, default=OUT, help="output folder (default benchmarks/out)")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    lat = p.add_argument_group(
        "latency mode", "payment batches behind relays that add round-trip time (issue 12)")
    lat.add_argument("--rtt-ms", default=None,
                     help="comma-separated added RTTs, e.g. 1,5,10: runs the latency mode")
    lat.add_argument("--events", type=int, default=LatencySizes().events,
                     help="payment events per scenario")
    lat.add_argument("--accounts", default=",".join(str(a) for a in LatencySizes().accounts),
                     help="comma-separated account counts, one scenario each")
    lat.add_argument("--concurrency", type=int, default=None,
                     help="threads of the no-dedup grouped limit (default: the app's bound on "
                          "concurrent account groups, PartitionBatchProcessor.max_concurrency)")
    return p


def _sizes(args: argparse.Namespace) -> Sizes:
    if args.quick:
        return Sizes(messages=10, duplicates=10, batch_size=10, batches=2, concurrent=5,
                     copies=2, rounds=2, warmup=3)
    return Sizes(messages=args.messages,
                 duplicates=args.messages if args.duplicates is None else args.duplicates,
                 batch_size=args.batch_size or Sizes().batch_size, batches=args.batches,
                 concurrent=args.concurrent, copies=args.copies, rounds=args.rounds)


def _latency_sizes(args: argparse.Namespace) -> LatencySizes:
    if args.quick:
        return LatencySizes(events=40, batch_size=10, accounts=(4, 20), warmup_events=10,
                            concurrency=args.concurrency, probe_reads=10)
    return LatencySizes(events=args.events, batch_size=args.batch_size or LatencySizes().batch_size,
                        accounts=tuple(int(a) for a in args.accounts.split(",") if a.strip()),
                        warmup_events=args.batch_size or LatencySizes().batch_size,
                        concurrency=args.concurrency)


def _numbers(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip())


def _external_endpoints() -> Endpoints | None:
    """The same variables as the test suite, to run against an emulator or an account."""
    table = os.environ.get("IDEMPOTENCY_TEST_TABLE_CONNECTION_STRING")
    cosmos = os.environ.get("IDEMPOTENCY_TEST_COSMOS_ENDPOINT")
    if not (table and cosmos):
        return None
    return Endpoints(table, cosmos, os.environ.get("IDEMPOTENCY_TEST_COSMOS_KEY", ""),
                     os.environ.get("IDEMPOTENCY_TEST_COSMOS_VERIFY", "true") == "true")


def _progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    known = LATENCY_VARIANTS if args.rtt_ms else VARIANTS
    names = tuple(n.strip() for n in (args.variants or ",".join(known)).split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown variants: {', '.join(unknown)}", file=sys.stderr)
        return 2
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    logging.getLogger("shared").setLevel(logging.ERROR)  # outcome logs would swamp the output
    logging.getLogger("domain").setLevel(logging.ERROR)
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
    if args.rtt_ms:
        return _latency_main(args, names, backends)
    sizes = _sizes(args)
    progress = _progress

    endpoints = _external_endpoints()
    if endpoints is not None:
        run = run_benchmark(endpoints, sizes, seed=args.seed, backends=backends, variants=names,
                            progress=progress)
    else:
        from local_stack import COSMOS_LOCAL_KEY, LocalStack

        progress("starting Azurite and the Cosmos server on loopback")
        with LocalStack() as stack:
            endpoints = Endpoints(stack.table_connection_string, stack.cosmos_endpoint,
                                  COSMOS_LOCAL_KEY, cosmos_verify=False)
            run = run_benchmark(endpoints, sizes, seed=args.seed, backends=backends,
                                variants=names, progress=progress)
    print(text_table(run))
    print()
    for target in targets(run):
        print(f"[{'met' if target.met else 'MISSED'}] {target.text} ({target.backend}): "
              f"{target.measured}")
    written = write_outputs(run, args.out, with_chart=not args.no_chart)
    print()
    print("Markdown (paste into the README):")
    print()
    print(markdown(run))
    for kind, path in written.items():
        print(f"wrote {kind}: {path}")
    return 0


def _latency_main(args: argparse.Namespace, names: tuple[str, ...], backends: tuple[str, ...]) -> int:
    """Latency mode: always the local servers (the relays forward to loopback only)."""
    from local_stack import COSMOS_LOCAL_KEY, LocalStack

    rtts = _numbers(args.rtt_ms)
    sizes = _latency_sizes(args)
    _progress("starting Azurite and the Cosmos server on loopback")
    try:
        with LocalStack() as stack:
            endpoints = Endpoints(stack.table_connection_string, stack.cosmos_endpoint,
                                  COSMOS_LOCAL_KEY, cosmos_verify=False)
            run = run_latency(endpoints, sizes, rtts, seed=args.seed, backends=backends,
                              variants=names, progress=_progress)
    except RttNotVerifiedError as error:
        print(f"latency mode: {error}", file=sys.stderr)
        return 1
    print(latency_report.text_table(run))
    print()
    for target in latency_report.targets(run):
        print(f"[{'met' if target.met else 'MISSED'}] {target.text} ({target.backend}): "
              f"{target.measured}")
    written = latency_report.write_outputs(run, args.out)
    print()
    print(latency_report.header(run))
    for kind, path in written.items():
        print(f"wrote {kind}: {path}")
    wrong = [f"{r.name}/{r.backend}/{r.accounts}" for r in run.results if r.balance_mismatches]
    if wrong:
        print(f"wrong balances: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0
