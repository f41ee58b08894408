"""Record <-> flat property map, shared by the backends.

Record properties carry an `idem` prefix so a record can live inside a
business entity (the order document that is its own marker) without clashing
with business fields.
"""

from __future__ import annotations

import json
from typing import Any

from shared.jsontext import compact_encoder
from shared.keys import DedupKey
from shared.outbox import (
    PENDING_COUNT,
    PENDING_SINCE,
    POSITION,
    TABLE_CHUNK_CHARS,
    EventPosition,
    decode_pending,
    encode_pending,
)
from shared.records import IdempotencyRecord, RecordState

RESERVED = ("idemConsumer", "idemKey", "idemState", "idemRequestHash", "idemResult",
            "idemCreatedAt", "idemUpdatedAt", "idemExpiresAt", "idemLeaseExpiresAt",
            "idemAttempts", PENDING_COUNT, PENDING_SINCE, POSITION)


_result_json = compact_encoder(allow_nan=True)  # json.dumps(separators=(",", ":"), ensure_ascii=False)


def record_fields(record: IdempotencyRecord, *, chunk_chars: int = TABLE_CHUNK_CHARS) -> dict[str, Any]:
    """The record's properties; its pending outgoing messages (if any) as chunked strings of at
    most `chunk_chars` characters, with the time they became pending (what the sweeper
    queries) or, on a marker of an Event Hubs batch, its event's position instead (pending
    while the partition's mark does not cover it: never the sweeper's)."""
    fields: dict[str, Any] = {
        "idemConsumer": record.key.consumer,
        "idemKey": record.key.key,
        "idemState": record.state.value,
        "idemRequestHash": str(record.request_hash),  # plain text, never a RequestHash (Table SDK)
        "idemResult": _result_json(record.result),
        "idemCreatedAt": float(record.created_at),
        "idemUpdatedAt": float(record.updated_at),
    }
    if record.attempts != 1:  # the first attempt is what an absent count reads as: not written
        fields["idemAttempts"] = int(record.attempts)
    if record.expires_at is not None:
        fields["idemExpiresAt"] = float(record.expires_at)
    if record.lease_expires_at is not None:
        fields["idemLeaseExpiresAt"] = float(record.lease_expires_at)
    if record.outbox:
        fields.update(encode_pending(record.outbox, chunk_chars=chunk_chars))
        if record.outbox_position is None:
            fields[PENDING_SINCE] = float(record.updated_at)
        else:
            fields[POSITION] = record.outbox_position.encode()
    return fields


def pending_names(record: IdempotencyRecord, *, chunk_chars: int = TABLE_CHUNK_CHARS) -> list[str]:
    """The properties `record_fields` wrote for `record`'s pending messages, the count aside:
    what recording them as dispatched removes (or blanks)."""
    if not record.outbox:
        return []
    chunks = [name for name in encode_pending(record.outbox, chunk_chars=chunk_chars)
              if name != PENDING_COUNT]
    return [*chunks, PENDING_SINCE if record.outbox_position is None else POSITION]


def is_record(properties: dict[str, Any]) -> bool:
    return "idemState" in properties and "idemKey" in properties


def record_from_fields(properties: dict[str, Any], *, record_id: str, partition: str,
                       etag: str | None) -> IdempotencyRecord:
    key = DedupKey(properties["idemConsumer"], properties["idemKey"])
    expires = properties.get("idemExpiresAt")
    lease = properties.get("idemLeaseExpiresAt")
    return IdempotencyRecord(
        key=key,
        state=RecordState(properties["idemState"]),
        request_hash=properties["idemRequestHash"],
        result=json.loads(properties.get("idemResult") or "null"),
        created_at=float(properties["idemCreatedAt"]),
        updated_at=float(properties["idemUpdatedAt"]),
        expires_at=float(expires) if expires is not None else None,
        lease_expires_at=float(lease) if lease is not None else None,
        attempts=int(properties.get("idemAttempts", 1)),
        partition=None if partition == key.encoded else partition,
        record_id=None if record_id == key.encoded else record_id,
        etag=etag,
        outbox=(outbox := tuple(decode_pending(properties))),
        outbox_position=EventPosition.decode(properties.get(POSITION)) if outbox else None,
    )


def check_flat(body: dict[str, Any]) -> None:
    """Business bodies must be flat scalars so both backends can store them."""
    for name, value in body.items():
        if isinstance(value, (dict, list, tuple, set)):
            raise ValueError(f"document property {name!r} is nested; store it as JSON text")
        if name in RESERVED:
            raise ValueError(f"document property {name!r} is reserved for the dedup record")
