"""Hostile input at every entry point: a reason on the first delivery, nothing lost, no 500.

Each body would raise out of a naive `json.loads` (RecursionError, NaN in a
hashed field, a lone surrogate, a 2^63 amount). The triggers must answer it
like any other bad input: Service Bus dead-letters it with a reason at
delivery 1, Event Hubs parks it and applies the rest of the batch, HTTP
answers 400 with a problem+json title.
"""

from __future__ import annotations

import base64
import json
import uuid

import azure.functions as func
import pytest

from domain.payments import ACCOUNT_DOCUMENT
from shared._core.keys import store_safe_id
from simulator.host_inputs import (
    RecordingActions,
    SentEvent,
    SentMessage,
    event_hub_batch,
    service_bus_message,
)
from tests.functions.conftest import function
from tests.support.parking import parked_body

DEEP = b"[" * 5000 + b"]" * 5000
SOURCE = "/payments/hostile"


def _event(event_id: str, data: bytes) -> bytes:
    return (b'{"specversion":"1.0","id":"' + event_id.encode() + b'","source":"' + SOURCE.encode()
            + b'","type":"payment.credit","data":' + data + b"}")


def _event_base64(event_id: str, data: bytes) -> bytes:
    """The same event with its data as `data_base64`: decoded, then the same bounded decoder."""
    return json.dumps({"specversion": "1.0", "id": event_id, "source": SOURCE, "type": "payment.credit",
                       "datacontenttype": "application/json",
                       "data_base64": base64.b64encode(data).decode()}).encode()


HOSTILE_OBJECTS = [  # (JSON text of a field value, expected reason)
    (DEEP, "TooDeeplyNested"),
    (b"NaN", "InvalidNumber"),
    (b"Infinity", "InvalidNumber"),
    (b'"\\ud800"', "InvalidText"),
    (b"1e400", "NumberOutOfRange"),
]


def deliver(name: str, body: bytes, message_id: str = "") -> tuple:
    message = service_bus_message(SentMessage(body, message_id=message_id or f"H-{uuid.uuid4().hex[:8]}"),
                                  delivery_count=1)
    actions = RecordingActions()
    function(name)(message=message, message_actions=actions)  # must not raise
    return actions.last


@pytest.mark.parametrize("name", ["orders", "order_status", "notify", "audit"])
@pytest.mark.parametrize(("value", "reason"), HOSTILE_OBJECTS)
def test_service_bus_consumers_dead_letter_hostile_bodies_on_the_first_delivery(services, api, name,
                                                                              value, reason):
    body = b'{"orderId": "O-1", "customerId": ' + value + b', "version": 1, "status": "paid"}'
    action, dead_letter_reason, _ = deliver(name, body)
    assert (action, dead_letter_reason) == ("deadletter", reason)
    assert api.requests == []


def _balance(services, account: str) -> int | None:
    document = services.stores["ledger"].read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    return None if document is None else document.body["balanceCents"]


@pytest.mark.parametrize(("body", "properties", "reason"), [
    *[(_event("e", b'{"accountId":"a","amountCents":' + value + b"}"), None, reason)
      for value, reason in HOSTILE_OBJECTS],
    *[(_event_base64("e", b'{"accountId":"a","amountCents":' + value + b"}"), None, reason)
      for value, reason in HOSTILE_OBJECTS],
    (_event("e", b'{"accountId":"\\ud800","amountCents":5}'), None, "InvalidText"),
    (_event("e", b'{"accountId":"a","amountCents":9007199254740993}'), None, "NumberOutOfRange"),
    (_event("e", b'{"accountId":"a","amountCents":1000000000000000000000000000000}'), None,
     "NumberOutOfRange"),
    (_event("e", b'{"accountId":"a","amountCents":9223372036854775808}'), None, "NumberOutOfRange"),
    (DEEP, {"ce_specversion": "1.0", "ce_id": "b1", "ce_source": SOURCE,
            "ce_type": "payment.credit"}, "TooDeeplyNested"),
    (b'{"accountId":"a","amountCents":5}', {"ce_specversion": "1.0", "ce_id": "\ud800",
                                            "ce_source": SOURCE, "ce_type": "payment.credit"},
     "InvalidText"),
    (b'{"accountId":"a","amountCents":5}', {"ce_specversion": "1.0", "ce_id": "b3",
                                            "ce_source": SOURCE, "ce_type": "payment.credit",
                                            "ce_ext": [[[1]]]}, "MalformedCloudEvent"),
    (b"{" * 3 + b"x" * (11 * 1024 * 1024), None, "PayloadTooLarge"),
])
def test_hostile_events_are_parked_with_a_reason_and_the_partition_moves_on(services, body,
                                                                           properties, reason):
    account = f"acct-{uuid.uuid4().hex[:8]}"
    partition = uuid.uuid4().hex[:6]
    ok = [SentEvent(_event(f"ok-{n}-{account}", json.dumps({"accountId": account, "amountCents": 5})
                           .encode()), seq) for n, seq in ((1, 1), (2, 3))]
    function("payments")(events=event_hub_batch([ok[0], SentEvent(body, 2, properties), ok[1]],
                                                partition_id=partition))
    assert _balance(services, account) == 10
    parked = parked_body(services.parking, "payments", f"{services.settings.payments_hub}/{partition}/2")
    assert parked["reason"] == reason
    assert services.payments.watermark.read(partition).sequence_number == 3


@pytest.mark.parametrize(("value", "reason"), [
    *HOSTILE_OBJECTS, (b"9007199254740993", "NumberOutOfRange"), (b'"12"', "InvalidPayment")])
def test_http_answers_400_with_a_reason_never_500(services, value, reason):
    body = b'{"type": "payment.credit", "accountId": "a", "amountCents": ' + value + b"}"
    request = func.HttpRequest("POST", "/api/payments", body=body,
                               headers={"Idempotency-Key": str(uuid.uuid4()),
                                        "Content-Type": "application/json"})
    response = function("http_payments")(req=request)
    assert response.status_code == 400
    problem = json.loads(response.get_body())
    assert problem["reason"] == reason
    assert problem["title"] == "Invalid request"  # a type's title does not vary (RFC 9457)
    assert problem["type"].endswith("request-invalid")
