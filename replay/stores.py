"""The queries the store interfaces leave to each backend: listing the parking lot, and
finding one dedup key in several partitions.

`shared._flows.parking.ParkingLot.entries` takes a lister (documents of one partition,
or of all); this module builds one for the app's parked store, which is a
Table in every deployment (`functions.settings.TABLE_FOR`) and may be a Cosmos
container in tests. Reads only; errors translated as every store call is.

`scan_reused_keys` reads every record of a store once (Cosmos: one cross-partition query of
its records; Table: a full scan, the only way to filter on a property that is not a key)
and reports each (consumer, key) recorded in more than one partition: a producer that reused
an id for another business entity (a payment event id for another account), which the
per-partition markers cannot refuse. Its cost is counted as it runs: requests, and for Cosmos
the request units the service charged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from azure.data.tables import EntityProperty

from shared._backends import CosmosIdempotencyStore, Document, IdempotencyStore, TableIdempotencyStore
from shared._backends.sdk_requests import store_items
from shared._core import codec
from shared._core.exceptions import InvalidKeyError
from shared._core.records import IdempotencyRecord
from shared._flows.parking import EntryLister

_TABLE_SYSTEM = ("PartitionKey", "RowKey", "Timestamp", "etag")
_COSMOS_SYSTEM = ("_rid", "_self", "_etag", "_attachments", "_ts", "ttl", "id")


def _unwrap(store: IdempotencyStore) -> IdempotencyStore:
    """The real store behind forwarding wrappers (the simulator's fault injectors)."""
    while isinstance(inner := getattr(store, "inner", None), IdempotencyStore):
        store = inner
    return store


def document_lister(store: IdempotencyStore) -> EntryLister:
    """A lister for a Table or Cosmos store; TypeError for anything else."""
    inner = _unwrap(store)
    if isinstance(inner, TableIdempotencyStore):
        client = inner.client

        def table(partition: str | None) -> Iterator[Document]:
            pages = (client.query_entities("PartitionKey eq @pk", parameters={"pk": partition})
                     if partition is not None else client.list_entities())
            for entity in store_items("Table Storage", pages):
                body = {k: v.value if isinstance(v, EntityProperty) else v
                        for k, v in entity.items() if k not in _TABLE_SYSTEM}
                yield Document(entity["RowKey"], entity["PartitionKey"], body,
                               (entity.metadata or {}).get("etag"))

        return table
    if isinstance(inner, CosmosIdempotencyStore):
        container = inner.container

        def cosmos(partition: str | None) -> Iterator[Document]:
            field = container.read()["partitionKey"]["paths"][0].lstrip("/")
            query, parameters = "SELECT * FROM c", []
            if partition is not None:
                query = "SELECT * FROM c WHERE c[@field] = @pk"
                parameters = [{"name": "@field", "value": field}, {"name": "@pk", "value": partition}]
            pages = container.query_items(query, parameters=parameters,
                                          enable_cross_partition_query=True)
            for item in store_items("Cosmos DB", pages):
                hidden = {*_COSMOS_SYSTEM, field} if field == "pk" else set(_COSMOS_SYSTEM)
                body = {k: v for k, v in item.items() if k not in hidden}
                yield Document(item["id"], item.get(field), body, item.get("_etag"))

        return cosmos
    raise TypeError(f"cannot list the documents of a {type(inner).__name__}")


@dataclass(frozen=True)
class ReusedKey:
    """One dedup key recorded in more than one partition: the partitions, with when each
    record was created (epoch seconds), in the order the scan met them."""

    consumer: str
    key: str
    partitions: tuple[tuple[str, float], ...]


@dataclass
class ReuseScan:
    """What scanning one store found, and what it cost."""

    store: str  # "Cosmos DB container <id>" / "Table Storage table <name>"
    records: int = 0
    requests: int = 0  # query pages (Cosmos: plus the partition-key-range reads)
    request_units: float | None = None  # Cosmos: the charge the service billed
    reused: list[ReusedKey] = field(default_factory=list[ReusedKey])

    @property
    def cost(self) -> str:
        if self.request_units is not None:
            return (f"{self.records} record(s) read by a cross-partition query: "
                    f"{self.requests} request(s), {self.request_units:.2f} RU")
        return (f"{self.records} record(s) returned by a full table scan: {self.requests} "
                "request(s) of up to 1,000 entities each")


class _Partitions:
    """Each (consumer, key) seen once, with its first partition; those seen in another
    partition too, with all of theirs. Memory grows with the number of distinct keys."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], tuple[str, float]] = {}
        self.more: dict[tuple[str, str], dict[str, float]] = {}

    def add(self, consumer: str, key: str, partition: str, created: float) -> None:
        name = (consumer, key)
        first = self.first.setdefault(name, (partition, created))
        if first[0] != partition:
            self.more.setdefault(name, {first[0]: first[1]})[partition] = created

    def count(self, record: IdempotencyRecord | None, consumer: str | None,
              scan: ReuseScan) -> None:
        """A row the scan read (what it cost); a marker of the consumer asked about (any, with
        None) is added."""
        if record is None:
            return
        scan.records += 1
        if consumer is None or record.key.consumer == consumer:
            self.add(record.key.consumer, record.key.key, record.partition_key, record.created_at)

    def reused(self) -> list[ReusedKey]:
        return [ReusedKey(consumer, key, tuple(partitions.items()))
                for (consumer, key), partitions in sorted(self.more.items())]


def store_scope(store: IdempotencyStore) -> str:
    """What a store reads: stores of one table or container (several roles) share it."""
    inner = _unwrap(store)
    if isinstance(inner, TableIdempotencyStore):
        return inner.sweep_scope
    if isinstance(inner, CosmosIdempotencyStore):
        return str(inner.container.container_link)
    return f"{type(inner).__name__}@{id(inner)}"


def _record(properties: Any, record_id: str, partition: str) -> IdempotencyRecord | None:
    """The record a row holds, or None when it is not a marker this tool can read."""
    plain = {name: value.value if isinstance(value, EntityProperty) else value  # Table's Int64
             for name, value in properties.items()}
    try:
        return codec.record_from_fields(plain, record_id=record_id, partition=partition, etag=None)
    except (codec.MarkerFormatError, InvalidKeyError):
        return None


def scan_reused_keys(store: IdempotencyStore, *, consumer: str | None = None) -> ReuseScan:
    """Every (consumer, key) with records in more than one partition of `store` (optionally one
    consumer's), with what reading them cost; TypeError for a store that is neither Table nor
    Cosmos."""
    inner = _unwrap(store)
    seen = _Partitions()
    if isinstance(inner, TableIdempotencyStore):
        client = inner.client
        scan = ReuseScan(f"Table Storage table {client.table_name}")
        # Every marker carries its format version (codec.VERSION); the key, the partition and
        # the creation time come from the record the codec reads (no field of its own).
        pages = client.query_entities(f"{codec.VERSION} gt 0").by_page()
        for page in store_items("Table Storage", pages):
            scan.requests += 1
            for entity in page:
                seen.count(_record(entity, str(entity["RowKey"]), str(entity["PartitionKey"])),
                           consumer, scan)
        scan.reused = seen.reused()
        return scan
    if isinstance(inner, CosmosIdempotencyStore):
        container = inner.container
        scan = ReuseScan(f"Cosmos DB container {container.id}", request_units=0.0)

        def charged(pipeline_response: Any) -> None:
            scan.requests += 1
            charge = pipeline_response.http_response.headers.get("x-ms-request-charge")
            scan.request_units = (scan.request_units or 0.0) + float(charge or 0.0)

        # The sweep's query: it filters on the one indexed record field only (the containers
        # index nothing else, infra/core/cosmos.bicep); the rest is read from the documents.
        pages = container.query_items(f"SELECT * FROM c WHERE IS_DEFINED(c.{codec.VERSION})",  # noqa: S608 - a constant field name
                                      enable_cross_partition_query=True,
                                      raw_response_hook=charged)
        field_name = inner.partition_key_field
        for item in store_items("Cosmos DB", pages):
            seen.count(_record(item, str(item["id"]), str(item.get(field_name))), consumer, scan)
        scan.reused = seen.reused()
        return scan
    raise TypeError(f"cannot scan the records of a {type(inner).__name__}")
