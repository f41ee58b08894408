"""The data and rules everything else builds on: errors, records, key rules, the marker format,
the store steps, the outbox, settlement and telemetry. They import nothing above them."""
