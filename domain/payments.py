"""Payments from Event Hubs: CloudEvents that credit or debit an account balance.

A balance change is not naturally idempotent, so the dedup markers and the
balance update commit in one transaction in the account's partition (the
balance replaced under its etag). A batch's new events are grouped by
account: one transaction per account holds every event's marker (in sequence
order, each with the balance after that event) and one balance write, and
accounts are committed concurrently, up to a bound. A replayed batch is
absorbed by the partition's high-water mark; a producer duplicate (same
source+id at another sequence number) by the per-event key. The instance
remembers the balances and the mark it wrote (re-checked by etag when it
writes them next), so a steady partition costs one transaction per account
and one mark write per batch.

The batch is written once, as a flow of steps (`_batch_flow`):
`PaymentService` runs it with account groups on threads (the HTTP API and
the replay tool use it), `AsyncPaymentService` awaits it with groups as tasks
(the `payments` function).

Transient is not poison: a store outage, throttling or lost races never park
a valid event. The batch raises instead (after waiting out a Retry-After), the
host's retry policy runs it again before the checkpoint, and the mark and the
keys absorb what was done. The wait before it raises is bounded: each try of a
group spends at most the store SDKs' retries (`functions.services.RETRY_BUDGET`)
and waits at most MAX_RETRY_AFTER_SECONDS, so `max_attempts` tries wait at most
`RETRY_BUDGET.unit_seconds(attempts=max_attempts, max_retry_after=...)`.
Only input that can never succeed (invalid, a key reused for other content)
and events that hit a bug are parked.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from domain.messages import InboundEvent, InvalidMessageError, invalid_event, parse_json_object
from shared import (
    DedupKey,
    Idempotency,
    InvalidKeyError,
    Outcome,
    OutcomeStatus,
    request_hash,
    store_safe_id,
)
from shared.aio import AsyncIdempotency, AsyncTransaction
from shared.cloudevents import CloudEvent, InvalidEventError, parse_cloudevent
from shared.exceptions import ConcurrencyRetriesExhaustedError, retry_after
from shared.handler import GroupMessage, Transaction, TransactionWrites
from shared.parking import AsyncParkingLot, ParkingLot
from shared.payload import MAX_SAFE_INTEGER, exact_integer
from shared.settlement import TRANSIENT_ERRORS
from shared.stores.base import Document, adrive, drive
from shared.watermark import AsyncPartitionWatermark, Mark, PartitionWatermark, event_time

CONSUMER = "payments"
ACCOUNT_DOCUMENT = "balance"
EVENT_TYPES = {"payment.credit": 1, "payment.debit": -1}
# Amounts and balances stay within what both stores hold exactly (a Cosmos number is a double):
# an amount up to 10^15 cents; a balance within +-(2^53 - 1). Outside: refused, never rounded.
MAX_AMOUNT_CENTS = 10**15
MAX_EVENT_BYTES = 1024 * 1024
# The longest Retry-After a group waits out before its next try (and the batch before it raises):
# longer waits belong to the host's retry policy, which holds nothing while it backs off. With the
# store SDKs' retries it bounds a throttled batch (functions.services.RETRY_BUDGET).
MAX_RETRY_AFTER_SECONDS = 5.0
logger = logging.getLogger(__name__)


@dataclass
class BatchReport:
    """What one batch did, for logs, tests and the simulator."""

    applied: int = 0
    duplicates: int = 0
    replay_skipped: int = 0
    parked: dict[str, int] = field(default_factory=dict)
    watermark: int | None = None
    accounts: int = 0  # groups committed (one or more transactions each)

    def park(self, reason: str) -> None:
        self.parked[reason] = self.parked.get(reason, 0) + 1


@dataclass(frozen=True)
class Payment:
    key: DedupKey
    account_id: str
    amount_cents: int  # signed: credit > 0, debit < 0
    content: dict[str, Any]


Event = tuple[InboundEvent, Payment]


@dataclass(frozen=True)
class Sleep:
    """A batch flow step: wait (before retrying a group, or for a Retry-After)."""

    seconds: float


@dataclass(frozen=True)
class Gather:
    """A batch flow step: run these account-group flows concurrently (up to the service's
    bound); the answer is their results in order."""

    flows: list[BatchFlow]


#: What a batch flow yields: a call to make (its answer awaited if it is awaitable), a Sleep,
#: or a Gather. PaymentService runs calls inline and groups on threads; AsyncPaymentService
#: awaits them and runs groups as tasks. One definition of the batch for both.
Step = Callable[[], Any] | Sleep | Gather
BatchFlow = Generator[Step, Any, Any]
SETTLED = frozenset({OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER, OutcomeStatus.DUPLICATE,
                     OutcomeStatus.CONFLICT})


def _group_messages(payments: Sequence[Payment], contexts: Sequence[Mapping[str, Any] | None]
                    ) -> list[GroupMessage]:
    return [GroupMessage(p.key, request_hash(p.content), context)
            for p, context in zip(payments, contexts, strict=True)]


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
                 backoff: float = 0.2, max_concurrency: int = 16,
                 max_retry_after: float = MAX_RETRY_AFTER_SECONDS,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.ledger = ledger
        self.watermark = watermark
        self.parking = parking
        self.event_hub = event_hub
        self.missing_key_policy = missing_key_policy
        self.max_attempts = max_attempts  # tries per account group before the batch raises
        self.backoff = backoff
        self.max_concurrency = max_concurrency  # account groups committed at the same time
        self.max_retry_after = max_retry_after
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
    def _post(self, tx: Transaction, account_id: str, amounts: Sequence[int]) -> list[dict[str, int]]:
        """Add `amounts` to the account's balance in order: one write, the balance after each."""
        return self._posting(tx, account_id, amounts, tx.read(ACCOUNT_DOCUMENT))

    @staticmethod
    def _posting(tx: TransactionWrites, account_id: str, amounts: Sequence[int],
                 account: Document | None) -> list[dict[str, int]]:
        balance = int(account.body["balanceCents"]) if account else 0
        results = []
        for amount in amounts:
            balance += amount
            if abs(balance) > MAX_SAFE_INTEGER:  # a Cosmos number would round it: refuse instead
                raise InvalidMessageError("BalanceOutOfRange",
                                          f"balance of {account_id} would be {balance}")
            results.append({"balanceCents": balance})
        body = {"accountId": account_id, "balanceCents": balance, "kind": "account"}
        if account is None:
            tx.create(ACCOUNT_DOCUMENT, body)
        else:
            tx.replace(ACCOUNT_DOCUMENT, body, etag=account.etag)
        return results

    def apply(self, payment: Payment, context: Mapping[str, Any] | None = None) -> Outcome:
        """One payment: marker + balance update in one transaction (etag-guarded; rebuilt on a
        race). The HTTP path, and the fallback for a group that failed on a bad event."""
        return self.ledger.run_atomic(
            payment.key, request_hash(payment.content),
            lambda tx: self._post(tx, payment.account_id, [payment.amount_cents])[0],
            partition=store_safe_id(payment.account_id), context=context)

    def apply_group(self, payments: Sequence[Payment],
                    contexts: Sequence[Mapping[str, Any] | None]) -> list[Outcome]:
        """Payments of one account, in order: their markers and one balance write per
        transaction, each marker keeping the balance after its payment."""
        account = payments[0].account_id
        return self.ledger.run_atomic_group(
            _group_messages(payments, contexts), lambda tx, indexes: self._post(
                tx, account, [payments[i].amount_cents for i in indexes]),
            partition=store_safe_id(account))

    # -- batch ----------------------------------------------------------------------------
    def process_batch(self, events: list[InboundEvent], partition_id: str) -> BatchReport:
        """Apply a batch from one partition: one group per account, accounts concurrently.

        The mark moves only after every group committed or was parked. When a
        group failed for a transient reason, the batch raises once every group
        has finished (after waiting out a Retry-After) so the host retries it.
        """
        return drive(self._batch_flow(events, partition_id), self._perform)

    def _perform(self, step: Step) -> Any:
        """One step of a batch flow, on threads: account groups run on a bounded pool, each
        in a copy of the caller's context (trace, the worker's invocation id)."""
        if isinstance(step, Sleep):
            return self.sleep(step.seconds)
        if not isinstance(step, Gather):
            return step()
        workers = min(self.max_concurrency, len(step.flows))
        if workers <= 1:
            return [drive(flow, self._perform) for flow in step.flows]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="payments") as pool:
            futures = [pool.submit(contextvars.copy_context().run, drive, flow, self._perform)
                       for flow in step.flows]
            return [future.result() for future in futures]

    def _batch_flow(self, events: list[InboundEvent], partition_id: str) -> BatchFlow:
        """The batch, written once for the sync and async services: it yields its I/O
        (a call, a Sleep, a Gather of account groups) and the service's driver runs it."""
        report = BatchReport()
        mark = yield partial(self.watermark.read, partition_id)
        fresh = sorted((e for e in events if mark is None
                        or not mark.covers(e.sequence_number, e.enqueued_time)),
                       key=lambda e: e.sequence_number)
        # Below the mark yet newer: the hub restarted its numbers (recreated, failed over).
        reset = next((e for e in fresh if mark is not None
                      and mark.is_reset(e.sequence_number, e.enqueued_time)), None)
        report.replay_skipped = len(events) - len(fresh)
        self.ledger.telemetry.replay_skipped(report.replay_skipped, consumer=CONSUMER,
                                             partition_id=partition_id)
        groups, invalid = self._groups(fresh, partition_id)
        for event, reason, detail in invalid:
            yield from self._park(event, partition_id, reason, detail, report)
        report.accounts = len(groups)
        outcomes = yield Gather([self._group_flow(group, partition_id) for group in groups])
        failure: Exception | None = None
        for group, results in zip(groups, outcomes, strict=True):
            if isinstance(results, Exception):
                failure = failure or results
                continue
            for (event, payment), result in zip(group, results, strict=True):
                park = self._record(payment, result, report)
                if park is not None:
                    yield from self._park(event, partition_id, *park, report)
        if failure is not None:
            delay = retry_after(failure)
            if delay:
                yield Sleep(min(delay, self.max_retry_after))
            raise failure
        if fresh:
            report.watermark = yield partial(self.watermark.advance, partition_id,
                                             fresh[-1].sequence_number, known=mark,
                                             enqueued_time=fresh[-1].enqueued_time,
                                             offset=fresh[-1].offset)
            self._marked(events, partition_id, mark, reset)
        elif mark is not None:
            report.watermark = mark.sequence_number
        return report

    def _marked(self, events: Sequence[InboundEvent], partition_id: str, mark: Mark | None,
                reset: InboundEvent | None) -> None:
        """Telemetry of a mark that advanced: its lag, and a sequence reset if it moved down."""
        telemetry = self.ledger.telemetry
        if mark is not None and reset is not None:
            telemetry.sequence_reset(consumer=CONSUMER, partition_id=partition_id,
                                     mark=mark.sequence_number, first=reset.sequence_number,
                                     context={"event_hub": self.event_hub})
        times = [t for t in (event_time(e.enqueued_time) for e in events) if t is not None]
        if times:
            telemetry.mark_lagging(self.ledger.config.clock() - max(times).timestamp(),
                                   consumer=CONSUMER, partition_id=partition_id)

    def _groups(self, fresh: Sequence[InboundEvent], partition_id: str
                ) -> tuple[list[list[Event]], list[tuple[InboundEvent, str, str]]]:
        """Valid events by account, in sequence order; the rest with the reason to park them."""
        by_account: dict[str, list[Event]] = {}
        invalid: list[tuple[InboundEvent, str, str]] = []
        for event in fresh:
            try:
                payment = self._payment(event, partition_id)
            except InvalidMessageError as error:
                invalid.append((event, error.reason, error.detail))
                continue
            except Exception as error:  # a bug for this event: park it, keep the partition moving
                logger.exception("payments: unexpected error", extra=self._context(event, partition_id))
                invalid.append((event, "UnexpectedError", repr(error)))
                continue
            by_account.setdefault(payment.account_id, []).append((event, payment))
        return list(by_account.values()), invalid

    def _group_flow(self, group: list[Event], partition_id: str) -> BatchFlow:
        """The group's per-event results (an Exception: a bug for that event), or the transient
        error it still failed with after `max_attempts` tries (returned, not raised, so the
        other groups finish first)."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                return (yield from self._attempt_flow(group, partition_id, attempt))
            except TRANSIENT_ERRORS as error:
                if attempt == self.max_attempts:
                    return error
                yield Sleep(min(retry_after(error) or self.backoff * 2 ** (attempt - 1),
                                self.max_retry_after))
        raise AssertionError("unreachable: max_attempts is at least 1")

    def _attempt_flow(self, group: list[Event], partition_id: str, attempt: int) -> BatchFlow:
        contexts = [{**self._context(event, partition_id), "attempt": attempt} for event, _ in group]
        payments = [payment for _, payment in group]
        try:
            results: list[Outcome | Exception] = list((yield partial(self.apply_group, payments,
                                                                     contexts)))
        except TRANSIENT_ERRORS:
            raise
        except Exception:  # not the store's availability: find the event it is about
            logger.exception("payments: group failed; applying its events one by one",
                             extra=contexts[0])
            results = []
            for payment, context in zip(payments, contexts, strict=True):
                try:
                    results.append((yield partial(self.apply, payment, context)))
                except TRANSIENT_ERRORS:
                    raise
                except Exception as error:  # a bug for this event: park it, keep going
                    logger.exception("payments: unexpected error", extra=context)
                    results.append(error)
        held = [r for r in results if isinstance(r, Outcome) and r.status not in SETTLED]
        if held:  # a live claim by someone else (not a ledger marker): retry the batch later
            raise ConcurrencyRetriesExhaustedError(f"{held[0].key.encoded} is {held[0].status}")
        return results

    @staticmethod
    def _record(payment: Payment, result: Outcome | Exception,
                report: BatchReport) -> tuple[str, str] | None:
        """Count the result; the reason and detail to park the event with, if it must be."""
        if isinstance(result, InvalidMessageError):  # valid alone, refused by the account's state
            return result.reason, result.detail
        if isinstance(result, Exception):
            return "UnexpectedError", repr(result)
        if result.status is OutcomeStatus.CONFLICT:
            return "IdempotencyKeyConflict", f"{payment.key.key} was applied with different content"
        if result.status is OutcomeStatus.DUPLICATE:
            report.duplicates += 1
        else:
            report.applied += 1
        return None

    def _context(self, event: InboundEvent, partition_id: str) -> dict[str, Any]:
        return {"partition_id": partition_id, "sequence_number": event.sequence_number,
                "event_hub": self.event_hub}

    def _park(self, event: InboundEvent, partition_id: str, reason: str, detail: str,
              report: BatchReport) -> BatchFlow:
        """Durably park; if even that fails, raise so the host's retry policy re-runs the batch."""
        entry_id = f"{self.event_hub}/{partition_id}/{event.sequence_number}"
        yield partial(self.parking.park, consumer=CONSUMER, entry_id=entry_id, reason=reason,
                      payload=event.body, error=detail, context={
                          "partition_id": partition_id, "sequence_number": event.sequence_number,
                          "offset": event.offset,
                          "properties": {str(k): str(v) for k, v in event.properties.items()}})
        report.park(reason)


class AsyncPaymentService(PaymentService):
    """`PaymentService` on the async API: the same batch flow, awaited.

    Built on an `AsyncIdempotency` ledger, an `AsyncPartitionWatermark` and an
    `AsyncParkingLot`; account groups run as tasks (at most `max_concurrency`
    at a time) instead of threads, so one event loop keeps every group's
    request in flight. `sleep` may be sync or async (default `asyncio.sleep`).
    """

    ledger: AsyncIdempotency  # type: ignore[assignment]

    def __init__(self, ledger: AsyncIdempotency, watermark: AsyncPartitionWatermark,
                 parking: AsyncParkingLot, *, sleep: Callable[[float], Any] = asyncio.sleep,
                 **options: Any) -> None:
        super().__init__(ledger, watermark, parking, sleep=sleep, **options)  # type: ignore[arg-type]

    async def _post(self, tx: AsyncTransaction,  # type: ignore[override]
                    account_id: str, amounts: Sequence[int]) -> list[dict[str, int]]:
        return self._posting(tx, account_id, amounts, await tx.read(ACCOUNT_DOCUMENT))

    async def apply(self, payment: Payment,  # type: ignore[override]
                    context: Mapping[str, Any] | None = None) -> Outcome:
        """See `PaymentService.apply`."""
        async def build(tx: AsyncTransaction) -> dict[str, int]:
            return (await self._post(tx, payment.account_id, [payment.amount_cents]))[0]

        return await self.ledger.run_atomic(payment.key, request_hash(payment.content), build,
                                            partition=store_safe_id(payment.account_id),
                                            context=context)

    async def process_batch(self, events: list[InboundEvent],  # type: ignore[override]
                            partition_id: str) -> BatchReport:
        """See `PaymentService.process_batch`."""
        return await adrive(self._batch_flow(events, partition_id), self._perform)

    async def _perform(self, step: Step) -> Any:  # type: ignore[override]
        if isinstance(step, Gather):
            bound = asyncio.Semaphore(self.max_concurrency)

            async def group(flow: BatchFlow) -> Any:
                async with bound:
                    return await adrive(flow, self._perform)

            return await asyncio.gather(*(group(flow) for flow in step.flows))
        value = self.sleep(step.seconds) if isinstance(step, Sleep) else step()
        return await value if inspect.isawaitable(value) else value
