"""Latency mode's network: endpoints through the relays, and the check that the RTT is there.

For each RTT, one relay (`local_stack.relay`, a child process) runs in front of
Azurite's table port and one in front of the Cosmos server. The added RTT is
checked with point reads of one document, directly and through the relay,
alternated, before and after the RTT's scenarios; a run whose relayed reads were
not slower by at least half the nominal RTT stops. Every Cosmos client here and
in the runner has endpoint discovery off: the local server advertises its own
address, and with discovery on the SDK would send its requests there, around
the relay, adding nothing and saying nothing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from azure.cosmos import CosmosClient, PartitionKey
from azure.data.tables import TableClient, TableServiceClient

from benchmarks.counting import Endpoints, pooled_transport

_TABLE_ENDPOINT = re.compile(r"(TableEndpoint=https?://)([^:/;]+):(\d+)")


class RttNotVerifiedError(RuntimeError):
    """The point reads through a relay were not slower by the RTT it should add."""


@dataclass
class Probe:
    """Median point-read latency without and with the relay (what the reports show), and the
    fastest read of each (what the check compares: a loaded machine slows both medians, but
    no read through the relay is faster than the relay's own delay)."""

    backend: str
    nominal_ms: float
    direct_ms: float
    relayed_ms: float
    reads: int
    when: str = "before"  # the scenarios of this RTT: checked before and after them
    direct_min_ms: float | None = None
    relayed_min_ms: float | None = None

    @property
    def added_ms(self) -> float:
        return self.relayed_ms - self.direct_ms

    @property
    def floor_added_ms(self) -> float:
        """The fastest relayed read less the fastest direct one (the medians' when not known)."""
        if self.direct_min_ms is None or self.relayed_min_ms is None:
            return self.added_ms
        return self.relayed_min_ms - self.direct_min_ms


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def table_port(connection_string: str) -> int:
    match = _TABLE_ENDPOINT.search(connection_string)
    if match is None or not _loopback(match.group(2)):
        raise ValueError("latency mode needs the local Azurite (a loopback TableEndpoint)")
    return int(match.group(3))


def cosmos_port(endpoint: str) -> int:
    parts = urlsplit(endpoint)
    if not parts.hostname or not _loopback(parts.hostname) or parts.port is None:
        raise ValueError("latency mode needs the local Cosmos server (a loopback endpoint)")
    return parts.port


def relayed_endpoints(direct: Endpoints, table_relay_port: int, cosmos_relay_port: int) -> Endpoints:
    table = _TABLE_ENDPOINT.sub(lambda m: f"{m.group(1)}127.0.0.1:{table_relay_port}",
                                direct.table_connection_string)
    parts = urlsplit(direct.cosmos_endpoint)
    cosmos = urlunsplit((parts.scheme, f"127.0.0.1:{cosmos_relay_port}", parts.path or "/",
                         parts.query, parts.fragment))
    return Endpoints(table, cosmos, direct.cosmos_key, direct.cosmos_verify)


def cosmos_client(endpoints: Endpoints, **options: Any) -> CosmosClient:
    """A plain client: endpoint discovery off (see the module docstring)."""
    return CosmosClient(endpoints.cosmos_endpoint, endpoints.cosmos_key,
                        connection_verify=endpoints.cosmos_verify, enable_endpoint_discovery=False,
                        **options)


def _timed_reads(readers: list[Callable[[], Any]], reads: int) -> list[tuple[float, float]]:
    """Alternates the readers (so drift hits all alike); (median, fastest) milliseconds of each."""
    for read in readers:  # connections, caches
        for _ in range(3):
            read()
    samples: list[list[float]] = [[] for _ in readers]
    for _ in range(reads):
        for index, read in enumerate(readers):
            started = time.perf_counter()
            read()
            samples[index].append((time.perf_counter() - started) * 1000)
    return [(statistics.median(s), min(s)) for s in samples]


def probe_rtt(direct: Endpoints, relayed: Endpoints, nominal_ms: float, *, reads: int,
              backends: tuple[str, ...], when: str = "before") -> list[Probe]:
    """Point reads of one small document, directly and through the relay."""
    probes = []
    if "table" in backends:
        name = f"probe{uuid.uuid4().hex[:12]}"
        service = TableServiceClient.from_connection_string(direct.table_connection_string)
        service.create_table(name)
        clients = [TableClient.from_connection_string(e.table_connection_string, name,
                                                      transport=pooled_transport(4))
                   for e in (direct, relayed)]
        try:
            clients[0].create_entity({"PartitionKey": "p", "RowKey": "r", "v": 1})
            fast, slow = _timed_reads([lambda c=c: c.get_entity("p", "r") for c in clients], reads)
            probes.append(Probe("table", nominal_ms, fast[0], slow[0], reads, when, fast[1], slow[1]))
        finally:
            for client in clients:
                client.close()
            with contextlib.suppress(Exception):
                service.delete_table(name)
    if "cosmos" in backends:
        database = f"probe-{uuid.uuid4().hex[:8]}"
        cosmos = [cosmos_client(e, transport=pooled_transport(4, verify=e.cosmos_verify))
                  for e in (direct, relayed)]
        try:
            created = cosmos[0].create_database_if_not_exists(database)
            created.create_container("c", PartitionKey("/pk")).create_item({"id": "r", "pk": "p"})
            containers = [c.get_database_client(database).get_container_client("c") for c in cosmos]
            fast, slow = _timed_reads([lambda c=c: c.read_item("r", "p") for c in containers], reads)
            probes.append(Probe("cosmos", nominal_ms, fast[0], slow[0], reads, when, fast[1], slow[1]))
        finally:
            with contextlib.suppress(Exception):
                cosmos[0].delete_database(database)
            for client in cosmos:
                client.close()
    return probes


def check_probes(probes: list[Probe]) -> None:
    """Raises `RttNotVerifiedError` when the fastest relayed read was not slower than the
    fastest direct one by half the nominal RTT."""
    for probe in probes:
        if probe.nominal_ms > 0 and probe.floor_added_ms < 0.5 * probe.nominal_ms:
            raise RttNotVerifiedError(
                f"{probe.backend}: point reads through the relay were only {probe.floor_added_ms:.2f} ms "
                f"slower than direct ones (expected about {probe.nominal_ms:g} ms): the client is "
                "not going through the relay (Cosmos: endpoint discovery must be off)")
