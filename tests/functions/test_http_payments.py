"""POST /api/payments with Idempotency-Key, through the registered HTTP function."""

from __future__ import annotations

import json
import uuid

import azure.functions as func

from domain.payments import ACCOUNT_DOCUMENT
from shared import DedupKey, request_hash, store_safe_id
from tests.functions.conftest import function


def post(body: dict | bytes, key: str | None) -> func.HttpResponse:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    request = func.HttpRequest("POST", "/api/payments", headers=headers, body=raw)
    return function("http_payments")(req=request)


def payment(account: str, cents: int = 250) -> dict:
    return {"type": "payment.credit", "accountId": account, "amountCents": cents}


def test_first_request_processes_and_a_retry_gets_the_stored_response(services):
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    first = post(payment(account), key)
    assert first.status_code == 201
    again = post(payment(account), key)
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert json.loads(again.get_body()) == json.loads(first.get_body())
    ledger = services.stores["ledger"].read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    assert ledger.body["balanceCents"] == 250


def test_same_key_with_a_different_body_is_422(services):
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    post(payment(account), key)
    response = post(payment(account, 999), key)
    assert response.status_code == 422
    assert response.mimetype == "application/problem+json"


def test_request_while_the_first_is_in_progress_is_409(services):
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    services.http_payments.idempotency.claim(DedupKey("http-payments", key),
                                             request_hash(payment(account)))
    response = post(payment(account), key)
    assert response.status_code == 409 and response.headers["Retry-After"] == "1"


def test_missing_or_oversized_key_and_bad_bodies_are_400(services):
    assert post(payment("a"), None).status_code == 400
    assert post(payment("a"), "k" * 300).status_code == 400
    assert post(b"{nope", str(uuid.uuid4())).status_code == 400
    assert post({"type": "payment.credit", "accountId": "a"}, str(uuid.uuid4())).status_code == 400
