"""`payments`: Event Hubs trigger, cardinality many, through the library's `EventHubConsumer`.

The host checkpoints after every batch even when the function raised, so the
function raises only when the batch must run again (a store failure that
retrying fixes, a failed dispatch of the batch's `BalanceChanged` messages,
parking failed), and the retry policy re-runs the same batch before the
checkpoint: `EventHubConsumer.checked` refuses, at indexing, a trigger without
it. The high-water mark and per-event keys absorb what was done.

It is an `async def` on the async API: one event loop keeps every account
group's store request in flight, with no thread per group.
"""

from __future__ import annotations

import typing

import azure.functions as func

from functions.services import services
from shared import EventHubConsumer

bp = func.Blueprint()


@EventHubConsumer.checked
@bp.function_name("payments")
@bp.retry(strategy="exponential_backoff", max_retry_count="-1", minimum_interval="00:00:05",
          maximum_interval="00:05:00")
@bp.event_hub_message_trigger(arg_name="events", event_hub_name="%PAYMENTS_HUB_NAME%",
                              connection="EventHubConnection",
                              consumer_group="%PAYMENTS_CONSUMER_GROUP%", cardinality="many")
async def payments(events: typing.List[func.EventHubEvent]) -> None:  # noqa: UP006 - the worker refuses list[...]
    await services().payments_consumer.process(events)
