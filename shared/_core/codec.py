"""Record <-> flat property map (the marker format), shared by the backends.

A marker carries only what the flows read, in short property names (the constants below; the
table of what each holds and when it is written is docs/stores.md#the-marker). A marker may
live inside a business entity (the order document that is its own marker), so the names are
reserved there (`check_flat`). Times are epoch milliseconds; a default value is not written.

On Cosmos DB the result, messages and position are JSON values (`native_json`), and iT is
left out when iX and the item's `ttl` give it (iT = iX - 1000 * ttl).

The id is the key's encoding (`DedupKey.encoded`), from which the key reads back; only another
id or a hashed long key makes the marker carry `iK`. The reader dispatches on `iV` and refuses
a version it does not know (`MarkerFormatError`): a change to any field, or to the request
hash's algorithm, is a new version, read next to the old ones for as long as such markers live.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from shared._core.exceptions import IdempotencyError
from shared._core.jsontext import compact_encoder
from shared._core.keys import DedupKey
from shared._core.outbox import (
    PENDING_SINCE,
    POSITION,
    TABLE_CHUNK_CHARS,
    EventPosition,
    decode_pending,
    encode_pending,
    is_pending_field,
    pending_chunk_names,
)
from shared._core.records import IdempotencyRecord, RecordState

FORMAT_VERSION = 1
VERSION = "iV"  # always: what makes an entity a marker
HASH = "iH"  # the request hash, always
WRITTEN = "iT"  # when last written
CREATED = "iC"  # when first written, if not iT
EXPIRES = "iX"
STATE = "iS"  # "in_progress"; absent: completed
LEASE = "iL"  # while in progress
ATTEMPTS = "iN"  # when not 1
RESULT = "iR"  # JSON text (Table Storage)
RESULT_VALUE = "iJ"  # the JSON value (Cosmos DB)
KEY = "iK"  # "consumer|key", where the id cannot give it
# Cosmos DB's per-item time to live, in seconds after the last write.
NATIVE_TTL = "ttl"
# The properties that hold epoch milliseconds (beyond Int32: Table Storage types them Int64).
TIME_FIELDS = (WRITTEN, CREATED, EXPIRES, LEASE, PENDING_SINCE)
RESERVED = frozenset({VERSION, HASH, WRITTEN, CREATED, EXPIRES, STATE, LEASE, ATTEMPTS, RESULT,
                      RESULT_VALUE, KEY, PENDING_SINCE, POSITION})
_KEY_SEPARATOR = "|"  # never in a consumer name

_result_json = compact_encoder(allow_nan=True)


class MarkerFormatError(IdempotencyError, ValueError):
    """A stored marker this library cannot read: an unknown format version (a newer library
    wrote it) or a marker without the fields its version requires."""


def millis(seconds: float) -> int:
    """Epoch seconds as the integer milliseconds a marker stores."""
    return round(seconds * 1000)


_UNBOUNDED_MILLIS = 2**62  # beyond every stored time, within Int64 (Table Storage's Edm.Int64)


def bound_millis(seconds: float) -> int:
    """A query's time bound in milliseconds; an infinite one (everything) as an Int64."""
    if math.isinf(seconds):
        return _UNBOUNDED_MILLIS if seconds > 0 else -_UNBOUNDED_MILLIS
    return millis(seconds)


def record_fields(record: IdempotencyRecord, *, native_json: bool = False,
                  chunk_chars: int = TABLE_CHUNK_CHARS, written_id: str | None = None
                  ) -> dict[str, Any]:
    """The record's properties in the current format. Pending messages go in chunks of at most
    `chunk_chars`, with the time they became pending (the sweeper's query) or a batch marker's
    event position. `native_json`: the result, messages and position as JSON values, not text.
    `written_id`: the id the marker is written under when not `record.id` (a further marker of
    a group commit), so the key is stored where that id cannot give it."""
    written = millis(record.updated_at)
    fields: dict[str, Any] = {VERSION: FORMAT_VERSION, HASH: record.request_hash, WRITTEN: written}
    created = millis(record.created_at)
    if created != written:
        fields[CREATED] = created
    if record.expires_at is not None:
        fields[EXPIRES] = millis(record.expires_at)
    if record.state is not RecordState.COMPLETED:
        fields[STATE] = record.state.value
    if record.lease_expires_at is not None:
        fields[LEASE] = millis(record.lease_expires_at)
    if record.attempts != 1:  # the first attempt is what an absent count reads as
        fields[ATTEMPTS] = int(record.attempts)
    if record.result is not None:
        if native_json:
            fields[RESULT_VALUE] = record.result
        else:
            fields[RESULT] = _result_json(record.result)
    key = record.key
    if (written_id or record.id) != key.encoded or key.hashed:
        fields[KEY] = f"{key.consumer}{_KEY_SEPARATOR}{key.key}"
    if record.outbox:
        fields.update(encode_pending(record.outbox, key=key,
                                     chunk_chars=None if native_json else chunk_chars))
        if record.outbox_position is None:
            fields[PENDING_SINCE] = written
        elif native_json:
            fields[POSITION] = record.outbox_position.to_list()
        else:
            fields[POSITION] = record.outbox_position.encode()
    return fields


def pending_names(record: IdempotencyRecord, *, native_json: bool = False,
                  chunk_chars: int = TABLE_CHUNK_CHARS) -> list[str]:
    """The properties `record_fields` wrote for `record`'s pending messages (what recording
    them as dispatched removes or blanks)."""
    if not record.outbox:
        return []
    chunks = (pending_chunk_names(1) if native_json  # one JSON value
              else list(encode_pending(record.outbox, key=record.key, chunk_chars=chunk_chars)))
    return [*chunks, PENDING_SINCE if record.outbox_position is None else POSITION]


def is_record(properties: Mapping[str, Any]) -> bool:
    """Whether an entity or document is a marker (of any format version)."""
    return VERSION in properties


def record_from_fields(properties: Mapping[str, Any], *, record_id: str, partition: str,
                       etag: str | None) -> IdempotencyRecord:
    """The record a marker's properties hold, by the reader of its format version."""
    version = properties.get(VERSION)
    reader = _READERS.get(version) if type(version) is int else None
    if reader is None:
        raise MarkerFormatError(
            f"marker {record_id!r} in partition {partition!r} has format version {version!r}; "
            f"this library reads versions {sorted(_READERS)}: upgrade it to read this marker")
    return reader(properties, record_id, partition, etag)


def _seconds(value: Any) -> float:
    return int(value) / 1000


def _read_v1(properties: Mapping[str, Any], record_id: str, partition: str,
             etag: str | None) -> IdempotencyRecord:
    raw_key = properties.get(KEY)
    if raw_key is not None:
        consumer, _, text = str(raw_key).partition(_KEY_SEPARATOR)
        key: DedupKey | None = DedupKey(consumer, text)
    else:
        key = DedupKey.from_encoded(record_id)
    written_ms = properties.get(WRITTEN)
    if written_ms is None and EXPIRES in properties and NATIVE_TTL in properties:
        written_ms = int(properties[EXPIRES]) - 1000 * int(properties[NATIVE_TTL])
    if key is None or HASH not in properties or written_ms is None:
        raise MarkerFormatError(f"marker {record_id!r} in partition {partition!r} lacks "
                                f"{'its key' if key is None else 'its hash or its time'}")
    written = _seconds(written_ms)
    created = properties.get(CREATED)
    expires = properties.get(EXPIRES)
    lease = properties.get(LEASE)
    result_text = properties.get(RESULT)
    outbox = tuple(decode_pending(properties, key=key))
    encoded = key.encoded
    return IdempotencyRecord(
        key=key,
        state=RecordState(properties.get(STATE, RecordState.COMPLETED.value)),
        request_hash=str(properties[HASH]),
        created_at=written if created is None else _seconds(created),
        updated_at=written,
        expires_at=None if expires is None else _seconds(expires),
        lease_expires_at=None if lease is None else _seconds(lease),
        attempts=int(properties.get(ATTEMPTS, 1)),
        result=properties.get(RESULT_VALUE) if result_text is None else json.loads(result_text),
        partition=None if partition == encoded else partition,
        record_id=None if record_id == encoded else record_id,
        etag=etag,
        outbox=outbox,
        outbox_position=EventPosition.decode(properties.get(POSITION)) if outbox else None,
    )


_READERS: dict[int, Callable[[Mapping[str, Any], str, str, str | None], IdempotencyRecord]] = {
    1: _read_v1,
}


def check_flat(body: dict[str, Any]) -> None:
    """Business bodies must be flat scalars so both backends can store them."""
    for name, value in body.items():
        if isinstance(value, (dict, list, tuple, set)):
            raise ValueError(f"document property {name!r} is nested; store it as JSON text")
        if name in RESERVED or is_pending_field(name):
            raise ValueError(f"document property {name!r} is reserved for the dedup record")
