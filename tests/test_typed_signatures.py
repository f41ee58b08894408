"""The front door's builds are typed: a build receives the `Transaction` of its variant.

pyright checks a user's file that calls every entry point taking a build. The lines marked
`# refused` pass a build of the other variant, or use what a transaction does not have; the
type checker must refuse exactly those, and accept every other line (a well-typed build).
Were a signature `Callable[..., Any]` again, its refused line would pass and this test fail.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

USER_FILE = '''
from typing import Any

from shared import (DedupKey, Idempotency, ParkingLot, PartitionBatchProcessor,
                    PartitionWatermark, ServiceBusConsumer, StorageQueueConsumer, Transaction, aio)
from shared.testing import AsyncInMemoryIdempotencyStore, InMemoryIdempotencyStore

key = DedupKey("c", "k")
idem = Idempotency(InMemoryIdempotencyStore())
aidem = aio.Idempotency(AsyncInMemoryIdempotencyStore())


def save(tx: Transaction, order: dict[str, Any]) -> None:
    tx.create("order", order)


async def asave(tx: aio.Transaction, order: dict[str, Any]) -> None:
    if await tx.read("order") is None:
        tx.create("order", order)


def post(tx: Transaction, items: list[dict[str, Any]]) -> list[int]:
    return [0 for _ in items]


idem.run_atomic(key, "h", lambda tx: tx.create("d", {}))
idem.run_atomic(key, "h", lambda tx: tx.send_later())  # refused


async def main() -> None:
    await aidem.run_atomic(key, "h", lambda tx: tx.create("d", {}))
    await aidem.run_atomic(key, "h", lambda tx: save(tx, {}))  # refused
    orders = ServiceBusConsumer("orders", idem)
    orders.run_atomic(None, None, save)
    orders.run_atomic(None, None, asave)  # refused
    aorders = aio.ServiceBusConsumer("orders", aidem)
    await aorders.run_atomic(None, None, asave)
    await aorders.run_atomic(None, None, save)  # refused
    no_queue: Any = None  # a type check sends nothing
    audit = StorageQueueConsumer("audit", idem, poison=no_queue)
    audit.run_atomic(None, save)
    audit.run_atomic(None, asave)  # refused
    marks = PartitionWatermark(InMemoryIdempotencyStore(), consumer="p", event_hub="h",
                               consumer_group="$Default")
    parking = ParkingLot(InMemoryIdempotencyStore())
    PartitionBatchProcessor(idem, marks, parking, consumer="p", event_hub="h",
                            parse=lambda event, partition: {"a": 1},
                            identify=lambda item: (key, "h"), group=lambda item: "a", build=post)
    PartitionBatchProcessor(idem, marks, parking, consumer="p", event_hub="h",
                            parse=lambda event, partition: {"a": 1},
                            identify=lambda item: (key, "h"), group=lambda item: "a",
                            build=asave)  # refused
'''


def refused_lines(source: str, tmp_path: Path) -> set[int]:
    """The lines pyright (the project's pinned one, its config) reports an error on."""
    path = tmp_path / "user_app.py"
    path.write_text(source)
    run = subprocess.run([str(ROOT / "node_modules" / ".bin" / "pyright"), "--outputjson", str(path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = json.loads(run.stdout)
    return {d["range"]["start"]["line"] + 1 for d in report["generalDiagnostics"]
            if d["severity"] == "error"}


def marked(source: str) -> set[int]:
    return {n for n, line in enumerate(source.splitlines(), 1) if line.endswith("# refused")}


def test_builds_of_the_other_variant_are_refused_and_typed_builds_pass(tmp_path):
    assert len(marked(USER_FILE)) == 6
    assert refused_lines(USER_FILE, tmp_path) == marked(USER_FILE)


def test_counter_proof_an_entry_point_typed_any_lets_its_line_pass(tmp_path):
    """What the test would see if a signature were `Any` again: the marked line passes."""
    untyped = (USER_FILE + "\n_idem: Any = idem\n"
               "_idem.run_atomic(key, \"h\", lambda tx: tx.send_later())  # refused\n")
    last = len(untyped.splitlines())
    assert marked(untyped) - refused_lines(untyped, tmp_path) == {last}
