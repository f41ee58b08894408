"""The trigger helpers: one per Azure Functions trigger (Service Bus, Event Hubs, HTTP, Storage
Queues) and the maintenance timer, each running the flows below it and settling by one rule."""
