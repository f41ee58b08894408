"""Producer CLI for real brokers (Docker emulators or Azure): `python -m producer --help`.

Sends the simulator's workload (orders with MessageId = order id, order status
events, topic notifications, payment CloudEvents) with `azure-servicebus` and
`azure-eventhub`, optionally with producer-retry duplicates, and writes what
it sent to a ledger that `python -m simulator.check --sent` verifies.
"""
