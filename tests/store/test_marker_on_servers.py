"""The marker format on Azurite and the Cosmos server: the request hash round-trips as the
43-character text `request_hash` gives, the stored item holds the version-1 fields only, and
a marker of a version this library does not know is refused by every read."""

from __future__ import annotations

from typing import Any

import pytest
from azure.data.tables import EdmType, EntityProperty

from shared import DedupKey, request_hash
from shared._backends import CosmosIdempotencyStore, TableIdempotencyStore
from shared._core.codec import EXPIRES, HASH, VERSION, WRITTEN, MarkerFormatError
from shared._core.records import IdempotencyRecord, RecordState

NOW = 1_800_000_000.0
PAYLOAD = {"type": "payment.credit", "accountId": "acct-1", "amountCents": 1200}


def marker(name: str) -> IdempotencyRecord:
    return IdempotencyRecord(DedupKey.from_cloudevent("payments", "/src", name),
                             RecordState.COMPLETED, request_hash(PAYLOAD), NOW, NOW,
                             expires_at=NOW + 604_800, result={"balanceCents": 1200},
                             partition="acct-1")


def raw_item(store: Any, record: IdempotencyRecord) -> dict[str, Any]:
    """The stored entity or item itself, through the SDK (system properties dropped)."""
    if isinstance(store, TableIdempotencyStore):
        entity = store.client.get_entity(record.partition_key, record.id)
        return {k: getattr(v, "value", v) for k, v in entity.items()
                if k not in ("PartitionKey", "RowKey")}
    assert isinstance(store, CosmosIdempotencyStore)
    item = store.container.read_item(record.id, record.partition_key)
    return {k: v for k, v in item.items() if not k.startswith("_") and k not in ("id", "pk")}


def write_raw(store: Any, record: IdempotencyRecord, fields: dict[str, Any]) -> None:
    if isinstance(store, TableIdempotencyStore):
        typed = {name: EntityProperty(value, EdmType.INT64) if type(value) is int and value >= 2**31
                 else value for name, value in fields.items()}
        store.client.create_entity({**typed, "PartitionKey": record.partition_key,
                                    "RowKey": record.id})
    else:
        store.container.create_item({**fields, "id": record.id, "pk": record.partition_key})


def test_the_request_hash_round_trips_as_request_hash_gives_it(store):
    put = store.put_record_if_absent(marker("hash"))
    got = store.get_record(put.partition_key, put.id)
    assert got is not None and got.request_hash == request_hash(PAYLOAD) == put.request_hash
    stored = raw_item(store, put)
    assert stored[HASH] == request_hash(PAYLOAD) and len(stored[HASH]) == 43
    assert got == marker("hash")  # every field as written


def test_a_stored_marker_holds_the_version_1_fields_only(store):
    put = store.put_record_if_absent(marker("fields"))
    stored = raw_item(store, put)
    names = {name for name in stored if name not in ("ttl", "Timestamp", "etag")}
    if isinstance(store, CosmosIdempotencyStore):  # the result as JSON; iT from iX and ttl
        assert names == {VERSION, HASH, EXPIRES, "iJ"} and stored["ttl"] == 604_800
    else:
        assert names == {VERSION, HASH, WRITTEN, EXPIRES, "iR"}
        assert stored[WRITTEN] == 1_800_000_000_000  # integer milliseconds (Edm.Int64)
    assert stored[VERSION] == 1 and stored[EXPIRES] == 1_800_604_800_000


@pytest.mark.parametrize("version", [2, 99])
def test_a_marker_of_an_unknown_version_is_refused_by_every_read(store, version):
    record = marker(f"v{version}")
    write_raw(store, record, {VERSION: version, HASH: request_hash(PAYLOAD),
                              WRITTEN: 1_800_000_000_000, EXPIRES: 1_800_604_800_000})
    with pytest.raises(MarkerFormatError, match=f"format version {version!r}"):
        store.get_record(record.partition_key, record.id)
    with pytest.raises(MarkerFormatError):
        list(store.iter_records())
    with pytest.raises(MarkerFormatError):  # the sweep meets it: it fails loudly, not skips
        list(store.iter_records(expired_before=NOW + 10**7))
