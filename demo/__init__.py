"""The demo (`./dev demo`): the delivery simulator's mixed chaos workload on the local stack."""
