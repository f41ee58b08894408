"""`notify` and `audit`: a non-transactional side effect, two-phase, per-consumer scope."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from shared import DedupKey, request_hash
from shared._core.records import RecordState
from simulator.host_inputs import RecordingActions, SentMessage, service_bus_message
from tests.functions.conftest import function
from tests.support.parking import parked_body
from tests.support.services import records

pytestmark = pytest.mark.parametrize("backend", ["table"])  # notifications use Table Storage


def send(name: str, message_id: str | None, body: dict | bytes, delivery_count: int = 1):
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    message = service_bus_message(SentMessage(raw, message_id=message_id, correlation_id="c-9"),
                                  delivery_count=delivery_count)
    actions = RecordingActions()
    function(name)(message=message, message_actions=actions)
    return actions.last


def mid() -> str:
    return f"N-{uuid.uuid4().hex[:10]}"


def test_both_subscriptions_process_the_same_message_once_each(services, api, backend):
    message_id, body = mid(), {"to": "a@example.com", "text": "shipped"}
    assert send("notify", message_id, body)[0] == "complete"
    assert send("audit", message_id, body)[0] == "complete"
    assert send("notify", message_id, body, delivery_count=2)[0] == "complete"  # redelivery
    assert send("audit", message_id, body, delivery_count=2)[0] == "complete"
    assert sorted(api.keys()) == sorted([f"audit|{message_id}", f"notify|{message_id}"])
    channels = sorted(call[1]["channel"] for call in api.requests)
    assert channels == ["audit", "notify"]
    headers = api.requests[0][2]
    assert headers["X-Correlation-Id"] == "c-9"


def test_api_failure_releases_the_claim_and_abandons_then_redelivery_sends(services, api, backend):
    message_id = mid()
    api.status = 503
    assert send("notify", message_id, {"text": "x"})[0] == "abandon"
    api.status = None
    assert send("notify", message_id, {"text": "x"}, delivery_count=2)[0] == "complete"
    assert api.keys().count(f"notify|{message_id}") == 2  # retried with the same key


def test_api_rejection_dead_letters(services, api, backend):
    api.status = 400
    action, reason, _ = send("notify", mid(), {"text": "x"})
    assert (action, reason) == ("deadletter", "NotificationRejected")


def _stale_claim(services, message_id: str, body: dict, clock) -> None:
    """An earlier attempt claimed the key and died mid-call; its lease has run out."""
    idem = records(services)
    idem.claim(DedupKey.from_message_id("notify", message_id), request_hash(body))
    clock.advance(idem.config.lease.total_seconds() + 1)


def test_stale_record_is_resent_with_the_same_key_when_the_api_honours_it(services, api, clock,
                                                                          backend):
    message_id, body = mid(), {"text": "hello"}
    _stale_claim(services, message_id, body, clock)
    assert send("notify", message_id, body, delivery_count=2)[0] == "complete"
    assert api.keys() == [f"notify|{message_id}"]


def test_stale_record_is_parked_for_a_person_when_the_api_does_not_honour_keys(
        services_for, api, clock, backend):
    services = services_for(backend, NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY="false")
    message_id, body = mid(), {"text": "hello"}
    _stale_claim(services, message_id, body, clock)
    assert send("notify", message_id, body, delivery_count=2) == ("complete", None, None)
    assert api.requests == []  # nothing re-sent blindly
    parked = parked_body(services.parking, "notify", message_id)
    assert parked["reason"] == "StaleInProgress"
    encoded = DedupKey("notify", message_id).encoded
    record = services.stores["notifications"].get_record(encoded, encoded)
    assert record.state is RecordState.COMPLETED  # closed: not left in progress
    assert send("notify", message_id, body, delivery_count=3)[0] == "complete"
    assert api.requests == []


def test_live_in_progress_elsewhere_leaves_the_message_for_the_lock_to_expire(services, api, backend):
    message_id, body = mid(), {"text": "busy"}
    records(services).claim(DedupKey.from_message_id("notify", message_id),
                                      request_hash(body))
    # Not abandoned (that would redeliver at once and burn the delivery count): left
    # unsettled, it comes back after the lock duration.
    assert send("notify", message_id, body)[0] == "unsettled"
    assert api.requests == []


@pytest.mark.parametrize(("message_id", "body", "reason"), [
    (None, {"text": "x"}, "InvalidMessageId"),
    ("N-bad", b"<xml/>", "MalformedJson"),
    ("N-big", b"{" + b" " * (64 * 1024) + b"}", "PayloadTooLarge"),
])
def test_bad_notification_input_is_dead_lettered(services, api, backend, message_id, body, reason):
    assert send("notify", message_id, body)[:2] == ("deadletter", reason)
    assert api.requests == []


def test_reused_message_id_with_other_content_is_dead_lettered(services, api, backend):
    message_id = mid()
    send("notify", message_id, {"text": "one"})
    assert send("notify", message_id, {"text": "two"})[:2] == ("deadletter", "IdempotencyKeyConflict")
    assert len(api.requests) == 1


def test_lease_follows_the_lock(services, backend):
    lock = services.settings.window.lock_duration
    assert records(services).config.lease == timedelta(seconds=54) < lock


def test_a_crashed_holder_is_taken_over_at_the_next_delivery(services, api, backend, clock):
    """The lease is shorter than the lock: when the broker redelivers (one lock duration after
    the crashed delivery), the key is free, so no delivery is burnt waiting for it."""
    message_id, body = mid(), {"notificationId": "n-crash", "text": "hi"}
    idem = records(services)
    idem.claim(DedupKey("notify", message_id), request_hash(body))  # delivery 1 dies mid-call
    clock.advance(services.settings.window.lock_duration.total_seconds())  # the lock expires
    assert send("notify", message_id, body, delivery_count=2) == ("complete", None, None)
    assert len(api.requests) == 1


@pytest.mark.parametrize("failure", ["timeout", "http-500"])
def test_uncertain_failure_is_parked_not_resent_when_the_api_ignores_keys(
        services_for, api, backend, failure):
    """A timeout or 5xx after the request may have been received: re-sending could notify
    twice, so the claim is kept, parked for a person and closed."""
    services = services_for(backend, NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY="false")
    from domain.notifications import HttpResponse, NotificationRetryError

    def flaky(url, data, headers):
        api(url, data, headers)  # the API received it...
        if failure == "timeout":
            raise NotificationRetryError("timed out")  # ...but the answer never came
        return HttpResponse(500, "oops")

    services.notify.sender = flaky
    message_id, body = mid(), {"text": "once"}
    assert send("notify", message_id, body) == ("complete", None, None)
    parked = parked_body(services.parking, "notify", message_id)
    assert parked["reason"] == "OutcomeUnknown"
    services.notify.sender = api
    assert send("notify", message_id, body, delivery_count=2)[0] == "complete"
    assert api.keys() == [f"notify|{message_id}"]  # no second send


def test_connection_refused_is_safe_to_retry_even_without_key_support(services_for, api, backend):
    services = services_for(backend, NOTIFICATION_API_HONOURS_IDEMPOTENCY_KEY="false")
    from domain.notifications import NotificationNotSentError

    def refused(url, data, headers):
        raise NotificationNotSentError("connection refused")

    services.notify.sender = refused
    message_id = mid()
    assert send("notify", message_id, {"text": "x"})[0] == "abandon"
    services.notify.sender = api
    assert send("notify", message_id, {"text": "x"}, delivery_count=2)[0] == "complete"
    assert api.keys() == [f"notify|{message_id}"]
