"""The library's async variants, under the names of the sync ones (as the Azure SDK does): each
runs the same flows as its sync namesake, awaited, so an `async def` function keeps its event
loop free while Cosmos DB, Table Storage or Service Bus answer. Stores here are the async SDKs'
(`azure.cosmos.aio`, `azure.data.tables.aio`); `ThreadedStore` (from `shared.testing`) puts a
sync store behind the async interface (a test double, a backend with no async SDK); the
in-memory store for tests is `shared.testing.AsyncInMemoryIdempotencyStore`.
"""

from __future__ import annotations

from shared.batch import AsyncPartitionBatchProcessor as PartitionBatchProcessor
from shared.dispatch_aio import EventHubDispatcher, ServiceBusDispatcher
from shared.drivers import AsyncStore
from shared.drivers import AsyncTransaction as Transaction
from shared.eventhubs import AsyncEventHubConsumer as EventHubConsumer
from shared.http import AsyncIdempotencyKeyEndpoint as IdempotencyKeyEndpoint
from shared.idempotency import AsyncIdempotency as Idempotency
from shared.parking import AsyncParkingLot as ParkingLot
from shared.queues import AsyncStorageQueueConsumer as StorageQueueConsumer
from shared.stores.cosmos_aio import AsyncCosmosIdempotencyStore as CosmosIdempotencyStore
from shared.stores.table_aio import AsyncTableIdempotencyStore as TableIdempotencyStore
from shared.testing import ThreadedStore
from shared.triggers import AsyncServiceBusConsumer as ServiceBusConsumer
from shared.watermark import AsyncPartitionWatermark as PartitionWatermark

__all__ = ["AsyncStore", "CosmosIdempotencyStore", "EventHubConsumer", "EventHubDispatcher",
           "Idempotency", "IdempotencyKeyEndpoint", "ParkingLot",
           "PartitionBatchProcessor", "PartitionWatermark", "ServiceBusConsumer",
           "ServiceBusDispatcher", "StorageQueueConsumer", "TableIdempotencyStore",
           "ThreadedStore", "Transaction"]
