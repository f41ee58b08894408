"""What the Python worker hands a function, built through the real converters alone.

For tests that call a user function directly (`tests/functions/`): the same
host data as `local_stack.host_data` (which the worker driver sends), decoded
by the converters the worker would use. Service Bus (SDK-type binding): the
model binding data content (lock token + AMQP message) decoded by the
servicebus extension's converter into `azure.servicebus.ServiceBusReceivedMessage`.
Event Hubs (cardinality many): the bodies as `collection_string` plus the
batch's trigger metadata, decoded by `azure.functions.eventhub.EventHubTriggerConverter`.
`indexed_functions()` gives the user functions themselves. The delivery
simulator does not use this module: it invokes the functions through the real
worker (`local_stack.worker`).
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import azure.functions as func
from azure.functions import meta
from azure.functions.decorators.function_app import Function
from azure.functions.eventhub import EventHubTriggerConverter
from azurefunctions.extensions.base import Datum as ExtensionDatum
from azurefunctions.extensions.bindings.servicebus import ServiceBusConverter

from local_stack.host_data import (
    LOCK_TOKEN_MARKER,
    MODEL_BINDING_CONTENT_TYPE,
    MODEL_BINDING_VERSION,
    SERVICE_BUS_SOURCE,
    SentEvent,
    SentMessage,
    event_batch_metadata,
    json_text,
    service_bus_content,
)

__all__ = ["LOCK_TOKEN_MARKER", "RecordingActions", "SentEvent", "SentMessage", "event_hub_batch",
           "indexed_functions", "service_bus_message"]


def indexed_functions() -> tuple[Function, ...]:
    """The app's functions as the worker indexes them (`function_app.app`, imported with the
    process's settings), for calling them directly.

    `app.get_functions()` validates and may run only once per app object, so every
    caller in a process shares one result per app. The worker indexes its own import.
    """
    import function_app

    return _indexed(function_app.app)


@functools.cache
def _indexed(app: func.FunctionApp) -> tuple[Function, ...]:
    return tuple(app.get_functions())


def service_bus_message(sent: SentMessage, *, delivery_count: int = 1, sequence_number: int = 1,
                        lock_token: uuid.UUID | None = None,
                        enqueued_time: datetime | None = None) -> Any:
    """An `azure.servicebus.ServiceBusReceivedMessage` as the worker builds it."""
    content = service_bus_content(sent, lock_token=lock_token or uuid.uuid4(),
                                  delivery_count=delivery_count, sequence_number=sequence_number,
                                  enqueued_time=enqueued_time)
    binding = SimpleNamespace(version=MODEL_BINDING_VERSION, source=SERVICE_BUS_SOURCE,
                              content_type=MODEL_BINDING_CONTENT_TYPE, content=content)
    return ServiceBusConverter.decode(ExtensionDatum(binding, "model_binding_data"),
                                      trigger_metadata={}, pytype=None)


def event_hub_batch(events: list[SentEvent], *, partition_id: str, event_hub: str = "payments",
                    consumer_group: str = "payments-processor") -> list[func.EventHubEvent]:
    """A cardinality-many batch with the trigger metadata the host sends."""
    metadata = event_batch_metadata(events, partition_id=partition_id, event_hub=event_hub,
                                    consumer_group=consumer_group,
                                    namespace="sim.servicebus.windows.net")
    data = meta.Datum(SimpleNamespace(string=[e.body.decode("utf-8") for e in events]),
                      "collection_string")
    decoded = EventHubTriggerConverter.decode(
        data, trigger_metadata={key: meta.Datum(json_text(value), "json")
                                for key, value in metadata.items()})
    return decoded if isinstance(decoded, list) else [decoded]


class RecordingActions:
    """A ServiceBusMessageActions stand-in that records each settlement."""

    def __init__(self) -> None:
        self.settled: list[tuple[str, Any, str | None, str | None]] = []

    def complete(self, message: Any) -> None:
        self.settled.append(("complete", message, None, None))

    def abandon(self, message: Any) -> None:
        self.settled.append(("abandon", message, None, None))

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self.settled.append(("deadletter", message, deadletter_reason, deadletter_error_description))

    @property
    def last(self) -> tuple[str, str | None, str | None]:
        if not self.settled:
            return ("unsettled", None, None)  # the lock runs out; redelivered later
        action, _, reason, description = self.settled[-1]
        return action, reason, description
