"""Async dispatchers (`azure.servicebus.aio`, `azure.eventhub.aio`): the same names, awaited.

Message building, grouping and error translation are `shared._backends.dispatch`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any

from shared._backends.dispatch import (
    EventHubProducers,
    ServiceBusSenders,
    by_destination,
    by_partition_key,
    event_data,
    send_plan,
    service_bus_message,
    translate_event_hub_error,
    translate_service_bus_error,
)
from shared._core.outbox import OutgoingMessage


class ServiceBusDispatcher(ServiceBusSenders):
    """`shared._backends.dispatch.ServiceBusDispatcher` on `azure.servicebus.aio` (an async
    credential in Azure)."""

    @staticmethod
    def _client_class() -> Any:
        from azure.servicebus.aio import ServiceBusClient

        return ServiceBusClient

    async def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        for destination, group in by_destination(messages):
            try:
                sender = self._take(destination)
                try:
                    for send in send_plan(group):
                        await sender.send_messages([service_bus_message(m) for m in send])
                except BaseException:
                    with contextlib.suppress(Exception):
                        await sender.close()
                    raise
                self._give_back(destination, sender)
            except Exception as error:
                raise translate_service_bus_error(error, destination) from error

    async def close(self) -> None:
        for sender in self._drain():
            with contextlib.suppress(Exception):
                await sender.close()
        if self._owned:
            await self._client.close()


class EventHubDispatcher(EventHubProducers):
    """`shared._backends.dispatch.EventHubDispatcher` on `azure.eventhub.aio`."""

    @staticmethod
    def _producer_class() -> Any:
        from azure.eventhub.aio import EventHubProducerClient

        return EventHubProducerClient

    async def dispatch(self, messages: Sequence[OutgoingMessage]) -> None:
        for destination, group in by_destination(messages):
            try:
                producer = self._producer(destination)
                for partition_key, part in by_partition_key(group):
                    await producer.send_batch([event_data(m) for m in part], partition_key=partition_key)
            except Exception as error:
                raise translate_event_hub_error(error, destination) from error

    async def close(self) -> None:
        if self._owned:
            closing: list[Awaitable[Any]] = [p.close() for p in self._producers.values()]
            await asyncio.gather(*closing)
        self._producers.clear()
