"""The `same-transactions` variant's hot path: the app's payment transactions, written inline.

Per event it does what any consumer writing the app's transactions by hand on the SDKs must
do, and nothing more: decode the CloudEvent, derive its key and the request hash, add the
amount to the account's balance, build the marker, the balance and the `BalanceChanged`
record, and hand the documents to the SDK client (`azure.cosmos.aio` transactional batches,
or a Table `$batch` written here and sent through the `azure.data.tables.aio` client's own
pipeline, as the app's stores send theirs).

This module imports nothing of the project's library (`shared`) or app (`domain`,
`functions`): a test holds it to that. What it must know of the app's documents (their
fields in order, the constants among them, and which value computed here each other field
holds: a `Template`) is learnt once at set-up, from the requests the app itself sent
(`benchmarks.app_requests`), so the markers follow the app's format as it changes, and a
change this module cannot follow stops the run at set-up, naming the field.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from wsgiref.handlers import format_date_time

SIGNS = {"payment.credit": 1, "payment.debit": -1}
BALANCE_CHANGED = "BalanceChanged"
MAX_ENCODED_LENGTH = 250  # a store-safe id's longest escaped form (longer: "~" + SHA-256)
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9\-_.:@]+")
_HEADER_SAFE = re.compile(r"^[\x21-\x7e]{1,255}$")
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_canonical = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                              sort_keys=True).encode
_ascii_compact = json.JSONEncoder(ensure_ascii=True, separators=(",", ":")).encode
_sdk_json = json.JSONEncoder().encode  # what the Table SDK writes an entity with


# -- keys, hashes, ids -------------------------------------------------------------------------
def _escaped(match: re.Match[str]) -> str:
    return "".join(f"!{byte:02X}" for byte in match.group().encode("utf-8"))


def escape(value: str) -> str:
    """`value` in the stores' safe alphabet: every other character as `!XX` per UTF-8 byte."""
    return _UNSAFE_RUN.sub(_escaped, value)


def safe_id(value: str) -> str:
    """A store-safe id: escaped, or `~` + SHA-256 of the text when that is too long."""
    encoded = escape(value)
    return encoded if len(encoded) <= MAX_ENCODED_LENGTH else "~" + hashlib.sha256(
        value.encode("utf-8")).hexdigest()


def record_id(consumer: str, key: str) -> str:
    """The marker's id for `key` of `consumer`."""
    encoded = escape(key)
    if len(consumer) + 1 + len(encoded) > MAX_ENCODED_LENGTH:
        encoded = "~" + hashlib.sha256(key.encode("utf-8")).hexdigest()
    return f"{consumer}|{encoded}"


def idempotency_key(marker_id: str, operation: str) -> str:
    """The `Idempotency-Key` a message carries: the marker id and the operation."""
    value = marker_id if _HEADER_SAFE.match(marker_id) else safe_id(marker_id)
    value = f"{value}:{safe_id(operation)}"
    return safe_id(value) if len(value) > 255 else value


# -- what each document holds --------------------------------------------------------------------
@dataclass(slots=True)
class MarkerFacts:
    """The values one event's marker is built from."""

    key: str  # the raw key: the JSON pair [source, id]
    record_id: str
    partition: str  # the account's store-safe id
    digest: bytes  # SHA-256 of the canonical content
    balance: int  # the account's balance after this event (the marker's result)
    now: float
    expires: float
    outbox: Any = None  # the first marker of a transaction: its messages, as stored (JSON)
    position: Any = None  # and its event's position (JSON)


@dataclass(slots=True)
class BalanceFacts:
    account: str
    partition: str
    balance: int
    version: int  # payments posted to the account so far


@dataclass(slots=True)
class MarkFacts:
    record_id: str  # the partition id, store-safe
    partition: str  # the mark's store partition
    sequence: int
    partition_id: str
    offset: str | None


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


# The values a document field may hold, by name, each a function of the document's facts, in
# the order they are tried (the first that fits every recorded document wins). Besides the
# forms the app writes today, the lean marker's announced ones (hash as base64 of the digest,
# times as integer milliseconds) are known, so that change is followed without an edit here.
MARKER_SLOTS: dict[str, Callable[[MarkerFacts], Any]] = {
    "id": lambda f: f.record_id,
    "partition": lambda f: f.partition,
    "key": lambda f: f.key,
    "hash": lambda f: "jcs:sha256:" + f.digest.hex(),
    "hash.base64": lambda f: base64.b64encode(f.digest).decode("ascii"),
    "hash.base64url": lambda f: base64.urlsafe_b64encode(f.digest).rstrip(b"=").decode("ascii"),
    "hash.hex": lambda f: f.digest.hex(),
    "result": lambda f: _compact({"balanceCents": f.balance}),
    "result.object": lambda f: {"balanceCents": f.balance},
    "balance": lambda f: f.balance,
    "now": lambda f: f.now,
    "now.ms": lambda f: _ms(f.now),
    "now.ms.text": lambda f: str(_ms(f.now)),
    "expires": lambda f: f.expires,
    "expires.ms": lambda f: _ms(f.expires),
    "expires.ms.text": lambda f: str(_ms(f.expires)),
    "ttl": lambda f: max(1, math.ceil(f.expires - f.now)),
    "outbox": lambda f: f.outbox,  # as JSON (Cosmos DB keeps JSON)
    "outbox.text": lambda f: None if f.outbox is None else _ascii_compact(f.outbox),  # Table
    "position": lambda f: f.position,
    "position.text": lambda f: None if f.position is None else _ascii_compact(f.position),
}
BALANCE_SLOTS: dict[str, Callable[[BalanceFacts], Any]] = {
    "partition": lambda f: f.partition,
    "account": lambda f: f.account,
    "balance": lambda f: f.balance,
    "version": lambda f: f.version,
}
MARK_SLOTS: dict[str, Callable[[MarkFacts], Any]] = {
    "id": lambda f: f.record_id,
    "partition": lambda f: f.partition,
    "sequence": lambda f: f.sequence,
    "partition_id": lambda f: f.partition_id,
    "offset": lambda f: f.offset,
}


@dataclass(frozen=True)
class Template:
    """One kind of document as the app writes it: each field a constant or a slot."""

    kind: str
    fields: tuple[tuple[str, Callable[[Any], Any] | None, Any], ...]  # (name, slot, constant)
    slots: tuple[str | None, ...] = ()  # the slot names, for reports and tests

    def build(self, facts: Any) -> dict[str, Any]:
        return {name: (value if slot is None else slot(facts)) for name, slot, value in self.fields}


@dataclass(frozen=True)
class Templates:
    first_marker: Template  # the first marker of a transaction: it carries the messages
    marker: Template  # every further one
    balance: Template
    mark: Template


# -- an event, a transaction's messages ----------------------------------------------------------
@dataclass(slots=True)
class Payment:
    event_id: str
    key: str
    digest: bytes
    account: str
    cents: int  # signed
    sequence: int
    offset: str | None


def payment(body: bytes, sequence: int, offset: str | None) -> Payment:
    """A structured-mode payment CloudEvent; ValueError for anything else."""
    envelope = json.loads(body)
    source, event_id, kind, data = (envelope.get("source"), envelope.get("id"),
                                    envelope.get("type"), envelope.get("data"))
    sign = SIGNS.get(kind)
    if not (isinstance(source, str) and isinstance(event_id, str) and source and event_id
            and sign is not None and isinstance(data, dict)):
        raise ValueError(f"not a payment event: {body[:80]!r}")
    account, amount = data.get("accountId"), data.get("amountCents")
    if not isinstance(account, str) or not account or type(amount) is not int or amount <= 0:
        raise ValueError(f"invalid payment data: {data!r}")
    content = {"type": kind, "accountId": account, "amountCents": amount}
    return Payment(event_id, _compact([source, event_id]),
                   hashlib.sha256(_canonical(content).encode("utf-8")).digest(), account,
                   sign * amount, sequence, offset)


@dataclass(frozen=True)
class Outgoing:
    """A transaction's `BalanceChanged`, as the marker stores it and a send is costed."""

    stored: list[dict[str, Any]]  # the marker's stored messages (JSON; Table keeps its text)
    weight: int  # what it takes of a send (body, properties, the header allowance)


def balance_changed(*, consumer: str, key: str, marker_id: str, queue: str, account: str,
                    balance: int, version: int, event_ids: Sequence[str],
                    header_allowance: int) -> Outgoing:
    """The message one account's transaction sends: its full resulting state and the ids of
    the events it covers; its id derived from the transaction's first key."""
    body = _compact({"type": BALANCE_CHANGED, "accountId": account, "balanceCents": balance,
                     "version": version, "eventIds": list(event_ids)}).encode("utf-8")
    properties = {"Idempotency-Key": idempotency_key(marker_id, f"{queue}#0"),
                  "type": BALANCE_CHANGED, "accountId": account}
    # Stored lean: the body as JSON, no id or Idempotency-Key (both derive from the marker's
    # key), no default or empty field.
    stored = [{"d": queue, "j": json.loads(body),
               "p": {"type": BALANCE_CHANGED, "accountId": account}}]
    weight = len(body) + header_allowance + sum(len(k) + len(v) for k, v in properties.items())
    return Outgoing(stored, weight)


def position(event_hub: str, partition_id: str, sequence: int) -> list[Any]:
    """An event's place in its hub as a marker stores it (no enqueued time: the benchmark's
    events carry none)."""
    return [event_hub, partition_id, sequence]


def sends(weights: Sequence[int], limit: int) -> int:
    """The sends one destination's messages take: cut in order where the next would overflow."""
    count, size = 0, 0
    for weight in weights:
        if count == 0 or size + weight > limit:
            count, size = count + 1, 0
        size += weight
    return count


# -- Table Storage: a $batch written here, sent through the SDK client's pipeline ---------------
class TableBatch:
    """Entity-group transactions of one table: the `$batch` body the app's stores send
    (`application/http` parts in one changeset), written from entities the templates built;
    the answer's statuses and etags read back. Requests go through the client's pipeline
    (authentication, retries, the benchmark's counting)."""

    _STATUS = re.compile(rb"HTTP/1\.1 (\d{3})")
    _ETAG = re.compile(rb"\r\nETag: ([^\r\n]+)", re.IGNORECASE)

    def __init__(self, client: Any) -> None:
        from azure.core.rest import HttpRequest

        self._http_request = HttpRequest
        self._client = client
        # The client's own URL and versions (set once: the SDK's generated client holds them)
        self._pipeline = client._client  # the SDK's generated client: its pipeline
        self._url = f"{client.scheme}://{client._primary_hostname}"
        self._table = f"{self._url}/{quote(client.table_name, safe='')}"
        self._version = self._pipeline._config.version
        self._api_version = client.api_version

    def _part(self, index: int, operation: tuple[str, dict[str, Any], str | None], date: str
              ) -> str:
        kind, entity, etag = operation
        body = _sdk_json(entity)
        if kind == "create":
            line, accept, condition = f"POST {self._table}", "application/json;odata=minimalmetadata", ""
        else:
            url = (f"{self._table}(PartitionKey='{_url_key(entity['PartitionKey'])}',"
                   f"RowKey='{_url_key(entity['RowKey'])}')")
            line, accept, condition = f"PUT {url}", "application/json", f"If-Match: {etag}\r\n"
        return (f"Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
                f"Content-ID: {index}\r\n\r\n{line} HTTP/1.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"x-ms-version: {self._version}\r\nDataServiceVersion: 3.0\r\nAccept: {accept}\r\n"
                f"{condition}x-ms-date: {date}\r\nDate: {date}\r\n\r\n{body}\r\n")

    async def submit(self, operations: Sequence[tuple[str, dict[str, Any], str | None]]
                     ) -> list[str]:
        """Commit `operations` ("create" or "replace" under an etag) in one transaction; the
        new etag of each. RuntimeError when the service refused any of them."""
        boundary, changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
        date = format_date_time(time.time())
        parts = "".join(f"--{changeset}\r\n{self._part(i, op, date)}"
                        for i, op in enumerate(operations))
        content = (f"--{boundary}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"
                   f"{parts}--{changeset}--\r\n\r\n--{boundary}--\r\n").encode()
        request = self._http_request(
            "POST", f"{self._url}/$batch",
            headers={"x-ms-version": self._api_version, "DataServiceVersion": "3.0",
                     "MaxDataServiceVersion": "3.0;NetFx", "Accept": "application/json",
                     "Content-Type": f"multipart/mixed; boundary={boundary}"},
            content=content)
        response = await self._pipeline.send_request(request, stream=True)
        answer: bytes = await response.read()
        statuses = self._STATUS.findall(answer)
        if (response.status_code != 202 or len(statuses) != len(operations)
                or any(not s.startswith(b"2") for s in statuses)):
            raise RuntimeError(f"$batch refused ({response.status_code}): {answer[:300]!r}")
        etags = [etag.decode("ascii") for etag in self._ETAG.findall(answer)]
        if len(etags) != len(operations):
            raise RuntimeError(f"$batch answered {len(etags)} etags for {len(operations)} writes")
        return etags


def _url_key(value: str) -> str:
    """A key in an entity's URL, as the SDK writes it (quotes doubled, then percent-encoded)."""
    return quote(value.replace("'", "''"), safe="")
