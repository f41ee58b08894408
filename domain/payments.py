"""Payments from Event Hubs: CloudEvents that credit or debit an account balance.

The business rule only: validate a payment, post payments to an account's
balance. A balance change is not naturally idempotent, so the library's
`PartitionBatchProcessor` commits the events of one account in one transaction
in the account's partition (every event's marker, each with the balance after
it, and one balance write under its etag), absorbs replays by the partition's
high-water mark and producer duplicates by the per-event key, and parks what
can never succeed. The instance remembers the balances and the mark it wrote
(re-checked by etag when it writes them next), so a steady partition costs one
transaction per account and one mark write per batch.

Each account's transaction also sends one `BalanceChanged` (the outbox) to the
queue `balance_changes_queue` names (none when it is empty): the account's
resulting balance, its `version` (the number of payments posted to it so far,
kept on the balance document: it never repeats or goes back) and the ids of
the payment events it covers. One message per account per transaction, not
per event: it carries the full resulting state, so a consumer applies it as a
version-guarded upsert and per-event messages would tell it nothing more for
about five times the sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared import (
    MAX_SAFE_INTEGER,
    CloudEvent,
    DedupKey,
    Document,
    EventView,
    Idempotency,
    InvalidEventError,
    InvalidKeyError,
    InvalidPayloadError,
    ParkingLot,
    PartitionBatchProcessor,
    PartitionWatermark,
    Transaction,
    aio,
    exact_integer,
    parse_cloudevent,
    parse_json_object,
    request_hash,
    store_safe_id,
)

CONSUMER = "payments"
ACCOUNT_DOCUMENT = "balance"
BALANCE_CHANGED = "BalanceChanged"
EVENT_TYPES = {"payment.credit": 1, "payment.debit": -1}
# Amounts and balances stay within what both stores hold exactly (a Cosmos number is a double):
# an amount up to 10^15 cents; a balance within +-(2^53 - 1). Outside: refused, never rounded.
MAX_AMOUNT_CENTS = 10**15
MAX_EVENT_BYTES = 1024 * 1024

PaymentProcessor = PartitionBatchProcessor[EventView, "Payment"]
AsyncPaymentProcessor = aio.PartitionBatchProcessor[EventView, "Payment"]


@dataclass(frozen=True)
class Payment:
    key: DedupKey
    account_id: str
    amount_cents: int  # signed: credit > 0, debit < 0
    content: dict[str, Any]
    event_id: str = ""  # what BalanceChanged names it by (the CloudEvent id); "": the key

    @property
    def reference(self) -> str:
        return self.event_id or self.key.key


def payment_from(key: DedupKey, event_type: str, data: Any, *, event_id: str = "") -> Payment:
    """Validate a payment's type and data; InvalidPayloadError says what is wrong."""
    sign = EVENT_TYPES.get(event_type)
    if sign is None:
        raise InvalidPayloadError("UnknownEventType", f"type {event_type!r}")
    if not isinstance(data, dict):
        raise InvalidPayloadError("InvalidPayment", "data must be a JSON object")
    account, amount = data.get("accountId"), data.get("amountCents")
    if not isinstance(account, str) or not account:
        raise InvalidPayloadError("InvalidPayment", "accountId must be a non-empty string")
    amount = exact_integer(amount, "amountCents", reason="InvalidPayment", maximum=MAX_AMOUNT_CENTS)
    content = {"type": event_type, "accountId": account, "amountCents": amount}
    return Payment(key, account, sign * amount, content, event_id)


@dataclass(frozen=True)
class PaymentRules:
    """How a payment event is read (`event_hub` names the fallback key), and how payments
    post to a balance; each posting sends a `BalanceChanged` to `balance_changes_queue`
    (empty: none)."""

    event_hub: str
    missing_key_policy: str = "park"
    balance_changes_queue: str = ""

    def parse(self, event: EventView, partition_id: str) -> Payment:
        """The event's payment; InvalidPayloadError for anything that can never succeed."""
        if len(event.body) > MAX_EVENT_BYTES:
            raise InvalidPayloadError("PayloadTooLarge", f"{len(event.body)} bytes")
        try:
            cloud_event = parse_cloudevent(event.body, event.properties, event.content_type)
            key = DedupKey.from_cloudevent(CONSUMER, cloud_event.source, cloud_event.id)
        except (InvalidEventError, InvalidKeyError) as error:
            reason = error.reason if isinstance(error, InvalidEventError) else "InvalidKey"
            if self.missing_key_policy != "sequence" or reason == "MalformedJson":
                if isinstance(error, InvalidEventError):
                    raise
                raise InvalidPayloadError(reason, str(error)) from error
            # Opt-in fallback: survives replays (same partition + sequence number) but not
            # producer retries, which arrive at a new sequence number.
            envelope = parse_json_object(event.body, max_bytes=MAX_EVENT_BYTES)
            cloud_event = CloudEvent(id="", source="", type=str(envelope.get("type", "")),
                                     specversion="1.0", data=envelope.get("data", envelope))
            key = DedupKey(CONSUMER, f"eh:{self.event_hub}:{partition_id}:{event.sequence_number}")
        return payment_from(key, cloud_event.type, cloud_event.data, event_id=cloud_event.id)

    @staticmethod
    def identify(payment: Payment) -> tuple[DedupKey, str]:
        return payment.key, request_hash(payment.content)

    @staticmethod
    def account(payment: Payment) -> str:
        return store_safe_id(payment.account_id)

    def post(self, tx: Transaction, payments: Sequence[Payment]) -> list[dict[str, int]]:
        """Add the payments (of one account) to its balance in order: one write, the balance
        after each payment as its result, and one BalanceChanged sent."""
        return _posting(tx, payments, tx.read(ACCOUNT_DOCUMENT), self.balance_changes_queue)

    async def post_async(self, tx: aio.Transaction, payments: Sequence[Payment]
                         ) -> list[dict[str, int]]:
        """`post` for the async processor: the balance read is awaited."""
        return _posting(tx, payments, await tx.read(ACCOUNT_DOCUMENT), self.balance_changes_queue)


def _posting(tx: Transaction | aio.Transaction, payments: Sequence[Payment],
             account: Document | None, queue: str) -> list[dict[str, int]]:
    balance = int(account.body["balanceCents"]) if account else 0
    # Payments posted so far: a version that only grows (a balance written before versions were
    # kept starts at 0), so a consumer can tell a newer state from an older one.
    version = int(account.body.get("version", 0)) if account else 0
    results: list[dict[str, int]] = []
    for payment in payments:
        balance += payment.amount_cents
        if abs(balance) > MAX_SAFE_INTEGER:  # a Cosmos number would round it: refuse instead
            raise InvalidPayloadError("BalanceOutOfRange",
                                      f"balance of {payment.account_id} would be {balance}")
        results.append({"balanceCents": balance})
    version += len(payments)
    account_id = payments[0].account_id
    body = {"accountId": account_id, "balanceCents": balance, "version": version, "kind": "account"}
    if account is None:
        tx.create(ACCOUNT_DOCUMENT, body)
    else:
        tx.replace(ACCOUNT_DOCUMENT, body, etag=account.etag)
    if queue:
        tx.send(queue, balance_changed(account_id, balance, version, payments),
                properties={"type": BALANCE_CHANGED, "accountId": account_id})
    return results


def balance_changed(account_id: str, balance: int, version: int,
                    payments: Sequence[Payment]) -> dict[str, Any]:
    """The message body: the account's full resulting state and the payments it covers."""
    return {"type": BALANCE_CHANGED, "accountId": account_id, "balanceCents": balance,
            "version": version, "eventIds": [p.reference for p in payments]}


def payment_processor(ledger: Idempotency, watermark: PartitionWatermark, parking: ParkingLot, *,
                      rules: PaymentRules, **options: Any) -> PaymentProcessor:
    """The payments batch processor on sync stores (the HTTP path, the replay tool)."""
    return PartitionBatchProcessor(ledger, watermark, parking, consumer=CONSUMER,
                                   event_hub=rules.event_hub, parse=rules.parse,
                                   identify=rules.identify, group=rules.account, build=rules.post,
                                   **options)


def async_payment_processor(ledger: aio.Idempotency, watermark: aio.PartitionWatermark,
                            parking: aio.ParkingLot, *, rules: PaymentRules,
                            **options: Any) -> AsyncPaymentProcessor:
    """The payments batch processor on async stores (the `payments` function)."""
    return aio.PartitionBatchProcessor(ledger, watermark, parking, consumer=CONSUMER,
                                        event_hub=rules.event_hub, parse=rules.parse,
                                        identify=rules.identify, group=rules.account,
                                        build=rules.post_async, **options)
