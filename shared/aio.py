"""The library's async variants, under the names of the sync ones (as the Azure SDK does): each
runs the same flows as its sync namesake, awaited, so an `async def` function keeps its event
loop free while Cosmos DB, Table Storage or Service Bus answer. Stores here are the async SDKs'
(`azure.cosmos.aio`, `azure.data.tables.aio`); `ThreadedStore` (from `shared.testing`) puts a
sync store behind the async interface (a test double, a backend with no async SDK); the
in-memory store for tests is `shared.testing.AsyncInMemoryIdempotencyStore`.
"""

from __future__ import annotations

from shared._backends.cosmos_aio import AsyncCosmosIdempotencyStore as CosmosIdempotencyStore
from shared._backends.dispatch_aio import EventHubDispatcher, ServiceBusDispatcher
from shared._backends.sdk_transport import async_transport as sdk_transport
from shared._backends.table_aio import AsyncTableIdempotencyStore as TableIdempotencyStore
from shared._flows.batch import AsyncPartitionBatchProcessor as PartitionBatchProcessor
from shared._flows.drivers import AsyncStore
from shared._flows.drivers import AsyncTransaction as Transaction
from shared._flows.drivers import update_document_async as update_document
from shared._flows.idempotency import AsyncIdempotency as Idempotency
from shared._flows.parking import AsyncParkingLot as ParkingLot
from shared._flows.watermark import AsyncPartitionWatermark as PartitionWatermark
from shared._triggers.eventhubs import AsyncEventHubConsumer as EventHubConsumer
from shared._triggers.http import AsyncIdempotencyKeyEndpoint as IdempotencyKeyEndpoint
from shared._triggers.queues import AsyncStorageQueueConsumer as StorageQueueConsumer
from shared._triggers.servicebus import AsyncServiceBusConsumer as ServiceBusConsumer
from shared.testing import ThreadedStore

__all__ = ["AsyncStore", "CosmosIdempotencyStore", "EventHubConsumer", "EventHubDispatcher",
           "Idempotency", "IdempotencyKeyEndpoint", "ParkingLot",
           "PartitionBatchProcessor", "PartitionWatermark", "ServiceBusConsumer",
           "ServiceBusDispatcher", "StorageQueueConsumer", "TableIdempotencyStore",
           "ThreadedStore", "Transaction", "sdk_transport", "update_document"]
