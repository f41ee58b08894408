"""The settlement rule every trigger applies, and Service Bus settlement behind a small interface.

One rule (docs/concepts.md#one-settlement-rule): what reads the message alone (parse, key,
content, partition) and fails is the message's fault, refused at once with a reason
(`derived`); a reused key is refused; a transient failure is retried; anything else a user
function raises is retried to the trigger's delivery limit (`decision_for_exception`).

The app settles explicitly (`auto_complete_messages=False`) so a key conflict can be
dead-lettered with a reason instead of completed or retried; the Functions host injects
`ServiceBusMessageActions`, the simulator and the tests their own `MessageActions`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from shared._core.exceptions import (
    ConcurrencyRetriesExhaustedError,
    DispatchRejectedError,
    DispatchUnavailableError,
    EffectUncertainError,
    InvalidKeyError,
    PoisonMessageError,
    StoreRequestError,
    StoreUnavailableError,
)
from shared._core.records import Outcome, OutcomeStatus
from shared._core.telemetry import EVENT_CONFLICT, Telemetry

MAX_DESCRIPTION_CHARS = 4000
logger = logging.getLogger(__name__)


class MessageActions(Protocol):
    """What the app needs from ServiceBusMessageActions."""

    def complete(self, message: Any) -> None: ...

    def abandon(self, message: Any) -> None: ...

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None: ...


class Action(enum.StrEnum):
    COMPLETE = "complete"
    ABANDON = "abandon"  # redeliver now: a transient failure
    WAIT = "wait"  # leave unsettled: redelivered when the lock expires (another consumer is busy)
    DEADLETTER = "deadletter"  # never retry blindly: a reason says why


@dataclass(frozen=True)
class Decision:
    """How one message is to be settled, decided by the domain code."""

    action: Action
    reason: str | None = None
    description: str | None = None
    outcome: str | None = None  # the dedup outcome behind it, for logs and tests

    @classmethod
    def complete(cls, outcome: str | None = None) -> Decision:
        return cls(Action.COMPLETE, outcome=outcome)

    @classmethod
    def abandon(cls, reason: str, description: str = "") -> Decision:
        return cls(Action.ABANDON, reason, description)

    @classmethod
    def wait(cls, reason: str, description: str = "") -> Decision:
        """Leave unsettled: it comes back after the lock duration, where abandoning would
        redeliver at once and burn the delivery count."""
        return cls(Action.WAIT, reason, description)

    @classmethod
    def deadletter(cls, reason: str, description: str, outcome: str | None = None) -> Decision:
        return cls(Action.DEADLETTER, reason, description, outcome)


def decision_for(outcome: Outcome) -> Decision:
    """How to settle a message after the dedup flow: done now or before = complete; the key
    reused for other content = dead-letter with both hashes; held by a live consumer = wait for
    the lock; an attempt that died mid-effect and was not taken over (STALE) = dead-letter.
    """
    key = outcome.key
    if outcome.status is OutcomeStatus.CONFLICT:
        return Decision.deadletter(
            "IdempotencyKeyConflict",
            f"key {key.key!r} ({key.encoded}) was processed with request hash "
            f"{outcome.stored_hash}; this message has {outcome.request_hash}",
            outcome.status.value)
    if outcome.should_ack:
        return Decision.complete(outcome.status.value)
    if outcome.status is OutcomeStatus.STALE:
        return Decision.deadletter(
            "StaleInProgress", f"an attempt on {key.encoded} died mid-effect and its outcome is "
            "unknown: reconcile it with the downstream, then resubmit", outcome.status.value)
    return Decision.wait("InProgress", f"{key.encoded} is being processed elsewhere")


#: Failures that retrying can fix: never a reason to dead-letter a valid message. A dispatch the
#: broker refused (no such entity, not authorised) is an operator's to fix, not the message's:
#: its messages stay pending on the committed marker and the message is retried like an outage.
TRANSIENT_ERRORS = (StoreUnavailableError, ConcurrencyRetriesExhaustedError,
                    DispatchUnavailableError, DispatchRejectedError)
#: Deliveries retried at once after a transient failure (a blip); later ones wait for the lock.
FAST_RETRIES = 1


def transient(reason: str, detail: str, *, delivery_count: int) -> Decision:
    """Retry a valid message after a transient failure without running out its delivery count:
    abandoned on its first delivery (most blips are over by then), later left to its lock, so an
    outage costs at most one delivery per lock duration instead of all of them in milliseconds.
    """
    if delivery_count <= FAST_RETRIES:
        return Decision.abandon(reason, detail)
    return Decision.wait(reason, detail)


def decision_for_error(error: Exception, *, delivery_count: int = 1) -> Decision | None:
    """The settlement for a store failure (transient = retry, never dead-letter; rejected for
    good = dead-letter), or None when `error` is not one."""
    if isinstance(error, TRANSIENT_ERRORS):
        return transient("Transient", str(error), delivery_count=delivery_count)
    if isinstance(error, StoreRequestError):
        return Decision.deadletter("StoreRejected", str(error))
    return None


def derived[R](what: str, derive: Callable[[], R]) -> R:
    """A value derived from the message alone (`what`: parse, key, content, partition): any
    failure is the message's, for good, and raises `refusal`'s PoisonMessageError."""
    try:
        return derive()
    except Exception as error:
        raise refusal(what, error) from error


def refusal(what: str, error: Exception) -> PoisonMessageError:
    """The refusal for `error`, raised while deriving `what` from a message: its own, `InvalidKey`,
    or `InvalidMessage` naming the step."""
    if isinstance(error, PoisonMessageError):
        return error
    if isinstance(error, InvalidKeyError):
        return PoisonMessageError("InvalidKey", str(error))
    return PoisonMessageError("InvalidMessage", f"{what}: {type(error).__name__}: {error}")


def decision_for_exception(error: Exception, *, delivery_count: int = 1) -> Decision:
    """The settlement after the dedup flow or a user function raised: bad input, an effect
    nobody knows happened (`OutcomeUnknown`) and a request the store refuses are refused for
    good; a transient failure and any other exception (`UnexpectedError`) are retried."""
    if isinstance(error, PoisonMessageError):
        return Decision.deadletter(error.reason, error.detail)
    if isinstance(error, InvalidKeyError):
        return Decision.deadletter("InvalidKey", str(error))
    if isinstance(error, EffectUncertainError):
        return Decision.deadletter("OutcomeUnknown", f"{error}; reconcile it before resubmitting")
    return decision_for_error(error, delivery_count=delivery_count) or transient(
        "UnexpectedError", f"{type(error).__name__}: {error}", delivery_count=delivery_count)


def decision_for_result(result: Outcome | Decision | None) -> Decision:
    """The settlement a handler answered for: a `Decision` as it is, an `Outcome` by
    `decision_for`, None: complete."""
    if result is None:
        return Decision.complete()
    if isinstance(result, Decision):
        return result
    return decision_for(result)


def decision_after(error: BaseException, *, consumer: str, delivery_count: int = 1,
                   context: Mapping[str, Any] | None = None) -> Decision:
    """`decision_for_exception`, logged. A BaseException that is not an Exception
    (cancellation, exit) is raised again."""
    if not isinstance(error, Exception):
        raise error
    decision = decision_for_exception(error, delivery_count=delivery_count)
    extra = dict(context or {})
    if decision.reason == "UnexpectedError":
        logger.error("%s: unexpected error; the message is retried", consumer, exc_info=error,
                     extra=extra)
    elif decision.reason in ("Transient", "StoreRejected"):
        logger.warning("%s: %s: %s", consumer, "store rejected the request"
                       if decision.action is Action.DEADLETTER
                       else f"transient failure, {decision.action.value}", error, extra=extra)
    return decision


def report_dead_letter(telemetry: Telemetry, consumer: str, decision: Decision,
                       context: Mapping[str, Any]) -> None:
    """One alert event per dead-letter a consumer decides (a conflict has its own)."""
    if decision.reason != EVENT_CONFLICT:
        telemetry.dead_lettered(consumer=consumer, reason=decision.reason or "",
                                context={**context, "error": (decision.description or "")[:500]})


def settle(decision: Decision, message: Any, actions: MessageActions) -> None:
    """Apply a decision to a received message."""
    if decision.action is Action.COMPLETE:
        actions.complete(message)
    elif decision.action is Action.ABANDON:
        actions.abandon(message)
    elif decision.action is Action.WAIT:
        return  # the lock runs out; the broker redelivers after the lock duration
    else:
        actions.deadletter(message, deadletter_reason=decision.reason,
                           deadletter_error_description=(decision.description or "")
                           [:MAX_DESCRIPTION_CHARS])
