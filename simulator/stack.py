"""Local servers for the demo and the chaos tests: one set per scenario, started by the harness.

Why not one `local_stack.LocalStack` shared by everything: the app's table
names are fixed (`dedup`, `parked`, ...) and its maintenance reconciles whole
stores, so two scenarios running at once on one Azurite would close each
other's in-progress records. Each backend's scenario gets its own servers (the
table backend only needs Azurite), started through `local_stack.servers` (the
Cosmos server through the project's launcher, keep-alive on). The harness
started them, so it may also pause them for outages.
"""

from __future__ import annotations

from local_stack import AZURITE_ACCOUNT, AZURITE_KEY, COSMOS_LOCAL_KEY, free_port
from local_stack.servers import azurite_tables, cosmos_server
from simulator.scenario import Endpoints


class SimStack:
    """Azurite (always) and the Cosmos server (with `cosmos=True`), on free loopback ports.

        with SimStack(cosmos=True) as endpoints:
            run_scenario(config, endpoints)
    """

    def __init__(self, *, cosmos: bool = True) -> None:
        self.azurite = azurite_tables(free_port())
        self.cosmos = cosmos_server(free_port()) if cosmos else None

    @property
    def endpoints(self) -> Endpoints:
        table = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
                 f"AccountKey={AZURITE_KEY};"
                 f"TableEndpoint=http://127.0.0.1:{self.azurite.port}/{AZURITE_ACCOUNT};")
        processes = {"azurite": self.azurite.proc.pid} if self.azurite.proc else {}
        cosmos_endpoint = ""
        if self.cosmos is not None:
            cosmos_endpoint = f"https://127.0.0.1:{self.cosmos.port}/"
            if self.cosmos.proc is not None:
                processes["cosmos"] = self.cosmos.proc.pid
        return Endpoints(table_connection_string=table, cosmos_endpoint=cosmos_endpoint,
                         cosmos_key=COSMOS_LOCAL_KEY, cosmos_verify=False, processes=processes)

    def __enter__(self) -> Endpoints:
        self.azurite.start()
        if self.cosmos is not None:
            try:
                self.cosmos.start()
            except BaseException:
                self.azurite.stop()
                raise
        return self.endpoints

    def __exit__(self, *exc: object) -> None:
        if self.cosmos is not None:
            self.cosmos.stop()
        self.azurite.stop()


def stack_for(backend: str) -> SimStack:
    """The servers a backend's scenario needs: Azurite, plus the Cosmos server for cosmos."""
    return SimStack(cosmos=backend == "cosmos")
