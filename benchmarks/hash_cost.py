"""CPU cost of the request hash per payment event: the canonical form (RFC 8785, `request_hash`)
against the previous one (json.dumps with sorted keys), over the latency workload's payments.

    .venv/bin/python -m benchmarks.hash_cost [--events 2000] [--rounds 7]

Both hash the very payloads the payments consumer hashes (`Payment.content`), each timed over
all events per round, rounds alternated; the minimum round is reported (the least disturbed
by other processes on a shared machine), with the median beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.variants import parse_payment
from benchmarks.workload import build_payment_workload
from shared._core.keys import request_hash


def previous_request_hash(payload: Any) -> str:
    """The hash before the canonical form (the previous release's code): what records written
    then hold."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class HashCost:
    events: int
    rounds: int
    new_us: float  # per event, minimum round
    old_us: float
    new_median_us: float
    old_median_us: float

    @property
    def added_us(self) -> float:
        return self.new_us - self.old_us

    def note(self) -> str:
        return (f"Request hash CPU per event ({self.events} payment payloads, best of "
                f"{self.rounds} rounds): {self.new_us:.2f} µs canonical (RFC 8785), "
                f"{self.old_us:.2f} µs previous form (medians {self.new_median_us:.2f} / "
                f"{self.old_median_us:.2f} µs).")


def _round(hash_of: Callable[[Any], str], payloads: Sequence[Any]) -> float:
    started = time.process_time()
    for payload in payloads:
        hash_of(payload)
    return (time.process_time() - started) / len(payloads) * 1e6


def measure(payloads: Sequence[Any], *, rounds: int = 7) -> HashCost:
    """µs of client CPU per payload for both forms, rounds alternated."""
    if not payloads:
        raise ValueError("no payloads to hash")
    new: list[float] = []
    old: list[float] = []
    for n in range(rounds):
        pair = ((new, request_hash), (old, previous_request_hash))
        for times, hash_of in pair if n % 2 == 0 else reversed(pair):
            times.append(_round(hash_of, payloads))
    return HashCost(len(payloads), rounds, min(new), min(old), statistics.median(new),
                    statistics.median(old))


def payment_contents(*, events: int, seed: int = 1, accounts: int = 100) -> list[dict[str, Any]]:
    """What the payments consumer hashes for each event of the latency workload."""
    workload = build_payment_workload(events=events, accounts=accounts, batch_size=events,
                                      seed=seed, warmup_events=0)
    return [parse_payment(event).content for batch in workload.batches for event in batch]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hash_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(measure(payment_contents(events=args.events, seed=args.seed), rounds=args.rounds).note())


if __name__ == "__main__":
    main()
