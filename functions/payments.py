"""`payments`: Event Hubs trigger, cardinality many.

The host checkpoints after every batch even when the function raised, so the
function raises only when the batch must run again: a store failure that
retrying fixes (outage, throttling, lost races; never a reason to park a valid
event), a failed dispatch of the batch's `BalanceChanged` messages (sent
before the mark moves), or parking itself failed. The retry policy re-runs the
same batch before the checkpoint, and the high-water mark and per-event keys
absorb what was done.

It is an `async def` on the async API: one event loop keeps every account
group's store request in flight, with no thread per group.
"""

from __future__ import annotations

import logging
import time
import typing

import azure.functions as func

from functions.adapters import event_views, partition_id
from functions.services import services
from shared.observability import batch_span

bp = func.Blueprint()
logger = logging.getLogger(__name__)


@bp.function_name("payments")
@bp.retry(strategy="exponential_backoff", max_retry_count="-1", minimum_interval="00:00:05",
          maximum_interval="00:05:00")
@bp.event_hub_message_trigger(arg_name="events", event_hub_name="%PAYMENTS_HUB_NAME%",
                              connection="EventHubConnection",
                              consumer_group="%PAYMENTS_CONSUMER_GROUP%", cardinality="many")
async def payments(events: typing.List[func.EventHubEvent]) -> None:  # noqa: UP006 - the worker refuses list[...]
    if not events:
        return
    started = time.perf_counter()
    views, partition = event_views(events), partition_id(events)
    app = services()
    # One span per batch: its store calls and its summary record share one trace.
    with batch_span("payments", partition_id=partition, events=len(views)):
        report = await app.payments_async.process_batch(views, partition)
        # One summary record per batch; the per-event outcomes are on the dedup.messages metric.
        sequences = [view.sequence_number for view in views]
        app.telemetry.batch(
            consumer="payments", partition_id=partition,
            counts={"processed": report.applied, "duplicate": report.duplicates,
                    "replay_skipped": report.replay_skipped, "parked": sum(report.parked.values())},
            first_sequence=min(sequences), last_sequence=max(sequences),
            duration=time.perf_counter() - started,
            context={"parked_reasons": dict(report.parked)} if report.parked else None)
