"""Notifications from a Service Bus topic: an HTTP call that cannot join a transaction.

Two-phase record on the Table backend: claim in progress, call the API with
the dedup key as `Idempotency-Key`, mark completed. A stale in-progress record
(the previous attempt died mid-call) is re-sent with the same key when the API
honours idempotency keys; otherwise it is parked for a person and the record
closed, so nothing is sent twice. Two subscriptions (notify, audit) on the
same topic track completion separately: the key is scoped by consumer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from shared import (
    Decision,
    DedupKey,
    EffectUncertainError,
    IdempotencyError,
    IdempotencyRecord,
    InvalidKeyError,
    InvalidPayloadError,
    MessageView,
    Outcome,
    OutcomeStatus,
    aio,
    decision_for_error,
    downstream_headers,
    parse_json_object,
    request_hash,
    transient,
)

MAX_NOTIFICATION_BYTES = 64 * 1024
logger = logging.getLogger(__name__)


class NotificationRejectedError(Exception):
    """The API refused the notification for good (4xx other than 409/429)."""


class NotificationRetryError(Exception):
    """The API failed in a way worth retrying (5xx, 409 in progress, 429, network)."""


class NotificationNotSentError(NotificationRetryError):
    """The request never reached the API (connection refused): retrying is always safe."""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: str


Sender = Callable[[str, bytes, dict[str, str]], HttpResponse]


def urllib_sender(url: str, data: bytes, headers: dict[str, str], timeout: float = 10.0
                  ) -> HttpResponse:
    """POST with the standard library (no extra dependency in the function app)."""
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - URL from settings
            return HttpResponse(response.status, response.read(4096).decode("utf-8", "replace"))
    except urllib.error.HTTPError as error:
        return HttpResponse(error.code, error.read(4096).decode("utf-8", "replace"))
    except urllib.error.URLError as error:
        if isinstance(error.reason, ConnectionRefusedError):
            raise NotificationNotSentError(f"notification API refused: {error}") from error
        raise NotificationRetryError(f"notification API unreachable: {error}") from error
    except (TimeoutError, OSError) as error:  # may have been received: the outcome is unknown
        raise NotificationRetryError(f"no answer from the notification API: {error}") from error


class NotificationService:
    """One subscription's consumer: sends each message's notification once.

    The API call runs on a thread (`urllib`), off the event loop of the async function."""

    def __init__(self, consumer: aio.ServiceBusConsumer, parking: aio.ParkingLot, *,
                 api_url: str, api_honours_key: bool, sender: Sender = urllib_sender) -> None:
        if consumer.idempotency is None:
            raise ValueError("a notification consumer needs an Idempotency")
        self.consumer = consumer
        self.idempotency: aio.Idempotency = consumer.idempotency
        self.parking = parking
        self.api_url = api_url
        self.api_honours_key = api_honours_key
        self.sender = sender

    def _send(self, key: DedupKey, notification: dict[str, Any], message: MessageView
              ) -> dict[str, Any]:
        payload = json.dumps({"channel": self.consumer.name, **notification}).encode("utf-8")
        headers = downstream_headers(key, message.correlation_id,
                                     properties=message.application_properties,
                                     headers={"Content-Type": "application/json"})
        try:
            response = self.sender(self.api_url, payload, headers)
        except NotificationNotSentError:
            raise
        except NotificationRetryError as error:
            self._retry_or_uncertain(str(error))
        if response.status in (409, 429):  # not processed: in progress there, or throttled
            raise NotificationRetryError(f"notification API answered {response.status}")
        if response.status >= 500:
            self._retry_or_uncertain(f"notification API answered {response.status}")
        if response.status >= 400:
            raise NotificationRejectedError(f"notification API answered {response.status}: "
                                            f"{response.body[:200]}")
        return {"status": response.status}

    def _retry_or_uncertain(self, detail: str) -> NoReturn:
        """A failure after the request may have been received: a re-send is safe only
        when the API honours Idempotency-Key; otherwise keep the claim and park."""
        if self.api_honours_key:
            raise NotificationRetryError(detail)
        raise EffectUncertainError(detail)

    async def handle(self, message: Any, actions: Any = None) -> Decision:
        return await self.consumer.process(message, actions, self._notify)

    async def _notify(self, message: MessageView) -> Decision | Outcome:
        context = message.context
        try:
            key = DedupKey.from_message_id(self.consumer.name, message.message_id)
            notification = parse_json_object(message.body, max_bytes=MAX_NOTIFICATION_BYTES)
        except InvalidKeyError as error:
            return Decision.deadletter("InvalidMessageId", str(error))
        except InvalidPayloadError as error:
            return Decision.deadletter(error.reason, error.detail)
        try:
            outcome = await self.idempotency.run(
                key, request_hash(notification),
                lambda: asyncio.to_thread(self._send, key, notification, message),
                takeover_stale=self.api_honours_key, context=context)
        except NotificationRejectedError as error:
            return Decision.deadletter("NotificationRejected", str(error))
        except EffectUncertainError as error:
            record = error.record if isinstance(error.record, IdempotencyRecord) else None
            return await self.park_unresolved(
                record, message.body, context, "OutcomeUnknown",
                f"{error}; the API does not honour Idempotency-Key, so a re-send could notify twice")
        except NotificationRetryError as error:
            return transient("Transient", str(error), delivery_count=message.delivery_count)
        if outcome.status is OutcomeStatus.STALE:
            return await self.park_unresolved(
                outcome.record, message.body, context, "StaleInProgress",
                "previous attempt died mid-call; the API does not honour Idempotency-Key, so "
                "re-sending could notify twice")
        return outcome  # settled by the rule every consumer follows

    async def park_unresolved(self, record: IdempotencyRecord | None, payload: bytes | str,
                              context: dict[str, Any], reason: str, detail: str) -> Decision:
        """An attempt may or may not have reached the API: park it for a person, close the
        record (so no redelivery re-sends), complete the message."""
        if record is None:
            raise ValueError("an unresolved attempt without its record")
        try:
            await self.parking.park_record(self.idempotency.store, record, reason=reason,
                                           payload=payload, error=detail,
                                           now=self.idempotency.config.clock(), context=context)
        except IdempotencyError as error:  # changed meanwhile or store down: re-parked next time
            logger.warning("could not close parked record: %s", error)
            decision = decision_for_error(error, delivery_count=int(context.get("delivery_count") or 1))
            return decision or transient("Transient", str(error),
                                         delivery_count=int(context.get("delivery_count") or 1))
        return Decision.complete("parked")
