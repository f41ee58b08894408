"""Concurrent copies: the store arbitrates, exactly one claimant wins, every run."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from shared import DedupKey, Idempotency, OutcomeStatus, request_hash

THREADS = 16
ROUNDS = 5


def _race(run_one) -> list:
    barrier = threading.Barrier(THREADS)

    def contender(_: int):
        barrier.wait()
        return run_one()

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(contender, range(THREADS)))


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_sixteen_threads_claiming_one_key_two_phase(store, round_):
    idem = Idempotency(store)
    effects: list[int] = []
    lock = threading.Lock()

    def effect() -> str:
        with lock:
            effects.append(1)
        return "won"

    key = DedupKey.from_message_id("race", f"msg-{round_}")
    outcomes = _race(lambda: idem.run(key, request_hash("same"), effect))
    winners = [o for o in outcomes if o.status is OutcomeStatus.PROCESSED]
    assert len(winners) == 1
    assert len(effects) == 1
    assert {o.status for o in outcomes} <= {OutcomeStatus.PROCESSED, OutcomeStatus.DUPLICATE,
                                            OutcomeStatus.IN_PROGRESS}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_sixteen_threads_committing_one_key_atomically(store, round_):
    idem = Idempotency(store)
    key = DedupKey.from_message_id("race", f"atomic-{round_}")

    def build(tx):
        tx.create(f"effect-{round_}", {"v": 1})
        return "won"

    outcomes = _race(lambda: idem.run_atomic(key, request_hash("same"), build, partition="p"))
    statuses = [o.status for o in outcomes]
    assert statuses.count(OutcomeStatus.PROCESSED) == 1
    assert statuses.count(OutcomeStatus.DUPLICATE) == THREADS - 1
    assert all(o.result == "won" for o in outcomes)
