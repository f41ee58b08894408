"""At-least-once delivery simulator: reproduces Service Bus and Event Hubs delivery
semantics locally and drives the real registered functions (a test and demo
harness, not a runtime; in production the brokers and the Functions host do this)."""
