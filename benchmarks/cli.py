"""`python -m benchmarks`: start the local servers, run every variant, report.

Loopback mode by default; `--rtt-ms` runs the latency mode (payment batches
behind relays that add each round-trip time). Both print a table and the
targets (met or missed, with their figures) and write benchmarks/out/.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from benchmarks import report
from benchmarks.counting import BACKENDS, Endpoints
from benchmarks.rtt import RttNotVerifiedError
from benchmarks.runner import Run, run_latency, run_loopback
from benchmarks.variants import LATENCY_VARIANTS, LOOPBACK_VARIANTS
from benchmarks.workload import LatencySizes, Sizes

OUT = Path(__file__).resolve().parent / "out"


def _parser() -> argparse.ArgumentParser:
    d, lat_d = Sizes(), LatencySizes()
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--backend", choices=(*BACKENDS, "both"), default="both")
    p.add_argument("--variants", default=None,
                   help="comma-separated subset of: " + ", ".join(LOOPBACK_VARIANTS)
                        + "; latency mode: " + ", ".join(LATENCY_VARIANTS))
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"events per Event Hubs batch (default {d.batch_size}; latency mode "
                        f"{lat_d.batch_size})")
    p.add_argument("--out", type=Path, default=OUT, help="output folder (default benchmarks/out)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    loop = p.add_argument_group("loopback mode", "the servers as they are (the default)")
    loop.add_argument("--messages", type=int, default=d.messages, help="new messages per variant")
    loop.add_argument("--duplicates", type=int, default=None,
                      help="redeliveries per variant (default: as many as --messages)")
    loop.add_argument("--batches", type=int, default=d.batches,
                      help="Event Hubs batches (then replayed)")
    loop.add_argument("--concurrent", type=int, default=d.concurrent,
                      help="messages delivered as simultaneous copies")
    loop.add_argument("--copies", type=int, default=d.copies, help="simultaneous copies per message")
    loop.add_argument("--rounds", type=int, default=d.rounds,
                      help="interleaved rounds of the new-message phase")
    loop.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument("--orders", type=int, default=0, metavar="N",
                   help="the Service Bus orders path instead: the function against its "
                        "same-requests baseline, N new orders each redelivered, three rounds")
    lat = p.add_argument_group(
        "latency mode", "payment batches behind relays that add round-trip time")
    lat.add_argument("--rtt-ms", default=None,
                     help="comma-separated added RTTs, e.g. 1,5,10: runs the latency mode")
    lat.add_argument("--events", type=int, default=lat_d.events, help="payment events per scenario")
    lat.add_argument("--accounts", default=",".join(str(a) for a in lat_d.accounts),
                     help="comma-separated account counts, one scenario each")
    lat.add_argument("--concurrency", type=int, default=None,
                     help="concurrent account groups of the no-dedup limits (default: the app's "
                          "bound, PartitionBatchProcessor.max_concurrency)")
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
    batch = args.batch_size or LatencySizes().batch_size
    return LatencySizes(events=args.events, batch_size=batch,
                        accounts=tuple(int(a) for a in args.accounts.split(",") if a.strip()),
                        warmup_events=batch, concurrency=args.concurrency)


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


def _run(args: argparse.Namespace, names: tuple[str, ...], backends: tuple[str, ...]) -> Run:
    """Latency mode always runs on the local servers (the relays forward to loopback only)."""
    endpoints = None if args.rtt_ms else _external_endpoints()
    if endpoints is not None:
        return run_loopback(endpoints, _sizes(args), seed=args.seed, backends=backends,
                            variants=names, progress=_progress)
    from local_stack import COSMOS_LOCAL_KEY, LocalStack

    _progress("starting Azurite and the Cosmos server on loopback")
    with LocalStack() as stack:
        local = Endpoints(stack.table_connection_string, stack.cosmos_endpoint, COSMOS_LOCAL_KEY,
                          cosmos_verify=False)
        if not args.rtt_ms:
            return run_loopback(local, _sizes(args), seed=args.seed, backends=backends,
                                variants=names, progress=_progress)
        rtts = tuple(float(v) for v in args.rtt_ms.split(",") if v.strip())
        return run_latency(local, _latency_sizes(args), rtts, seed=args.seed, backends=backends,
                           variants=names, progress=_progress)


def _orders(count: int, backends: tuple[str, ...]) -> int:
    """The orders function's CPU per delivery against its same-requests baseline, per backend."""
    from benchmarks.profile_cpu import compare_orders, orders_lines
    from local_stack import LocalStack

    _progress("starting Azurite and the Cosmos server on loopback")
    with LocalStack() as stack:
        for backend in backends:
            for line in orders_lines(backend, compare_orders(stack.environment(), backend, count)):
                print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    known = LATENCY_VARIANTS if args.rtt_ms else LOOPBACK_VARIANTS
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
    if args.orders:
        return _orders(args.orders, backends)
    try:
        run = _run(args, names, backends)
    except RttNotVerifiedError as error:
        print(f"latency mode: {error}", file=sys.stderr)
        return 1
    print(report.text_table(run))
    print()
    for target in report.targets(run):
        print(target.line())
    for split in report.library_cpu_split(run):
        print(split.line())
    written = report.write_outputs(run, args.out, with_chart=not args.no_chart)
    print()
    print(report.header(run))
    for kind, path in written.items():
        print(f"wrote {kind}: {path}")
    wrong = [f"{r.name}/{r.backend}/{r.accounts}" for r in run.results if r.balance_mismatches]
    if wrong:
        print(f"wrong balances: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0
