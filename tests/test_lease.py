"""The two-phase lease follows the lock: renewed while the handler runs, honest when lost."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from functions.settings import Settings, SettingsError
from shared import DedupKey, Idempotency, IdempotencyConfig, request_hash
from shared._core.records import OutcomeStatus, RecordState
from shared.testing import InMemoryIdempotencyStore
from tests.support.doubles import applied_now

KEY, DIGEST = DedupKey("notify", "m-1"), request_hash({"text": "hi"})


@pytest.mark.parametrize("backend", ["memory", "table", "cosmos"])
def test_a_live_handler_keeps_its_lease_past_the_lease_length(make_store, backend):
    """Real time, a 0.6 s lease and a 2 s handler: without renewal a second consumer would
    take the key over mid-call; with it the second consumer is told it is in progress."""
    store = make_store(backend)
    config = IdempotencyConfig(lease=timedelta(seconds=0.6), ttl=timedelta(hours=1))
    first, second = Idempotency(store, config=config), Idempotency(store, config=config)
    started, seen = threading.Event(), []

    def slow() -> str:
        started.set()
        time.sleep(2.0)
        return "sent"

    runner = threading.Thread(target=lambda: seen.append(first.run(KEY, DIGEST, slow)))
    runner.start()
    started.wait()
    time.sleep(1.2)  # two lease lengths later
    assert second.run(KEY, DIGEST, lambda: "again").status is OutcomeStatus.IN_PROGRESS
    runner.join()
    assert seen[0].status is OutcomeStatus.PROCESSED and seen[0].result == "sent"


def test_a_holder_that_lost_its_lease_gets_lease_lost_and_the_stored_result(clock):
    store = InMemoryIdempotencyStore()
    config = IdempotencyConfig(lease=timedelta(seconds=54), ttl=timedelta(hours=1), clock=clock)
    first, second = Idempotency(store, config=config), Idempotency(store, config=config)
    taken = []

    def slow_effect() -> str:  # another consumer takes over while this one is stuck
        clock.advance(55)
        taken.append(second.run(KEY, DIGEST, lambda: "theirs"))
        return "ours"

    outcome = first.run(KEY, DIGEST, slow_effect)
    assert taken[0].status is OutcomeStatus.TAKEN_OVER
    assert outcome.status is OutcomeStatus.LEASE_LOST
    assert outcome.result == "theirs"  # what the store kept, never our own result
    assert outcome.should_ack and applied_now(outcome)
    stored = store.get_record(KEY.encoded, KEY.encoded)
    assert stored.state is RecordState.COMPLETED and stored.result == "theirs"


def test_a_lease_as_long_as_the_lock_is_refused_at_startup():
    env = {"DEDUP_BACKEND": "table", "TABLE_CONNECTION_STRING": "x",
           "NOTIFICATION_API_URL": "http://127.0.0.1:1/n", "SERVICEBUS_LOCK_DURATION_SECONDS": "60"}
    assert Settings.from_env(env).lease == timedelta(seconds=54)
    with pytest.raises(SettingsError, match="shorter than the lock"):
        Settings.from_env({**env, "DEDUP_LEASE_SECONDS": "60"})
