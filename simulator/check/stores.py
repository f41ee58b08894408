"""The stores the checks read, by role, and how to read all of one (or a run's partitions)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from azure.data.tables import EntityProperty

from shared._backends import CosmosIdempotencyStore, TableIdempotencyStore
from shared._backends.memory import InMemoryIdempotencyStore
from shared._core import codec
from shared._core.records import IdempotencyRecord
from shared._core.store import IdempotencyStore
from simulator.faults import innermost

Row = dict[str, Any]  # an entity or document, flattened, with `_id` and `_partition`


@dataclass
class Stores:
    """The stores to read, by role (the app's wiring; see functions.services)."""

    orders: IdempotencyStore
    order_status: IdempotencyStore
    ledger: IdempotencyStore
    notifications: IdempotencyStore
    parked: IdempotencyStore
    records: dict[str, IdempotencyStore] = field(default_factory=dict)  # for the in-progress check
    by_role: dict[str, IdempotencyStore] = field(default_factory=dict)  # every role the app wires


def _successor(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def scan(store: IdempotencyStore, partition_prefix: str | None = None) -> list[Row]:
    """Every entity/document of a store (whose partition starts with a prefix), flattened.

    Each row gets `_id` and `_partition` besides its own properties.
    """
    inner = innermost(store)
    rows = []
    if isinstance(inner, TableIdempotencyStore):
        if partition_prefix:
            entities = inner.client.query_entities(
                "PartitionKey ge @lo and PartitionKey lt @hi",
                parameters={"lo": partition_prefix, "hi": _successor(partition_prefix)})
        else:
            entities = inner.client.list_entities()
        for entity in entities:
            rows.append({**dict(entity), "_id": entity["RowKey"], "_partition": entity["PartitionKey"]})
        return rows
    if isinstance(inner, CosmosIdempotencyStore):
        container = inner.container
        field_name = container.read()["partitionKey"]["paths"][0].lstrip("/")
        if partition_prefix:
            items = container.query_items(
                f"SELECT * FROM c WHERE STARTSWITH(c.{field_name}, @p)",  # noqa: S608 - path from metadata
                parameters=[{"name": "@p", "value": partition_prefix}],
                enable_cross_partition_query=True)
        else:
            items = container.query_items("SELECT * FROM c", enable_cross_partition_query=True)
        for item in items:
            rows.append({**item, "_id": item["id"], "_partition": item.get(field_name)})
        return rows
    if isinstance(inner, InMemoryIdempotencyStore):  # unit tests of the checks
        with inner._lock:  # the test double keeps its rows private; read them as they are
            stored = list(inner._rows.items())
        return [{**dict(properties), "_id": row_id, "_partition": partition}
                for (partition, row_id), (properties, _) in stored
                if not partition_prefix or partition.startswith(partition_prefix)]
    raise TypeError(f"cannot scan a {type(inner).__name__}")


def store_identity(store: IdempotencyStore) -> str:
    """Which table or container a store reads (two roles may share one)."""
    inner = innermost(store)
    if isinstance(inner, TableIdempotencyStore):
        return f"table:{inner.client.url}:{inner.client.table_name}"
    if isinstance(inner, CosmosIdempotencyStore):
        return f"cosmos:{inner.container.container_link}"
    return f"{type(inner).__name__}:{id(inner)}"


def is_record(row: Row) -> bool:
    """A dedup record (marker), as opposed to a business entity or document."""
    return codec.is_record(row)


def marker_of(row: Row) -> IdempotencyRecord | None:
    """The dedup record a row holds, read as the stores read it (shared._core.codec); None
    for a business entity or document."""
    if not codec.is_record(row):
        return None
    plain = {name: value.value if isinstance(value, EntityProperty) else value
             for name, value in row.items()}
    return codec.record_from_fields(plain, record_id=str(row["_id"]),
                                    partition=str(row["_partition"]), etag=None)


def stores_of(stores: dict[str, IdempotencyStore]) -> Stores:
    """Roles of the app's stores (names as in `functions.settings.STORE_ROLES`)."""
    records = {name: stores[name] for name in ("dedup", "ledger", "notifications", "orders")}
    return Stores(orders=stores["orders"], order_status=stores["order-status"],
                  ledger=stores["ledger"], notifications=stores["notifications"],
                  parked=stores["parked"], records=records, by_role=dict(stores))


def stores_from_settings(env: dict[str, str] | None = None) -> tuple[Stores, str]:
    """The app's stores, built from its settings exactly as the app builds them."""
    from functions.services import build_services
    from functions.settings import Settings

    settings = Settings.from_env(env if env is not None else dict(os.environ))
    services = build_services(settings)
    return stores_of(services.stores), settings.payments_hub
