"""The Event Hubs trigger's helper: `EventHubConsumer` views a cardinality-many batch and hands
it to a `PartitionBatchProcessor`; `EventHubConsumer.checked` refuses, at import, a trigger whose
retry policy does not re-run a failed batch before the host checkpoints it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared._core.cloudevents import MAX_EVENT_BYTES, CloudEvent, as_text, parse_cloudevent
from shared._core.exceptions import ConfigurationError
from shared._core.observability import batch_span
from shared._flows.batch import (
    AsyncPartitionBatchProcessor,
    BasePartitionBatchProcessor,
    BatchReport,
    PartitionBatchProcessor,
)


@dataclass(frozen=True, slots=True)
class EventView:
    """An Event Hubs event as the batch processor reads it (`event_views` of a batch)."""

    sequence_number: int
    body: bytes
    properties: Mapping[str, Any] = field(default_factory=dict[str, Any])
    content_type: str | None = None
    offset: str | None = None
    enqueued_time: str | None = None
    partition_key: str | None = None

    def cloud_event(self, *, max_bytes: int = MAX_EVENT_BYTES) -> CloudEvent:
        """The event as a CloudEvent, structured or binary mode; InvalidEventError saying what
        is wrong (raised in a batch's `parse`, the processor parks the event with that reason)."""
        return parse_cloudevent(self.body, self.properties, self.content_type, max_bytes=max_bytes)


def event_views(events: Sequence[Any]) -> list[EventView]:
    """Per-event views of a cardinality-many batch of `azure.functions.EventHubEvent`.

    Each event carries the whole batch's trigger metadata; its own application properties
    are entry i of `PropertiesArray` (its system ones, of `SystemPropertiesArray`).
    """
    views: list[EventView] = []
    for index, event in enumerate(events):
        metadata: Mapping[str, Any] = event.metadata or {}
        # Inline, not a helper: this runs for every event of every batch.
        properties_array: Sequence[Any] = metadata.get("PropertiesArray") or []
        system_array: Sequence[Any] = metadata.get("SystemPropertiesArray") or []
        raw: Mapping[Any, Any] = (properties_array[index] if index < len(properties_array)
                                  else None) or {}
        system: Mapping[str, Any] = (system_array[index] if index < len(system_array)
                                     else None) or {}
        properties = {str(as_text(k)): as_text(v) for k, v in raw.items()}
        if event.sequence_number is None:
            raise ValueError("an Event Hubs event without a sequence number")
        views.append(EventView(
            sequence_number=int(event.sequence_number), body=event.get_body() or b"",
            properties=properties, content_type=_content_type(properties, system),
            offset=None if event.offset is None else str(event.offset),
            enqueued_time=None if event.enqueued_time is None else event.enqueued_time.isoformat(),
            partition_key=event.partition_key))
    return views


def _content_type(properties: Mapping[str, Any], system: Mapping[str, Any]) -> str | None:
    for source in (system, properties):
        for name in ("ContentType", "content-type", "content_type", "contentType"):
            if source.get(name):
                return str(as_text(source[name]))
    return None


def partition_of(events: Sequence[Any]) -> str:
    """The batch's partition, from the trigger metadata the host sends with every event."""
    for event in events:
        metadata: Mapping[str, Any] = event.metadata or {}
        context: Mapping[str, Any] = metadata.get("PartitionContext") or {}
        if context.get("PartitionId") is not None:
            return str(context["PartitionId"])
    raise ValueError("Event Hubs trigger metadata has no PartitionContext.PartitionId")


#: The retry policy the batch rests on: the host re-runs a failed batch, without end, before it
#: checkpoints past it (it checkpoints even when the function raised).
RETRY_POLICY_HINT = ('@app.retry(strategy="exponential_backoff", max_retry_count="-1", '
                     'minimum_interval="00:00:05", maximum_interval="00:05:00")')


class _FunctionBuilder(Protocol):
    """What the `azure.functions` decorators return: a builder of the function's metadata."""

    def build(self) -> Any: ...


class BaseEventHubConsumer[P: BasePartitionBatchProcessor[Any, Any, Any, Any, Any, Any]]:
    """One Event Hubs consumer: a cardinality-many batch of one partition to its processor.

    The batch's correctness rests on the host running a failed batch again before it
    checkpoints: decorate the function with `EventHubConsumer.checked`, above its trigger and
    retry decorators, and a trigger without an unbounded retry policy fails indexing.
    """

    def __init__(self, processor: P) -> None:
        self.processor = processor

    @staticmethod
    def checked[F: _FunctionBuilder](function: F) -> F:
        """Refuse, at import, an Event Hubs trigger the host would checkpoint past a failed
        batch: not cardinality many, or without a retry policy of `max_retry_count="-1"`."""
        if not callable(getattr(function, "build", None)):
            raise ConfigurationError("put @EventHubConsumer.checked above the function's "
                                     "decorators (it checks the trigger and retry they declare)")
        built = function.build()
        name = built.get_function_name()
        trigger = built.get_trigger()
        binding: dict[str, Any] = trigger.get_dict_repr() if trigger is not None else {}
        if binding.get("type") != "eventHubTrigger":
            raise ConfigurationError(f"{name}: EventHubConsumer serves an eventHubTrigger; "
                                     f"this function's trigger is {binding.get('type')!r}")
        if str(getattr(binding.get("cardinality"), "value", binding.get("cardinality"))) != "many":
            raise ConfigurationError(f'{name}: declare the trigger with cardinality="many" '
                                     "(the processor commits a batch per account group)")
        retry: dict[str, Any] = built.get_settings_dict("retry_policy") or {}
        if str(retry.get("max_retry_count", "")).strip() != "-1":
            found = f"max_retry_count={retry['max_retry_count']!r}" if retry else "no retry policy"
            raise ConfigurationError(
                f"{name}: the Event Hubs host checkpoints after a batch even when it failed, so a "
                "batch that failed for a transient reason (store outage, throttling) must be run "
                f"again until it succeeds; {found}. Add {RETRY_POLICY_HINT} below the function name")
        return function

    def _summary(self, report: BatchReport, views: Sequence[EventView], partition: str,
                 started: float) -> None:
        """One summary record per batch; the per-event outcomes are on the metrics."""
        processor = self.processor
        sequences = [view.sequence_number for view in views]
        processor.ledger.telemetry.batch(
            consumer=processor.consumer, partition_id=partition,
            counts={"processed": report.applied, "duplicate": report.duplicates,
                    "replay_skipped": report.replay_skipped,
                    "parked": sum(report.parked.values())},
            first_sequence=min(sequences), last_sequence=max(sequences),
            duration=time.perf_counter() - started,
            context={"parked_reasons": dict(report.parked)} if report.parked else None)


class EventHubConsumer(BaseEventHubConsumer[PartitionBatchProcessor[Any, Any]]):
    """Runs each batch through a sync `PartitionBatchProcessor`. `process` raises only when the
    batch must run again (a transient failure, a failed dispatch, parking failed): the retry
    policy re-runs it, and the mark and the keys absorb what was done."""

    def process(self, events: Sequence[Any]) -> BatchReport:
        if not events:
            return BatchReport()
        started = time.perf_counter()
        views, partition = event_views(events), partition_of(events)
        with batch_span(self.processor.consumer, partition_id=partition, events=len(views)):
            report = self.processor.process_batch(views, partition)
            self._summary(report, views, partition, started)
        return report


class AsyncEventHubConsumer(BaseEventHubConsumer[AsyncPartitionBatchProcessor[Any, Any]]):
    """`EventHubConsumer` for an `async def` function (`shared.aio.EventHubConsumer`)."""

    async def process(self, events: Sequence[Any]) -> BatchReport:
        if not events:
            return BatchReport()
        started = time.perf_counter()
        views, partition = event_views(events), partition_of(events)
        with batch_span(self.processor.consumer, partition_id=partition, events=len(views)):
            report = await self.processor.process_batch(views, partition)
            self._summary(report, views, partition, started)
        return report
