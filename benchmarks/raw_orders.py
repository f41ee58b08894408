"""The `same-requests` baseline of the Service Bus `orders` path: its requests, written inline.

Per delivery it does what a consumer writing the `orders` function by hand on the raw async
SDKs must do to send the same requests, and nothing more: read the body and the message's
id, decode and check the order, derive the request hash; on a first delivery commit the
order document (carrying its marker fields and the `OrderAccepted` it sends) and its lines
in one transaction (a Cosmos transactional batch, or a Table `$batch` sent through the
client's own pipeline, as the app's stores send theirs), send the message, clear it from the
document under its etag, and complete the message; on a redelivery read the document first
and complete a duplicate. Failures are not handled (none are provoked here): a refused write
stops the run.

It imports nothing of the project's library (`shared`), app (`domain`, `functions`) or
harness: a test holds it to that. It writes the app's documents by hand, so
`benchmarks.profile_cpu` checks, before it measures, that one probe order's requests and
message are the app's byte for byte (`same_requests`): a format change this module does not
follow stops the run there, naming the request that differs.
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

from benchmarks.raw_payments import TableBatch, record_id, safe_id

MAX_ORDER_BYTES = 256 * 1024
MAX_LINES = 98
ORDER_ACCEPTED = "OrderAccepted"
MARKER_VERSION = 1
# The namespace of the derived message ids (uuid5 of consumer, key, destination, ordinal), the
# app's published constant; the probe check holds the ids to the app's.
ID_NAMESPACE = uuid.UUID("6f0e9a52-3c1d-5b7e-9a41-2d8c0f7b1e63")
_HEADER_SAFE = re.compile(r"^[\x21-\x7e]{1,255}$")
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_canonical = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                              sort_keys=True).encode
_ascii_compact = json.JSONEncoder(separators=(",", ":")).encode
_INT32 = range(-(2**31), 2**31)


@dataclass(frozen=True, slots=True)
class Order:
    order_id: str
    customer_id: str
    currency: str
    lines: list[dict[str, Any]]
    total: float
    digest: str  # base64url SHA-256 of the canonical content


def parse_order(body: bytes, message_id: str | None) -> Order:
    """A valid order of this message; ValueError for anything else."""
    if len(body) > MAX_ORDER_BYTES:
        raise ValueError("order too large")
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("not an object")
    order_id, customer, currency = (data.get("orderId"), data.get("customerId"),
                                    data.get("currency", "EUR"))
    lines = data.get("lines")
    if not (isinstance(order_id, str) and order_id and order_id == message_id
            and isinstance(customer, str) and customer
            and isinstance(currency, str) and len(currency) == 3
            and isinstance(lines, list) and 0 < len(lines) <= MAX_LINES):
        raise ValueError(f"invalid order: {body[:80]!r}")
    parsed = []
    for line in lines:
        sku, quantity, price = line.get("sku"), line.get("quantity"), line.get("unitPrice")
        if not (isinstance(sku, str) and sku and type(quantity) is int
                and 0 <= quantity <= 1_000_000 and type(price) in (int, float)
                and 0 <= price <= 1e9 and math.isfinite(price)):
            raise ValueError(f"invalid order line: {line!r}")
        parsed.append({"sku": sku, "quantity": quantity, "unitPrice": price})
    content = {"orderId": order_id, "customerId": customer, "currency": currency,
               "lines": parsed}
    digest = base64.urlsafe_b64encode(hashlib.sha256(
        _canonical(content).encode("utf-8")).digest()).rstrip(b"=").decode("ascii")
    total = round(sum(line["quantity"] * line["unitPrice"] for line in parsed), 2)
    return Order(order_id, customer, currency, parsed, total, digest)


def _idempotency_key(marker_id: str, operation: str) -> str:
    value = marker_id if _HEADER_SAFE.match(marker_id) else safe_id(marker_id)
    value = f"{value}:{safe_id(operation)}"
    return safe_id(value) if len(value) > 255 else value


def _annotated(entity: dict[str, Any]) -> dict[str, Any]:
    """An entity as the Table SDK writes it: each str and float property typed, an int past
    Int32 as Edm.Int64 text (`int64` names the properties that are Int64 whatever their value)."""
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if isinstance(value, str):
            out[name], out[f"{name}@odata.type"] = value, "Edm.String"
        elif isinstance(value, float):
            out[name], out[f"{name}@odata.type"] = value, "Edm.Double"
        elif isinstance(value, int) and value not in _INT32:
            out[name], out[f"{name}@odata.type"] = str(value), "Edm.Int64"
        else:
            out[name] = value
    return out


class RawOrders:
    """The `orders` function's requests on a raw async SDK client (`container`: an
    `azure.cosmos.aio` container partitioned on /orderId; `table`: an `azure.data.tables.aio`
    table client), its message sent with `sender` (an `azure.servicebus.aio` sender)."""

    def __init__(self, *, topic: str, sender: Any, container: Any = None, table: Any = None,
                 consumer: str = "orders", clock: Callable[[], float] = time.time) -> None:
        self._topic, self._sender, self._consumer, self._clock = topic, sender, consumer, clock
        self._container, self._table = container, table
        self._batch = TableBatch(table) if table is not None else None

    async def handle(self, message: Any, actions: Any) -> None:
        from azure.servicebus import ServiceBusMessage

        body = b"".join(message.body)
        message_id = message.message_id
        try:
            order = parse_order(body, message_id)
        except (ValueError, AttributeError) as error:
            actions.deadletter(message, deadletter_reason="InvalidOrder",
                               deadletter_error_description=str(error))
            return
        document_id = safe_id(order.order_id)
        if (message.delivery_count or 1) > 1:
            stored = await self._read(document_id)
            if stored is not None:
                if stored.get("iH") != order.digest:
                    actions.deadletter(message, deadletter_reason="IdempotencyKeyConflict")
                elif stored.get("o0"):  # a send not yet recorded: not provoked here
                    raise RuntimeError(f"order {order.order_id} has a pending send")
                else:
                    actions.complete(message)
                return
        marker = record_id(self._consumer, message_id)
        correlation = message.correlation_id
        accepted = {"type": ORDER_ACCEPTED, "orderId": order.order_id,
                    "customerId": order.customer_id, "currency": order.currency,
                    "total": order.total, "lineCount": len(order.lines)}
        properties = {"X-Correlation-Id": correlation, "type": ORDER_ACCEPTED,
                      "orderId": order.order_id}
        outbox = [{"d": self._topic, "j": accepted, "c": correlation, "p": properties}]
        now = round(self._clock() * 1000)
        result = {"orderId": order.order_id, "total": order.total}
        document = {"orderId": order.order_id, "customerId": order.customer_id,
                    "currency": order.currency, "total": order.total,
                    "lineCount": len(order.lines), "status": "accepted", "kind": "order",
                    "iV": MARKER_VERSION, "iH": order.digest, "iT": now}
        lines = [(f"{document_id}:line:{n:03d}", {"orderId": order.order_id, "kind": "line", **line})
                 for n, line in enumerate(order.lines, start=1)]
        etag = await self._commit(document_id, document, result, marker, outbox, now, lines)
        await self._sender.send_messages([ServiceBusMessage(
            _compact(accepted).encode("utf-8"),
            message_id=str(uuid.uuid5(ID_NAMESPACE, _compact(
                [self._consumer, message_id, self._topic, 0]))),
            content_type="application/json", correlation_id=correlation,
            application_properties={
                "Idempotency-Key": _idempotency_key(marker, f"{self._topic}#0"),
                **properties})])
        await self._clear(document_id, etag)
        actions.complete(message)

    async def _read(self, document_id: str) -> dict[str, Any] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            if self._container is not None:
                return dict(await self._container.read_item(document_id, partition_key=document_id))
            return dict(await self._table.get_entity(document_id, document_id))
        except ResourceNotFoundError:
            return None

    async def _commit(self, document_id: str, document: dict[str, Any], result: dict[str, Any],
                      marker: str, outbox: list[dict[str, Any]], now: int,
                      lines: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """The order document and its lines in one transaction; the document's new etag."""
        if self._container is not None:
            operations: list[Any] = [("create", ({**document, "iJ": result, "iK": marker,
                                                  "o0": outbox, "oT": now, "id": document_id},))]
            operations += [("create", ({**line, "id": line_id},)) for line_id, line in lines]
            results = await self._container.execute_item_batch(
                operations, partition_key=document_id, no_response=True)
            return str(results[0].get("eTag"))
        assert self._batch is not None
        keys = {"PartitionKey": document_id, "RowKey": document_id}
        entities = [("create", _annotated({**document, "iR": _compact(result), "iK": marker,
                                           "o0": _ascii_compact(outbox), "oT": now, **keys}), None)]
        entities += [("create", _annotated({**line, "PartitionKey": document_id,
                                            "RowKey": line_id}), None) for line_id, line in lines]
        etags = await self._batch.submit(entities)
        return etags[0]

    async def _clear(self, document_id: str, etag: str) -> None:
        """The sent message off the order document, under the etag its commit answered."""
        from azure.core import MatchConditions

        if self._container is not None:
            await self._container.patch_item(
                document_id, partition_key=document_id,
                patch_operations=[{"op": "remove", "path": "/o0"}, {"op": "remove", "path": "/oT"}],
                etag=etag, match_condition=MatchConditions.IfNotModified, no_response=True)
            return
        from azure.data.tables import EdmType, EntityProperty, UpdateMode

        await self._table.update_entity(
            {"o0": "", "oT": EntityProperty(0, EdmType.INT64), "PartitionKey": document_id,
             "RowKey": document_id},
            mode=UpdateMode.MERGE, etag=etag, match_condition=MatchConditions.IfNotModified)
