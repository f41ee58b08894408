"""The library's async variants, under the names of the sync ones (as the Azure SDK does): each
runs the same flows as its sync namesake, awaited, so an `async def` function keeps its event
loop free while Cosmos DB, Table Storage or Service Bus answer. Stores here are the async SDKs'
(`azure.cosmos.aio`, `azure.data.tables.aio`); `ThreadedStore` (from `shared.testing`) puts a
sync store behind the async interface (a test double, a backend with no async SDK); the
in-memory store for tests is `shared.testing.AsyncInMemoryIdempotencyStore`.
"""

from __future__ import annotations

from shared.backends.cosmos_aio import AsyncCosmosIdempotencyStore as CosmosIdempotencyStore
from shared.backends.dispatch_aio import EventHubDispatcher, ServiceBusDispatcher
from shared.backends.sdk_transport import async_transport as sdk_transport
from shared.backends.table_aio import AsyncTableIdempotencyStore as TableIdempotencyStore
from shared.flows.batch import AsyncPartitionBatchProcessor as PartitionBatchProcessor
from shared.flows.drivers import AsyncStore
from shared.flows.drivers import AsyncTransaction as Transaction
from shared.flows.drivers import update_document_async as update_document
from shared.flows.idempotency import AsyncIdempotency as Idempotency
from shared.flows.parking import AsyncParkingLot as ParkingLot
from shared.flows.watermark import AsyncPartitionWatermark as PartitionWatermark
from shared.testing import ThreadedStore
from shared.triggers.eventhubs import AsyncEventHubConsumer as EventHubConsumer
from shared.triggers.http import AsyncIdempotencyKeyEndpoint as IdempotencyKeyEndpoint
from shared.triggers.queues import AsyncStorageQueueConsumer as StorageQueueConsumer
from shared.triggers.servicebus import AsyncServiceBusConsumer as ServiceBusConsumer

__all__ = ["AsyncStore", "CosmosIdempotencyStore", "EventHubConsumer", "EventHubDispatcher",
           "Idempotency", "IdempotencyKeyEndpoint", "ParkingLot",
           "PartitionBatchProcessor", "PartitionWatermark", "ServiceBusConsumer",
           "ServiceBusDispatcher", "StorageQueueConsumer", "TableIdempotencyStore",
           "ThreadedStore", "Transaction", "sdk_transport", "update_document"]
