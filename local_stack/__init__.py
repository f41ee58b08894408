"""Start and stop the local servers the tests and the demo run against.

Azurite (Table Storage) and the Cosmos DB-compatible server, both from
`node_modules`, bound to loopback only. Nothing here is used by the function
app at runtime.
"""

from local_stack.servers import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    COSMOS_LOCAL_KEY,
    LocalStack,
    ServerProcess,
    free_port,
)

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "COSMOS_LOCAL_KEY",
    "LocalStack",
    "ServerProcess",
    "free_port",
]
