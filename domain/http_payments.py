"""POST /api/payments with an `Idempotency-Key` header (IETF httpapi Idempotency-Key draft).

First request: processed, response stored. Retry with the same key and body:
the stored response, marked `Idempotent-Replayed: true`. Same key, different
body: 422. Same key while the first request is still running: 409. No key:
400. The key is also passed down to the ledger write (the payments processor's
single-event entry point), so the balance changes once even if this layer's
record were lost.

Keys are scoped per caller, as the draft and the APIs people know (Stripe)
scope them: a key another caller already used is a new key for this one, so
no caller can read another's stored response or learn that a key exists. The
caller is whoever the request says authenticated it: the header named by
`caller_header` (a front end such as API Management sets it and must
overwrite any client-sent copy), else App Service authentication's client
principal (`X-MS-CLIENT-PRINCIPAL-IDP` + `-ID`, or the base64 JSON
`X-MS-CLIENT-PRINCIPAL`), which the platform sets and strips from client
requests when authentication is on. A request without either is in the
shared scope of every unidentified caller (function keys alone identify no
one). Were authentication off, a client could send those headers itself, yet
it would only pick a scope, never see more than the shared scope shows.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
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
LEDGER_CONSUMER = "http-ledger"
MAX_KEY_CHARS = 255
MAX_BODY_BYTES = 16 * 1024
MAX_CALLER_CHARS = 1024
MAX_PRINCIPAL_CHARS = 16 * 1024
# App Service authentication (Easy Auth) request headers.
PRINCIPAL_ID = "X-MS-CLIENT-PRINCIPAL-ID"
PRINCIPAL_IDP = "X-MS-CLIENT-PRINCIPAL-IDP"
PRINCIPAL = "X-MS-CLIENT-PRINCIPAL"
# Claims of X-MS-CLIENT-PRINCIPAL that name the caller, most specific first (Entra object id,
# then the provider's subject); Static Web Apps' form carries `userId` instead.
ID_CLAIMS = ("http://schemas.microsoft.com/identity/claims/objectidentifier", "oid",
             "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/nameidentifier", "sub")
# C0 controls and DEL: not allowed in an HTTP field value (RFC 9110 5.5). The scope separator is
# one of them, so no key a client can send ever looks like a scoped one.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SCOPE_SEPARATOR = "\x1f"


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


class CallerError(ValueError):
    """The request's caller identity headers cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Caller:
    """Who sent a request: where the identity came from (a header, an identity provider) and
    the id it gives. Ids of different sources never share a scope."""

    source: str
    id: str

    @property
    def scope(self) -> str:
        """The caller as text (JSON: unambiguous for any source and id)."""
        return json.dumps([self.source, self.id], ensure_ascii=False, separators=(",", ":"))


def _easy_auth_principal(encoded: str) -> Caller:
    """The caller named by a base64 JSON `X-MS-CLIENT-PRINCIPAL` (App Service's or Static Web
    Apps' form)."""
    try:
        principal = json.loads(base64.b64decode(encoded.strip(), validate=True))
    except (binascii.Error, ValueError) as error:
        raise CallerError(f"{PRINCIPAL} is not base64-encoded JSON") from error
    if not isinstance(principal, dict):
        raise CallerError(f"{PRINCIPAL} is not a JSON object")
    if isinstance(principal.get("userId"), str) and principal["userId"]:  # Static Web Apps
        return Caller(f"easyauth:{principal.get('identityProvider', '')}", principal["userId"])
    claims = principal.get("claims")
    found = {}
    if isinstance(claims, list):
        found = {c.get("typ"): c.get("val") for c in claims if isinstance(c, dict)}
    for claim in ID_CLAIMS:
        value = found.get(claim)
        if isinstance(value, str) and value:
            return Caller(f"easyauth:{principal.get('auth_typ', '')}", value)
    raise CallerError(f"{PRINCIPAL} carries no caller id claim ({', '.join(ID_CLAIMS)})")


def caller_of(headers: Mapping[str, str], *, caller_header: str | None = None) -> Caller | None:
    """The caller the request identifies, or None (the shared scope).

    The configured header wins: a front end that authenticates callers and calls the app with
    one identity of its own names the real caller there. Raises CallerError for identity
    headers that are present but unreadable.
    """
    if caller_header:
        value = (_header(headers, caller_header) or "").strip()
        if value:
            if len(value) > MAX_CALLER_CHARS:
                raise CallerError(f"{caller_header} is longer than {MAX_CALLER_CHARS} characters")
            return Caller(f"header:{caller_header.lower()}", value)
    principal_id = (_header(headers, PRINCIPAL_ID) or "").strip()
    if principal_id:
        if len(principal_id) > MAX_CALLER_CHARS:
            raise CallerError(f"{PRINCIPAL_ID} is longer than {MAX_CALLER_CHARS} characters")
        return Caller(f"easyauth:{(_header(headers, PRINCIPAL_IDP) or '').strip()}", principal_id)
    principal = _header(headers, PRINCIPAL)
    if principal and principal.strip():
        if len(principal) > MAX_PRINCIPAL_CHARS:
            raise CallerError(f"{PRINCIPAL} is longer than {MAX_PRINCIPAL_CHARS} characters")
        return _easy_auth_principal(principal)
    return None


def scoped_key(caller: Caller | None, raw_key: str) -> str:
    """The dedup key text of `raw_key` in the caller's scope.

    Without a caller: the key itself (the shared scope, and the form records stored before
    callers were told apart keep). With one: the caller, a control-character separator no
    HTTP header value contains, then the key, so two callers' keys never meet and never meet
    a shared-scope key. DedupKey escapes it into a store-safe id.
    """
    return raw_key if caller is None else f"{caller.scope}{_SCOPE_SEPARATOR}{raw_key}"


class HttpPaymentService:
    def __init__(self, idempotency: Idempotency, payments: PaymentProcessor, *,
                 caller_header: str | None = None) -> None:
        self.idempotency = idempotency
        self.payments = payments
        self.caller_header = caller_header

    def handle(self, headers: Mapping[str, str], body: bytes) -> HttpResult:
        raw_key = _header(headers, "Idempotency-Key")
        if raw_key is None or not raw_key.strip():
            return problem(400, "Idempotency-Key header is required",
                           "Send a unique key (e.g. a UUID) and reuse it on retries.")
        raw_key = raw_key.strip().strip('"')
        if len(raw_key) > MAX_KEY_CHARS:
            return problem(400, "Idempotency-Key is too long", f"at most {MAX_KEY_CHARS} characters")
        if _CONTROL.search(raw_key):
            return problem(400, "Invalid Idempotency-Key",
                           "control characters are not allowed in an HTTP field value")
        try:
            caller = caller_of(headers, caller_header=self.caller_header)
        except CallerError as error:
            return problem(400, "Unreadable caller identity", str(error))
        scoped = scoped_key(caller, raw_key)
        try:
            key = DedupKey.from_business_key(CONSUMER, scoped, field="Idempotency-Key")
            request = parse_json_object(body, max_bytes=MAX_BODY_BYTES)
            # The ledger key is scoped alike: another caller's payment under the same key is
            # another payment, not a duplicate of the first.
            payment = payment_from(DedupKey.from_business_key(LEDGER_CONSUMER, scoped,
                                                              field="Idempotency-Key"),
                                   str(request.get("type", "")), request, event_id=raw_key)
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
