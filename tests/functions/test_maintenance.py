"""`maintenance`: purges expired records and parks in-progress records nobody will finish."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from azure.functions import meta
from azure.functions.timer import TimerRequestConverter

from shared import DedupKey, request_hash
from tests.functions.conftest import function
from tests.support.parking import parked_body
from tests.support.services import records


def test_timer_purges_expired_records_and_parks_abandoned_claims(services, clock):
    idem = records(services)
    done_key = DedupKey("notify", f"done-{uuid.uuid4().hex[:6]}")
    idem.run(done_key, request_hash("x"), lambda: "sent")
    clock.advance(idem.config.ttl.total_seconds() + 1)
    stuck_key = DedupKey("audit", f"stuck-{uuid.uuid4().hex[:6]}")
    _, held = idem.claim(stuck_key, request_hash("y"))
    clock.advance(idem.config.lease.total_seconds() + services.settings.window.length.total_seconds()
                  + 1)

    timer = TimerRequestConverter.decode(
        meta.Datum(json.dumps({"IsPastDue": False, "ScheduleStatus": None}), "json"),
        trigger_metadata={})
    function("maintenance")(timer=timer)

    assert idem.store.get_record(done_key.encoded, done_key.encoded) is None
    closed = idem.store.get_record(held.partition_key, held.id)
    assert closed.state.value == "completed" and closed.result == {"parked": "StaleInProgress"}
    assert parked_body(services.parking, "audit", stuck_key.key)["reason"] == "StaleInProgress"
    assert not list(idem.store.iter_records(in_progress_before=clock()))


def test_a_timer_run_is_bounded_well_inside_the_function_timeout(services):
    """A run that outlived host.json's functionTimeout would be killed mid-page, every time:
    the sweep's budget is at most half of it, and an unfinished scan resumes next run."""
    host = json.loads((Path(__file__).parents[2] / "host.json").read_text())
    hours, minutes, seconds = map(int, host["functionTimeout"].split(":"))
    assert 0 < services.maintenance.budget_seconds <= (hours * 3600 + minutes * 60 + seconds) / 2
