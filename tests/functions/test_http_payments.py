"""POST /api/payments with Idempotency-Key, through the registered HTTP function."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import azure.functions as func
import pytest

from domain.payments import ACCOUNT_DOCUMENT
from shared import DedupKey, request_hash
from shared._core.keys import store_safe_id
from tests.functions.conftest import function

ROOT = Path(__file__).resolve().parents[2]


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
    services.http_payments.endpoint.idempotency.claim(DedupKey("http-payments", key),
                                             request_hash(payment(account)))
    response = post(payment(account), key)
    assert response.status_code == 409 and response.headers["Retry-After"] == "1"


@pytest.mark.parametrize("failure", ["broker down", "sent, answer lost"])
def test_a_failed_or_unconfirmed_balance_changed_send_is_503_and_the_retry_applies_it_once(
        services, failure):
    """The payment's BalanceChanged goes out through the outbox after the ledger commits: a send
    the broker refused or did not confirm is transient, like a store outage (503 problem+json
    with Retry-After); it used to escape as a 500."""
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    if failure == "broker down":
        services.dispatcher.fail_next()
    else:
        services.dispatcher.accept_then_fail_next()
    response = post(payment(account), key)
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert response.mimetype == "application/problem+json"
    problem = json.loads(response.get_body())
    assert (problem["type"], problem["title"], problem["status"]) == (
        "about:blank", "Service Unavailable", 503)
    retried = post(payment(account), key)
    assert retried.status_code == 201
    ledger = services.stores["ledger"].read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    assert ledger.body["balanceCents"] == 250  # applied once
    sent = [m for m in services.dispatcher.sent if account.encode() in m.body]
    assert len({m.message_id for m in sent}) == 1  # one BalanceChanged (a re-send has its id)


def test_problem_types_are_the_documented_ones_with_titles_that_do_not_vary(services):
    from shared._triggers.http import PROBLEMS

    docs = (ROOT / "docs" / "http.md").read_text("utf-8")
    for response, slug in ((post(payment("a"), None), "idempotency-key-missing"),
                           (post(b"[1]", str(uuid.uuid4())), "request-invalid")):
        problem = json.loads(response.get_body())
        assert problem["type"].rsplit("/", 1)[-1] == slug
        assert problem["title"] == PROBLEMS[slug][1]
        assert f"{{#{slug}}}" in docs or f'id="{slug}"' in docs, f"docs/http.md has no {slug} section"


def test_missing_or_oversized_key_and_bad_bodies_are_400(services):
    assert post(payment("a"), None).status_code == 400
    assert post(payment("a"), "k" * 300).status_code == 400
    assert post(b"{nope", str(uuid.uuid4())).status_code == 400
    assert post({"type": "payment.credit", "accountId": "a"}, str(uuid.uuid4())).status_code == 400


# -- Keys are scoped per caller ---------------------------------------------------------------
def post_as(body: dict, key: str, caller: dict[str, str]) -> func.HttpResponse:
    headers = {"Content-Type": "application/json", "Idempotency-Key": key, **caller}
    request = func.HttpRequest("POST", "/api/payments", headers=headers,
                               body=json.dumps(body).encode())
    return function("http_payments")(req=request)


def easy_auth(object_id: str) -> dict[str, str]:
    """The headers App Service authentication sets for an Entra ID caller."""
    return {"X-MS-CLIENT-PRINCIPAL-IDP": "aad", "X-MS-CLIENT-PRINCIPAL-ID": object_id}


def principal(object_id: str) -> dict[str, str]:
    """Only the base64 JSON principal (as the platform encodes it)."""
    claims = [{"typ": "http://schemas.microsoft.com/identity/claims/objectidentifier",
               "val": object_id}, {"typ": "name", "val": "someone"}]
    encoded = base64.b64encode(json.dumps({"auth_typ": "aad", "claims": claims,
                                           "name_typ": "name", "role_typ": "roles"}).encode())
    return {"X-MS-CLIENT-PRINCIPAL": encoded.decode()}


def balance_of(services, account: str) -> int:
    document = services.stores["ledger"].read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    return 0 if document is None else int(document.body["balanceCents"])


@pytest.mark.parametrize("identify", [easy_auth, principal], ids=["principal-id", "principal-json"])
def test_another_callers_key_is_a_new_key_for_this_caller(services, identify):
    """B sending A's key gets B's own outcome: with A's body, B's own payment (201, B's
    balance); with another body, B's payment too (not 422: B learns nothing of A's key)."""
    alice, bob = f"acct-a-{uuid.uuid4().hex[:6]}", f"acct-b-{uuid.uuid4().hex[:6]}"
    key = str(uuid.uuid4())
    a = post_as(payment(alice, 700), key, identify("oid-alice"))
    assert a.status_code == 201 and json.loads(a.get_body())["balanceCents"] == 700

    same_body = post_as(payment(alice, 700), key, identify("oid-bob"))
    assert same_body.status_code == 201 and "Idempotent-Replayed" not in same_body.headers
    assert json.loads(same_body.get_body())["balanceCents"] == 1400  # B's payment, applied
    other_body = post_as(payment(bob, 50), key, identify("oid-carol"))
    assert other_body.status_code == 201
    assert json.loads(other_body.get_body()) == {"accountId": bob, "amountCents": 50,
                                                 "balanceCents": 50, "idempotencyKey": key}
    assert (balance_of(services, alice), balance_of(services, bob)) == (1400, 50)

    # Each caller's retry still replays its own stored response, and only its own.
    again = post_as(payment(alice, 700), key, identify("oid-alice"))
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert json.loads(again.get_body()) == json.loads(a.get_body())
    carol = post_as(payment(bob, 50), key, identify("oid-carol"))
    assert carol.headers["Idempotent-Replayed"] == "true"
    assert json.loads(carol.get_body()) == json.loads(other_body.get_body())
    assert post_as(payment(bob, 999), key, identify("oid-carol")).status_code == 422  # own key
    # Unidentified callers (function keys only) share a scope of their own: A's key is new there.
    anonymous = post(payment(alice, 1), key)
    assert anonymous.status_code == 201 and "Idempotent-Replayed" not in anonymous.headers
    assert balance_of(services, alice) == 1401


def test_the_same_id_from_two_identity_providers_is_two_callers(services):
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    post_as(payment(account), key, {"X-MS-CLIENT-PRINCIPAL-IDP": "aad", "X-MS-CLIENT-PRINCIPAL-ID": "42"})
    other = post_as(payment(account), key, {"X-MS-CLIENT-PRINCIPAL-IDP": "github",
                                            "X-MS-CLIENT-PRINCIPAL-ID": "42"})
    assert other.status_code == 201 and "Idempotent-Replayed" not in other.headers
    assert balance_of(services, account) == 500


def test_a_configured_caller_header_scopes_keys_and_wins_over_the_front_ends_identity(
        services_for, backend):
    """API Management authenticates callers, calls the app with one identity of its own and
    names the caller in a header it sets (HTTP_CALLER_HEADER)."""
    services = services_for(backend, HTTP_CALLER_HEADER="X-Caller-Id")
    account, key = f"acct-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    front_end = easy_auth("oid-of-api-management")
    first = post_as(payment(account), key, {**front_end, "x-caller-id": "subscription-1"})
    second = post_as(payment(account), key, {**front_end, "X-Caller-Id": "subscription-2"})
    assert first.status_code == second.status_code == 201
    assert "Idempotent-Replayed" not in second.headers and balance_of(services, account) == 500
    replay = post_as(payment(account), key, {**front_end, "X-Caller-Id": "subscription-1"})
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert json.loads(replay.get_body()) == json.loads(first.get_body())


def test_unreadable_identity_headers_and_control_characters_are_400(services):
    key = str(uuid.uuid4())
    for bad in ({"X-MS-CLIENT-PRINCIPAL": "not base64!"},
                {"X-MS-CLIENT-PRINCIPAL": base64.b64encode(b'{"claims": []}').decode()},
                {"X-MS-CLIENT-PRINCIPAL-ID": "x" * 2000}):
        response = post_as(payment("acct-x"), key, bad)
        assert response.status_code == 400, bad
        assert json.loads(response.get_body())["title"] == "Unreadable caller identity"
    assert post(payment("acct-x"), "a\x1fb").status_code == 400
    assert balance_of(services, "acct-x") == 0


def test_the_caller_header_setting_must_be_a_header_name(stack):
    from functions.settings import SettingsError
    from tests.functions.conftest import settings_for

    for bad in ("X Caller", "Idempotency-Key", "a:b"):
        with pytest.raises(SettingsError, match="HTTP_CALLER_HEADER"):
            settings_for(stack, "table", HTTP_CALLER_HEADER=bad)
    assert settings_for(stack, "table", HTTP_CALLER_HEADER=" X-Caller ").http_caller_header == "X-Caller"
