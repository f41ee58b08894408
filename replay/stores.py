"""Listing the parking lot: the one query the store interfaces leave to each backend.

`shared.parking.ParkingLot.entries` takes a lister (documents of one partition,
or of all); this module builds one for the app's parked store, which is a
Table in every deployment (`functions.settings.TABLE_FOR`) and may be a Cosmos
container in tests. Reads only; errors translated as every store call is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from azure.data.tables import EntityProperty

from shared.parking import EntryLister
from shared.stores import CosmosIdempotencyStore, Document, IdempotencyStore, TableIdempotencyStore
from shared.stores.base import store_call

_TABLE_SYSTEM = ("PartitionKey", "RowKey", "Timestamp", "etag")
_COSMOS_SYSTEM = ("_rid", "_self", "_etag", "_attachments", "_ts", "ttl", "id")


def _unwrap(store: IdempotencyStore) -> IdempotencyStore:
    """The real store behind forwarding wrappers (the simulator's fault injectors)."""
    while isinstance(inner := getattr(store, "inner", None), IdempotencyStore):
        store = inner
    return store


def _drain(backend: str, pages: Any) -> Iterator[Any]:
    iterator = iter(pages)
    while True:
        try:
            yield store_call(backend, lambda: next(iterator))
        except StopIteration:
            return


def document_lister(store: IdempotencyStore) -> EntryLister:
    """A lister for a Table or Cosmos store; TypeError for anything else."""
    inner = _unwrap(store)
    if isinstance(inner, TableIdempotencyStore):
        client = inner.client

        def table(partition: str | None) -> Iterator[Document]:
            pages = (client.query_entities("PartitionKey eq @pk", parameters={"pk": partition})
                     if partition is not None else client.list_entities())
            for entity in _drain("Table Storage", pages):
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
            for item in _drain("Cosmos DB", pages):
                hidden = {*_COSMOS_SYSTEM, field} if field == "pk" else set(_COSMOS_SYSTEM)
                body = {k: v for k, v in item.items() if k not in hidden}
                yield Document(item["id"], item.get(field), body, item.get("_etag"))

        return cosmos
    raise TypeError(f"cannot list the documents of a {type(inner).__name__}")
