"""POST /api/payments with an `Idempotency-Key` header (IETF httpapi Idempotency-Key draft).

First request: processed, response stored. Retry with the same key and body:
the stored response, marked `Idempotent-Replayed: true`. Same key, different
body: 422. Same key while the first request is still running: 409. No key:
400. The key is also passed down to the ledger write (the payments processor's
single-event entry point), so the balance changes once even if this layer's
record were lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.messages import InvalidMessageError, parse_json_object
from domain.payments import PaymentProcessor, payment_from
from shared import (
    ConcurrencyRetriesExhaustedError,
    DedupKey,
    Idempotency,
    InvalidKeyError,
    OutcomeStatus,
    StoreUnavailableError,
    request_hash,
)

CONSUMER = "http-payments"
MAX_KEY_CHARS = 255
MAX_BODY_BYTES = 16 * 1024


@dataclass(frozen=True)
class HttpResult:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def problem(status: int, title: str, detail: str = "") -> HttpResult:
    """An RFC 9457 problem response."""
    return HttpResult(status, {"type": "about:blank", "title": title, "status": status,
                               "detail": detail},
                      {"Content-Type": "application/problem+json"})


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


class HttpPaymentService:
    def __init__(self, idempotency: Idempotency, payments: PaymentProcessor) -> None:
        self.idempotency = idempotency
        self.payments = payments

    def handle(self, headers: Mapping[str, str], body: bytes) -> HttpResult:
        raw_key = _header(headers, "Idempotency-Key")
        if raw_key is None or not raw_key.strip():
            return problem(400, "Idempotency-Key header is required",
                           "Send a unique key (e.g. a UUID) and reuse it on retries.")
        raw_key = raw_key.strip().strip('"')
        if len(raw_key) > MAX_KEY_CHARS:
            return problem(400, "Idempotency-Key is too long", f"at most {MAX_KEY_CHARS} characters")
        try:
            key = DedupKey.from_business_key(CONSUMER, raw_key, field="Idempotency-Key")
            request = parse_json_object(body, max_bytes=MAX_BODY_BYTES)
            payment = payment_from(DedupKey.from_business_key("http-ledger", raw_key,
                                                              field="Idempotency-Key"),
                                   str(request.get("type", "")), request)
        except InvalidKeyError as error:
            return problem(400, "Invalid Idempotency-Key", str(error))
        except InvalidMessageError as error:
            return problem(400, error.reason, error.detail)

        def process() -> dict[str, Any]:
            ledger = self.payments.apply(payment, {"idempotency_key": raw_key})
            if ledger.status is OutcomeStatus.CONFLICT:
                raise InvalidMessageError("LedgerConflict", "ledger key reused with other content")
            return {"status": 201, "body": {"accountId": payment.account_id,
                                            "amountCents": payment.amount_cents,
                                            "balanceCents": ledger.result["balanceCents"],
                                            "idempotencyKey": raw_key}}

        try:
            outcome = self.idempotency.run(key, request_hash(request), process)
        except (StoreUnavailableError, ConcurrencyRetriesExhaustedError) as error:
            result = problem(503, "Try again later", str(error))
            return HttpResult(503, result.body, {**result.headers, "Retry-After": "1"})
        except InvalidMessageError as error:
            return problem(422, error.reason, error.detail)
        if outcome.status is OutcomeStatus.CONFLICT:
            return problem(422, "Idempotency-Key reused with a different request body",
                           "Use a new key for a new request.")
        if outcome.status is OutcomeStatus.IN_PROGRESS:
            result = problem(409, "A request with this Idempotency-Key is being processed",
                             "Retry after it completes.")
            return HttpResult(409, result.body, {**result.headers, "Retry-After": "1"})
        stored = outcome.result
        headers_out = {"Content-Type": "application/json"}
        if outcome.status is OutcomeStatus.DUPLICATE:
            headers_out["Idempotent-Replayed"] = "true"
        return HttpResult(int(stored["status"]), stored["body"], headers_out)
