"""The local stack for the demo and the chaos tests, with HTTP keep-alive on the Cosmos server.

`local_stack.LocalStack` starts the Cosmos-compatible server through the
project's launcher (`tools/cosmos-server/launch.js`), whose server closes
every connection after one response; each request then pays a new TCP + TLS
handshake, and the Python SDK rebuilds its certificate store for it (about
45 ms a request here, against about 4 ms with keep-alive). The harness starts
the same launcher module (its handler patches included) with keep-alive on.
"""

from __future__ import annotations

from local_stack import COSMOS_LOCAL_KEY, LocalStack
from local_stack.servers import ServerProcess
from simulator.scenario import Endpoints

_KEEP_ALIVE = (
    "const launcher = require('./tools/cosmos-server/launch.js'); launcher.install();"
    "const { createHttpsServer } = require('@vercel/cosmosdb-server');"
    "createHttpsServer({ keepAlive: true }).listen({port}, '127.0.0.1');"
)


def local_stack(*, keep_alive: bool = True) -> LocalStack:
    """A LocalStack (not started) whose Cosmos server keeps connections alive."""
    stack = LocalStack()
    if keep_alive:
        script = _KEEP_ALIVE.replace("{port}", str(stack.cosmos_port))
        stack.cosmos = ServerProcess("cosmos-server", ["node", "-e", script], stack.cosmos_port)
    return stack


def endpoints(stack: LocalStack) -> Endpoints:
    """Endpoints of a started stack, with its processes (the harness may pause them)."""
    processes = {name: server.proc.pid for name, server in (("azurite", stack.azurite),
                                                             ("cosmos", stack.cosmos))
                 if server.proc is not None}
    return Endpoints(table_connection_string=stack.table_connection_string,
                     cosmos_endpoint=stack.cosmos_endpoint, cosmos_key=COSMOS_LOCAL_KEY,
                     cosmos_verify=False, processes=processes)
