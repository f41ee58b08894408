"""The Table purge at size, on Azurite: the unbounded purge (before) against the bounded sweep.

    .venv/bin/python -m benchmarks.purge [--markers 200000] [--budget 60] [--live 200000]

1. Backlog: `--markers` markers, all expired (maintenance was off for a while), in
   partitions of 100 (the ledger's layout: markers of one account), inserted with
   entity-group transactions. Before: the purge as it was (every expired row of the
   table collected in memory, then deleted). After: `TableIdempotencyStore.sweep` run
   after run, each within `--budget` seconds, until its scan finishes.
2. Steady state: `--live` live markers and 1% as many expired ones: what one run costs
   when almost nothing is to delete (the service still reads every row it scans).

Peak memory is tracemalloc's peak of Python allocations during a run (tracemalloc slows
the client, so times under it are marked); rows read are the rows the service returned.
Azurite runs on the same 2 cores as the client: its figures are not Azure's.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from azure.core import MatchConditions

from local_stack.servers import AZURITE_ACCOUNT, AZURITE_KEY, azurite_tables, free_port
from shared._backends import TableIdempotencyStore
from shared._backends.table_batch import submit_transaction
from shared._core.exceptions import OperationFailedError
from shared._core.keys import DedupKey
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import MAX_TRANSACTION_OPERATIONS

NOW = 1_900_000_000.0
TTL = 7 * 86400.0
PER_PARTITION = 100


@dataclass
class Run:
    seconds: float
    peak_mib: float | None
    rows_read: int
    purged: int
    complete: bool


@dataclass
class Measured:
    seconds: float = 0.0
    peak_mib: float | None = None


@contextmanager
def measured(trace: bool) -> Iterator[Measured]:
    out = Measured()
    if trace:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        yield out
    finally:
        out.seconds = time.perf_counter() - start
        if trace:
            out.peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()


def insert(store: TableIdempotencyStore, count: int, *, expired: bool, prefix: str,
           workers: int = 4) -> float:
    """`count` completed markers in partitions of 100, one entity-group transaction each."""
    expires = NOW - 60 if expired else NOW + TTL

    def partition(index: int) -> None:
        pk = f"{prefix}-{index:06}"
        n = min(PER_PARTITION, count - index * PER_PARTITION)
        ops = [("create", store._record_entity(IdempotencyRecord(
            key=DedupKey("bench", f"{pk}-{i:03}"), state=RecordState.COMPLETED, request_hash="h",
            created_at=expires - TTL, updated_at=expires - TTL, expires_at=expires,
            result={"ok": True}, partition=pk, record_id=f"m{i:03}")))
            for i in range(n)]
        submit_transaction(store.client, ops)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(partition, range(-(-count // PER_PARTITION))))
    return time.perf_counter() - start


def unbounded_purge(store: TableIdempotencyStore, now: float) -> tuple[int, int]:
    """The purge before the bounded sweep (commit d2b005b, shared/_backends/table.py): every
    expired row collected by partition, then deleted in transactions. (deleted, rows read)"""
    by_partition: dict[str, list[IdempotencyRecord]] = defaultdict(list)
    read = 0
    for record in store.iter_records(expired_before=now):
        by_partition[record.partition_key].append(record)
        read += 1
    deleted = 0
    for partition, records in by_partition.items():
        for start in range(0, len(records), MAX_TRANSACTION_OPERATIONS):
            chunk = records[start:start + MAX_TRANSACTION_OPERATIONS]
            ops = [("delete", {"PartitionKey": partition, "RowKey": r.id},
                    {"etag": r.etag, "match_condition": MatchConditions.IfNotModified}) for r in chunk]
            try:
                store._transaction(ops, marker_id=None)
                deleted += len(chunk)
            except OperationFailedError:
                deleted += store._delete_each(chunk)
    return deleted, read


def before(store: TableIdempotencyStore, trace: bool) -> Run:
    with measured(trace) as m:
        purged, read = unbounded_purge(store, NOW)
    return Run(m.seconds, m.peak_mib, read, purged, True)


def after(store: TableIdempotencyStore, budget: float, trace: bool, max_runs: int = 1000) -> list[Run]:
    runs = []
    parked: list[Any] = []
    for _ in range(max_runs):
        with measured(trace) as m:
            report = store.sweep(NOW, stale_before=NOW - 3600, on_stale=parked.append,
                                 budget_seconds=budget)
        runs.append(Run(m.seconds, m.peak_mib, report.rows_read, report.purged,
                        report.complete))
        print("    run", len(runs), asdict(runs[-1]), flush=True)
        if report.complete:
            break
    return runs


def summary(runs: list[Run]) -> dict[str, Any]:
    peaks = [r.peak_mib for r in runs if r.peak_mib is not None]
    return {"runs": len(runs), "finished": runs[-1].complete,
            "seconds_per_run_max": round(max(r.seconds for r in runs), 1),
            "seconds_total": round(sum(r.seconds for r in runs), 1),
            "peak_mib_max": round(max(peaks), 1) if peaks else None,
            "rows_read_per_run_max": max(r.rows_read for r in runs),
            "rows_read_total": sum(r.rows_read for r in runs),
            "purged_total": sum(r.purged for r in runs),
            "per_run": [asdict(r) for r in runs]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--markers", type=int, default=200_000, help="expired markers (backlog)")
    parser.add_argument("--live", type=int, default=200_000, help="live markers (steady state)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per sweep run")
    parser.add_argument("--table-connection-string", help="an existing account instead of Azurite")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)

    server = None
    conn = args.table_connection_string
    if conn is None:
        port = free_port()
        server = azurite_tables(port)
        server.start()
        conn = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"TableEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")
    figures: dict[str, Any] = {"markers": args.markers, "live": args.live, "budget_seconds": args.budget}
    try:
        store = TableIdempotencyStore.from_connection_string(
            conn, table_name=f"purge{uuid.uuid4().hex[:8]}", create_table=True)
        log: Callable[..., None] = lambda *a: print(*a, flush=True)  # noqa: E731

        log(f"inserting {args.markers} expired markers ...")
        figures["insert_seconds"] = round(insert(store, args.markers, expired=True, prefix="old"), 1)
        log(f"  {figures['insert_seconds']} s; before: the unbounded purge (tracemalloc on) ...")
        old = before(store, trace=True)
        figures["backlog_before"] = summary([old])
        log("  ", json.dumps({k: v for k, v in figures["backlog_before"].items() if k != "per_run"}))

        insert(store, args.markers, expired=True, prefix="old")
        log("after: the bounded sweep, run after run (tracemalloc on) ...")
        figures["backlog_after"] = summary(after(store, args.budget, trace=True))
        log("  ", json.dumps({k: v for k, v in figures["backlog_after"].items() if k != "per_run"}))

        log(f"steady state: {args.live} live + {args.live // 100} expired markers ...")
        insert(store, args.live, expired=False, prefix="live")
        insert(store, args.live // 100, expired=True, prefix="old")
        figures["steady_before"] = summary([before(store, trace=False)])
        log("  before:", json.dumps({k: v for k, v in figures["steady_before"].items() if k != "per_run"}))
        insert(store, args.live // 100, expired=True, prefix="old")
        figures["steady_after"] = summary(after(store, args.budget, trace=False))
        log("  after:", json.dumps({k: v for k, v in figures["steady_after"].items() if k != "per_run"}))
        steady = figures["steady_after"]
        seconds = sum(run["seconds"] for run in steady["per_run"])  # unrounded
        figures["rows_scanned_per_second"] = round((args.live + args.live // 100) / seconds)
        store.client.delete_table()
        store.close()
    finally:
        if server is not None:
            server.stop()
    if args.out:
        with open(args.out, "w") as out:
            json.dump(figures, out, indent=2)
    print(json.dumps({k: v for k, v in figures.items()}, indent=None)[:4000])


if __name__ == "__main__":
    main()
