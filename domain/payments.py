"""Payments from Event Hubs: CloudEvents that credit or debit an account balance.

A balance change is not naturally idempotent, so the dedup marker and the
balance update commit in one transaction in the account's partition (the
balance replaced under its etag). A replayed batch is absorbed by the
partition's high-water mark; a producer duplicate (same source+id at another
sequence number) by the per-event key. The host checkpoints even when the
function raises, so a failing event is retried here and then parked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.messages import InboundEvent, InvalidMessageError, invalid_event, parse_json_object
from shared import (
    DedupKey,
    Idempotency,
    IdempotencyError,
    InvalidKeyError,
    Outcome,
    OutcomeStatus,
    request_hash,
    store_safe_id,
)
from shared.cloudevents import CloudEvent, InvalidEventError, parse_cloudevent
from shared.parking import ParkingLot
from shared.payload import exact_integer
from shared.watermark import PartitionWatermark

CONSUMER = "payments"
ACCOUNT_DOCUMENT = "balance"
EVENT_TYPES = {"payment.credit": 1, "payment.debit": -1}
# Amounts and balances stay within what both stores hold exactly (a Cosmos number is a double):
# an amount up to 10^15 cents; a balance within +-(2^53 - 1). Outside: refused, never rounded.
MAX_AMOUNT_CENTS = 10**15
MAX_EVENT_BYTES = 1024 * 1024
logger = logging.getLogger(__name__)


@dataclass
class BatchReport:
    """What one batch did, for logs, tests and the simulator."""

    applied: int = 0
    duplicates: int = 0
    replay_skipped: int = 0
    parked: dict[str, int] = field(default_factory=dict)
    watermark: int | None = None

    def park(self, reason: str) -> None:
        self.parked[reason] = self.parked.get(reason, 0) + 1


@dataclass(frozen=True)
class Payment:
    key: DedupKey
    account_id: str
    amount_cents: int  # signed: credit > 0, debit < 0
    content: dict[str, Any]


def payment_from(key: DedupKey, event_type: str, data: Any) -> Payment:
    """Validate a payment's type and data; InvalidMessageError says what is wrong."""
    sign = EVENT_TYPES.get(event_type)
    if sign is None:
        raise InvalidMessageError("UnknownEventType", f"type {event_type!r}")
    if not isinstance(data, dict):
        raise InvalidMessageError("InvalidPayment", "data must be a JSON object")
    account, amount = data.get("accountId"), data.get("amountCents")
    if not isinstance(account, str) or not account:
        raise InvalidMessageError("InvalidPayment", "accountId must be a non-empty string")
    amount = exact_integer(amount, "amountCents", reason="InvalidPayment", maximum=MAX_AMOUNT_CENTS)
    content = {"type": event_type, "accountId": account, "amountCents": amount}
    return Payment(key, account, sign * amount, content)


class PaymentService:
    """Applies each payment event once per account, absorbing replays and retries."""

    def __init__(self, ledger: Idempotency, watermark: PartitionWatermark, parking: ParkingLot, *,
                 event_hub: str, missing_key_policy: str = "park", max_attempts: int = 3,
                 backoff: float = 0.2, sleep: Callable[[float], None] = time.sleep) -> None:
        self.ledger = ledger
        self.watermark = watermark
        self.parking = parking
        self.event_hub = event_hub
        self.missing_key_policy = missing_key_policy
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.sleep = sleep

    # -- parsing --------------------------------------------------------------------------
    def _payment(self, event: InboundEvent, partition_id: str) -> Payment:
        if len(event.body) > MAX_EVENT_BYTES:
            raise InvalidMessageError("PayloadTooLarge", f"{len(event.body)} bytes")
        try:
            cloud_event = parse_cloudevent(event.body, event.properties, event.content_type)
            key = DedupKey.from_cloudevent(CONSUMER, cloud_event.source, cloud_event.id)
        except (InvalidEventError, InvalidKeyError) as error:
            reason = error.reason if isinstance(error, InvalidEventError) else "InvalidKey"
            if self.missing_key_policy != "sequence" or reason == "MalformedJson":
                raise (invalid_event(error) if isinstance(error, InvalidEventError)
                       else InvalidMessageError(reason, str(error))) from error
            # Opt-in fallback: survives replays (same partition + sequence number) but not
            # producer retries, which arrive at a new sequence number.
            cloud_event = self._fallback_event(event)
            key = DedupKey(CONSUMER, f"eh:{self.event_hub}:{partition_id}:{event.sequence_number}")
        return self._to_payment(key, cloud_event)

    @staticmethod
    def _fallback_event(event: InboundEvent) -> CloudEvent:
        envelope = parse_json_object(event.body, max_bytes=MAX_EVENT_BYTES)
        data = envelope.get("data", envelope)
        return CloudEvent(id="", source="", type=str(envelope.get("type", "")), specversion="1.0",
                          data=data)

    @staticmethod
    def _to_payment(key: DedupKey, event: CloudEvent) -> Payment:
        return payment_from(key, event.type, event.data)

    # -- effect ---------------------------------------------------------------------------
    def apply(self, payment: Payment, context: Mapping[str, Any] | None = None) -> Outcome:
        """Marker + balance update in one transaction (etag-guarded; rebuilt on a race)."""
        partition = store_safe_id(payment.account_id)

        def build(tx: Any) -> dict[str, Any]:
            account = tx.read(ACCOUNT_DOCUMENT)
            balance = int(account.body["balanceCents"]) if account else 0
            body = {"accountId": payment.account_id, "balanceCents": balance + payment.amount_cents,
                    "kind": "account"}
            if account is None:
                tx.create(ACCOUNT_DOCUMENT, body)
            else:
                tx.replace(ACCOUNT_DOCUMENT, body, etag=account.etag)
            return {"balanceCents": body["balanceCents"]}

        return self.ledger.run_atomic(payment.key, request_hash(payment.content), build,
                                      partition=partition, context=context)

    # -- batch ----------------------------------------------------------------------------
    def process_batch(self, events: list[InboundEvent], partition_id: str) -> BatchReport:
        """Apply a batch from one partition; raises only when nothing could be recorded."""
        report = BatchReport()
        mark = self.watermark.read(partition_id)
        fresh = [e for e in events if mark is None or e.sequence_number > mark.sequence_number]
        report.replay_skipped = len(events) - len(fresh)
        self.ledger.telemetry.replay_skipped(report.replay_skipped, consumer=CONSUMER,
                                             partition_id=partition_id)
        for event in sorted(fresh, key=lambda e: e.sequence_number):
            self._process_event(event, partition_id, report)
        if fresh:
            highest = max(e.sequence_number for e in fresh)
            report.watermark = self.watermark.advance(partition_id, highest, known=mark)
        elif mark is not None:
            report.watermark = mark.sequence_number
        return report

    def _process_event(self, event: InboundEvent, partition_id: str, report: BatchReport) -> None:
        context = {"partition_id": partition_id, "sequence_number": event.sequence_number,
                   "event_hub": self.event_hub}
        try:
            payment = self._payment(event, partition_id)
        except InvalidMessageError as error:
            self._park(event, partition_id, error.reason, error.detail, report)
            return
        last_error: Exception | None = None
        for attempt in range(1, self.max_attempts + 1):
            try:
                status = self.apply(payment, {**context, "attempt": attempt}).status
            except IdempotencyError as error:  # outage, throttling, lost races
                last_error = error
                if attempt < self.max_attempts:
                    self.sleep(self.backoff * 2 ** (attempt - 1))
                continue
            except Exception as error:  # a bug for this event: park it, keep the partition moving
                logger.exception("payments: unexpected error", extra=context)
                self._park(event, partition_id, "UnexpectedError", repr(error), report)
                return
            if status is OutcomeStatus.PROCESSED:
                report.applied += 1
            elif status is OutcomeStatus.DUPLICATE:
                report.duplicates += 1
            elif status is OutcomeStatus.CONFLICT:
                self._park(event, partition_id, "IdempotencyKeyConflict",
                           f"{payment.key.key} was applied with different content", report)
            return
        self._park(event, partition_id, "ProcessingFailed",
                   f"{self.max_attempts} attempts: {last_error}", report)

    def _park(self, event: InboundEvent, partition_id: str, reason: str, detail: str,
              report: BatchReport) -> None:
        """Durably park; if even that fails, raise so the host's retry policy re-runs the batch."""
        entry_id = f"{self.event_hub}/{partition_id}/{event.sequence_number}"
        self.parking.park(consumer=CONSUMER, entry_id=entry_id, reason=reason, payload=event.body,
                          error=detail, context={
                              "partition_id": partition_id, "sequence_number": event.sequence_number,
                              "offset": event.offset,
                              "properties": {str(k): str(v) for k, v in event.properties.items()}})
        report.park(reason)
