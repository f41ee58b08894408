"""POST /api/payments with an `Idempotency-Key` header: a payment applied once per caller and key.

The library's `IdempotencyKeyEndpoint` runs the protocol (the key scoped per caller, the
stored response replayed, problem+json errors, 503 on a transient failure). This module
is the business rule: the request is a payment, posted through the payments processor's
single-event entry point under a ledger key scoped like the request's, so the balance
changes once even if this layer's record were lost.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from domain.payments import Payment, PaymentProcessor, payment_from
from shared import (
    DedupKey,
    HttpResult,
    IdempotencyKeyEndpoint,
    IdempotentRequest,
    OutcomeStatus,
    PoisonMessageError,
)

CONSUMER = "http-payments"
LEDGER_CONSUMER = "http-ledger"
_UNKEYED = DedupKey(LEDGER_CONSUMER, "-")  # a parsed payment's key until its request's is known


def parse_payment(body: dict[str, Any]) -> Payment:
    """The body's payment; InvalidPayloadError (answered 400) before anything is claimed."""
    return payment_from(_UNKEYED, str(body.get("type", "")), body)


class HttpPaymentService:
    def __init__(self, endpoint: IdempotencyKeyEndpoint, payments: PaymentProcessor) -> None:
        self.endpoint = endpoint
        self.payments = payments

    def respond(self, request: Any) -> Any:
        """The `HttpResponse` to an `azure.functions.HttpRequest`."""
        return self.endpoint.handle(request, self.apply, parse=parse_payment)

    def apply(self, request: IdempotentRequest[Payment]) -> HttpResult:
        """Apply the request's payment; the response is stored for the key."""
        # The ledger key is scoped alike: another caller's payment under the same key is
        # another payment, not a duplicate of the first.
        payment = dataclasses.replace(
            request.item, event_id=request.key,
            key=DedupKey.from_business_key(LEDGER_CONSUMER, request.scoped_key,
                                           field="Idempotency-Key"))
        ledger = self.payments.apply(payment, {"idempotency_key": request.key})
        if ledger.status is OutcomeStatus.CONFLICT:
            raise PoisonMessageError("LedgerConflict", "ledger key reused with other content")
        return HttpResult(201, {"accountId": payment.account_id, "amountCents": payment.amount_cents,
                                "balanceCents": ledger.result["balanceCents"],
                                "idempotencyKey": request.key})
