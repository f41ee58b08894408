"""The replay tool's logic: list, show, replay and discard, with identity kept and marks written.

Identity rule: a replay never gives a message a new identity. A dead-lettered
Service Bus message is resubmitted with its original MessageId (and body,
content type, correlation id, properties); a parked Event Hubs event is run
through the same domain code as the trigger under its CloudEvent source+id;
a parked notification is re-delivered under its MessageId; a Storage Queue
poison envelope is resubmitted to its queue carrying the original message id
and body (`shared._triggers.queue_messages.resubmission`), and deleted only after that send. So the consumer's
dedup absorbs a replay whose effect had in fact happened, and replaying the
same entry twice never creates a second effect.

Every action is recorded in the parking lot: on the parked entry itself, or,
for a dead-lettered message or a poison envelope (which leave their queues),
on a journal entry under the same consumer (`deadletter/<entity>/<sequence>`,
`poison/<poison queue>/<message id>`).

Concurrency rule: two people (or two `replay --all` runs) may work at once.
Before acting on an item the tool claims its entry under the etag (who, when,
expiring after `claim_seconds` like a lease, so a crashed run frees it); an
item claimed by someone else is skipped as "being replayed by ...", and a
resolved entry's outcome is never overwritten: an item another run resolved
meanwhile (a message it resubmitted included) is reported as already done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from domain.order_audit import CONSUMER as ORDER_AUDIT
from domain.order_audit import parse_order_accepted
from domain.payments import CONSUMER as PAYMENTS
from domain.payments import Payment, payment_from
from functions.services import Services
from replay.deadletters import (
    DeadLetteredMessage,
    DeadLetterSource,
    EntityRef,
    NotInDeadLetterQueueError,
    ResubmitDroppedError,
)
from replay.poison import (
    LIST_HOLD_SECONDS,
    REPLAY_HOLD_SECONDS,
    EnvelopeLeftError,
    NotInPoisonQueueError,
    PoisonedMessage,
    PoisonQueueError,
    PoisonSource,
    QueueRef,
)
from replay.stores import ReuseScan, scan_reused_keys, store_scope
from shared import DedupKey, IdempotencyError, OutcomeStatus
from shared._core.cloudevents import InvalidEventError, parse_cloudevent
from shared._core.exceptions import InvalidKeyError, PoisonMessageError
from shared._core.keys import store_safe_id
from shared._core.payload import InvalidPayloadError as InvalidMessageError
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.settlement import Action
from shared._flows.parking import EntryClaimedError, EntryResolvedError, ParkedEntry, ParkingLot
from shared._triggers.queue_messages import QueueMessageView, resubmission
from shared._triggers.servicebus import MessageView

CONFLICT = "IdempotencyKeyConflict"
#: How long a run's claim on an entry holds when the run dies before releasing it: longer
#: than one item's replay takes (a resubmission scans at most a few thousand locked copies).
CLAIM_SECONDS = 300.0
#: Called after each item of a replay: (result, items done, items selected).
Progress = Callable[["Result", int, int], None]
NOTIFICATION_CONSUMERS = ("notify", "audit")
# How each Service Bus consumer deduplicates, which decides how long a resubmission is absorbed:
# "marker": the business document is the marker and never expires (orders); "record": a dedup
# record that expires after DEDUP_TTL_SECONDS (notify, audit); "natural": versioned upserts.
DEDUP_STYLE = {"orders": "marker", "order_status": "natural", "notify": "record", "audit": "record",
               "order_audit": "marker"}
#: Poison envelope reasons a resubmission can cure (the store was down, or refused a request
#: for a while): replayed by default. Every other reason is the consumer refusing bad input or
#: a reused key, which it would do again: replayed only with `include_refused`.
RESUBMITTABLE = frozenset({"MaxDequeueCountReached", "StoreRejected"})
#: Reasons whose effect may or may not have happened: a person reconciles before replaying.
UNKNOWN_OUTCOME = frozenset({"StaleInProgress", "OutcomeUnknown"})


def app_entities(env: Mapping[str, str]) -> list[EntityRef]:
    """The Service Bus entities the app's triggers read, named by its binding settings."""
    topic = env.get("NOTIFICATIONS_TOPIC_NAME") or "notifications"
    return [EntityRef("orders", env.get("ORDERS_QUEUE_NAME") or "orders"),
            EntityRef("order_status", env.get("ORDER_STATUS_QUEUE_NAME") or "order-status"),
            EntityRef("notify", topic, env.get("NOTIFY_SUBSCRIPTION_NAME") or "notify"),
            EntityRef("audit", topic, env.get("AUDIT_SUBSCRIPTION_NAME") or "audit")]


def app_queues(env: Mapping[str, str]) -> list[QueueRef]:
    """The Storage queues the app's queue triggers read (their poison queues: `<queue>-poison`)."""
    return [QueueRef(ORDER_AUDIT, env.get("ORDER_AUDIT_QUEUE_NAME") or "order-audit")]


class ReplayError(Exception):
    """A command cannot run as asked (unknown id, missing note); the message says why."""


class _Skip(Exception):
    """Stop acting on an item: someone else has it or resolved it; `result` says so."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.outcome)
        self.result = result


@dataclass
class Item:
    """One thing an operator can act on: a parked entry or a dead-lettered message."""

    id: str
    source: str  # "parked" | "deadletter" | "poison"
    consumer: str
    reason: str
    detail: str
    key: str | None
    since: float | None  # parked at / enqueued at (epoch seconds)
    state: str  # "open", or the resolution: "replayed", "discarded"
    entry: ParkedEntry | None = None  # the parked entry, or the dead-letter / poison journal
    message: DeadLetteredMessage | None = None
    poisoned: PoisonedMessage | None = None

    def age(self, now: float) -> float | None:
        return None if self.since is None else max(0.0, now - self.since)

    def to_json(self, now: float, *, full: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "source": self.source, "consumer": self.consumer,
                                "reason": self.reason, "key": self.key, "since": self.since,
                                "ageSeconds": self.age(now), "state": self.state,
                                "detail": self.detail}
        entry = self.entry
        if entry is not None and (entry.resolved or entry.history):
            data.update(resolution=entry.resolution, resolvedBy=entry.resolved_by,
                        resolvedAt=entry.resolved_at, outcome=entry.outcome, note=entry.note)
        if full:
            if self.message is not None:
                m = self.message
                data["message"] = {
                    "entity": m.entity.path, "sequenceNumber": m.sequence_number,
                    "messageId": m.message_id, "contentType": m.content_type,
                    "correlationId": m.correlation_id, "subject": m.subject,
                    "applicationProperties": m.application_properties,
                    "deliveryCount": m.delivery_count,
                    "body": m.body.decode("utf-8", "replace")}
            if self.poisoned is not None:
                p = self.poisoned
                data["poisoned"] = {"queue": p.queue.poison, "poisonMessageId": p.id,
                                    "insertedAt": p.inserted_at, "envelope": p.envelope,
                                    "problem": p.problem,
                                    **({} if p.envelope is not None else {"text": p.text})}
            if entry is not None:
                data["parked"] = {"entryId": entry.entry_id, "parkedAt": entry.parked_at,
                                  "error": entry.error, "context": entry.context,
                                  "payload": entry.payload, "payloadBytes": entry.payload_bytes,
                                  "payloadTruncated": entry.payload_truncated,
                                  "history": list(entry.history)}
        return data


@dataclass
class Result:
    """What one replay or discard did."""

    id: str
    status: str  # replayed | discarded | skipped | refused | failed | would-replay
    outcome: str
    effect: str | None = None  # processed | duplicate | resubmitted | ... (when known)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "outcome": self.outcome, "effect": self.effect}


@dataclass
class Filters:
    consumer: str | None = None
    reason: str | None = None
    source: str | None = None  # parked | deadletter | poison
    state: str = "open"  # open | replayed | discarded | all
    message_id: str | None = None  # the (original) message id, or the key
    older_than: float | None = None  # seconds
    newer_than: float | None = None

    def accepts(self, item: Item, now: float) -> bool:
        age = item.age(now)
        return ((self.consumer is None or item.consumer == self.consumer)
                and (self.reason is None or item.reason == self.reason)
                and (self.source is None or item.source == self.source)
                and (self.message_id is None or self.message_id == item.key)
                and (self.state == "all" or item.state == self.state)
                and (self.older_than is None or (age is not None and age >= self.older_than))
                and (self.newer_than is None or (age is not None and age <= self.newer_than)))


@dataclass
class Options:
    """Operator decisions a replay may need, spelled out on the command line."""

    confirm_not_sent: bool = False  # notifications: a person checked it was NOT sent
    past_retention: bool = False  # replay although dedup records may have expired
    dry_run: bool = False
    include_refused: bool = False  # poison envelopes: resubmit a refusal too (bad input, conflict)
    host_copies: bool = False  # poison queue: resubmit the host's copies (no envelope) as stored


def _journal_id(message: DeadLetteredMessage) -> str:
    return f"deadletter/{message.entity.path}/{message.sequence_number}"


def _poison_journal_id(message: PoisonedMessage) -> str:
    return f"poison/{message.queue.poison}/{message.id}"


def _poison_refusal(item: Item) -> str:
    """Why an envelope is not resubmitted without --include-refused, and what to do."""
    if item.reason in UNKNOWN_OUTCOME:
        return (f"{item.reason}: nobody knows whether its effect happened. Reconcile it with "
                "the downstream; if it did not happen, replay with --include-refused; if it "
                "did, discard it with a note")
    why = ("a different message was already applied under this key" if item.reason == CONFLICT
           else f"{item.consumer} refused it as bad input")
    return (f"{item.reason}: {why}, and would again. Fix the cause (a corrected message from the "
            "producer, or the consumer), then replay with --include-refused; or discard it with "
            "a note")


def _journal_of(entry: ParkedEntry, poison_queues: set[str]) -> bool:
    """A poison journal belongs to this tool only if it reads that poison queue: another
    deployment's journals in a shared table are not its items."""
    return (entry.context.get("source") != "poison"
            or entry.context.get("poison_queue") in poison_queues)


def _is_journal(entry: ParkedEntry) -> bool:
    return entry.context.get("source") in ("deadletter", "poison")


@dataclass
class ReplayTool:
    services: Services
    parking: ParkingLot  # with a lister (replay.stores.document_lister)
    dead_letters: DeadLetterSource | None
    operator: str
    clock: Callable[[], float]
    entities: Sequence[EntityRef] = field(default_factory=list)
    poison: PoisonSource | None = None  # the queue triggers' poison queues
    claim_seconds: float = CLAIM_SECONDS
    # (consumer, entry id) -> token of the claims this tool holds on the item in hand
    _claims: dict[tuple[str, str], str] = field(default_factory=dict, init=False, repr=False)
    # The event loop the app's async consumers (notify, audit) run on for this tool's life:
    # their async clients belong to the loop of their first request.
    _loop: asyncio.Runner = field(default_factory=asyncio.Runner, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.dead_letters is not None and not self.entities:
            self.entities = list(self.dead_letters.entities)

    def close(self) -> None:
        """Release what the tool holds, close the async clients on the loop that used them,
        then the loop."""
        if self.poison is not None:
            self.poison.close()
        self._loop.run(self.services.aclose())
        self._loop.close()

    # -- reading ---------------------------------------------------------------------
    def now(self) -> float:
        return float(self.clock())

    def _entity(self, consumer: str) -> EntityRef | None:
        return next((e for e in self.entities if e.consumer == consumer), None)

    def _parked_item(self, entry: ParkedEntry) -> Item:
        return Item(id=f"parked:{entry.consumer}/{entry.entry_id}", source="parked",
                    consumer=entry.consumer, reason=entry.reason, detail=entry.error,
                    key=self._parked_key(entry), since=entry.parked_at,
                    state=(entry.resolution or "open") if entry.resolved else "open", entry=entry)

    @staticmethod
    def _parked_key(entry: ParkedEntry) -> str | None:
        if entry.context.get("message_id"):
            return str(entry.context["message_id"])
        if entry.consumer == PAYMENTS:
            try:
                event = parse_cloudevent(entry.payload.encode("utf-8"),
                                         entry.context.get("properties") or {},
                                         entry.context.get("content_type"))
                return DedupKey.from_cloudevent(PAYMENTS, event.source, event.id).key
            except (InvalidEventError, InvalidKeyError):
                return None
        return None

    def _dead_letter_item(self, message: DeadLetteredMessage, journal: ParkedEntry | None) -> Item:
        return Item(id=f"dlq:{message.entity.consumer}/{message.sequence_number}",
                    source="deadletter", consumer=message.entity.consumer, reason=message.reason,
                    detail=message.description, key=message.message_id, since=message.enqueued_at,
                    state="open", entry=journal, message=message)

    def _journal_item(self, entry: ParkedEntry) -> Item:
        context = entry.context
        poison = context.get("source") == "poison"
        return Item(id=(f"poison:{entry.consumer}/{context.get('poison_message_id')}" if poison
                        else f"dlq:{entry.consumer}/{context.get('sequence_number')}"),
                    source="poison" if poison else "deadletter",
                    consumer=entry.consumer, reason=entry.reason, detail=entry.error,
                    key=context.get("message_id"),
                    since=context.get("poisoned_at" if poison else "enqueued_at"),
                    state=(entry.resolution or "open") if entry.resolved else "open", entry=entry)

    def _poison_item(self, message: PoisonedMessage, journal: ParkedEntry | None) -> Item:
        return Item(id=f"poison:{message.queue.consumer}/{message.id}", source="poison",
                    consumer=message.queue.consumer, reason=message.reason, detail=message.detail,
                    key=message.message_id, since=message.poisoned_at, state="open",
                    entry=journal, poisoned=message)

    def items(self, filters: Filters | None = None) -> list[Item]:
        """Parked entries, dead-lettered messages and poison envelopes (and the journal of past
        actions): a snapshot, the envelopes released again once read."""
        try:
            return self._items(filters or Filters(), hold=LIST_HOLD_SECONDS)
        finally:
            self._release()

    def _release(self) -> None:
        if self.poison is not None:
            self.poison.release()

    def _items(self, filters: Filters, *, hold: int) -> list[Item]:
        now = self.now()
        entries = ([] if filters.source in ("deadletter", "poison") and filters.state == "open"
                   else self.parking.entries(filters.consumer, include_resolved=True))
        journals = {(e.consumer, e.entry_id): e for e in entries if _is_journal(e)}
        found: list[Item] = [self._parked_item(e) for e in entries if not _is_journal(e)]
        live: set[tuple[str, str]] = set()
        if self.dead_letters is not None and filters.source in (None, "deadletter"):
            for entity in self.entities:
                if filters.consumer not in (None, entity.consumer):
                    continue
                for message in self.dead_letters.peek(entity):
                    location = (entity.consumer, _journal_id(message))
                    live.add(location)
                    found.append(self._dead_letter_item(message, journals.get(location)))
        if self.poison is not None and filters.source in (None, "poison"):
            for queue in self.poison.queues:
                if filters.consumer not in (None, queue.consumer):
                    continue
                try:
                    envelopes = self.poison.read(queue, hold=hold)
                except PoisonQueueError as error:
                    raise ReplayError(str(error)) from error
                for envelope in envelopes:
                    location = (queue.consumer, _poison_journal_id(envelope))
                    live.add(location)
                    found.append(self._poison_item(envelope, journals.get(location)))
        read = {q.poison for q in self.poison.queues} if self.poison is not None else set()
        found += [self._journal_item(e) for location, e in journals.items()
                  if location not in live and _journal_of(e, read)]
        selected = [item for item in found if filters.accepts(item, now)]
        return sorted(selected, key=lambda i: (i.since or 0.0, i.consumer, i.id))

    def find(self, item_id: str) -> Item:
        """One item by id: `parked:<consumer>/<entry id>` or `dlq:<consumer>/<sequence number>`."""
        kind, _, rest = item_id.partition(":")
        consumer, _, tail = rest.partition("/")
        if kind == "parked" and consumer and tail:
            entry = self.parking.entry(consumer, tail)
            if entry is None or _is_journal(entry):
                raise ReplayError(f"no parked entry {item_id}")
            return self._parked_item(entry)
        if kind == "dlq" and consumer and tail.isdigit():
            entity = self._entity(consumer)
            if entity is None:
                raise ReplayError(f"{consumer!r} is not a Service Bus consumer of this app "
                                  f"({', '.join(e.consumer for e in self.entities) or 'none known'})")
            sequence = int(tail)
            journal_id = f"deadletter/{entity.path}/{sequence}"
            journal = self.parking.entry(consumer, journal_id)
            if self.dead_letters is not None:
                for message in self.dead_letters.peek(entity):
                    if message.sequence_number == sequence:
                        return self._dead_letter_item(message, journal)
            if journal is not None:
                return self._journal_item(journal)
            if self.dead_letters is None:
                raise ReplayError(f"{item_id}: the dead-letter queues are not connected "
                                  "(pass --servicebus-connection or --servicebus-namespace)")
            raise ReplayError(f"{item_id} is not in the dead-letter queue of {entity.path}")
        if kind == "poison" and consumer and tail:
            return self._find_poisoned(item_id, consumer, tail)
        raise ReplayError(f"unknown id {item_id!r}: expected parked:<consumer>/<entry id>, "
                          "dlq:<consumer>/<sequence number> or poison:<consumer>/<message id>")

    def _find_poisoned(self, item_id: str, consumer: str, poison_id: str) -> Item:
        if self.poison is None:
            raise ReplayError(f"{item_id}: the poison queues are not connected (give the queue "
                              "trigger's connection: AzureWebJobsStorage, or "
                              "AzureWebJobsStorage__queueServiceUri)")
        queue = next((q for q in self.poison.queues if q.consumer == consumer), None)
        if queue is None:
            raise ReplayError(f"{consumer!r} is not a queue consumer of this app "
                              f"({', '.join(q.consumer for q in self.poison.queues) or 'none'})")
        journal = self.parking.entry(consumer, f"poison/{queue.poison}/{poison_id}")
        try:
            envelopes = self.poison.read(queue, hold=REPLAY_HOLD_SECONDS)
        except PoisonQueueError as error:
            raise ReplayError(str(error)) from error
        for message in envelopes:
            if message.id == poison_id:
                return self._poison_item(message, journal)
        if journal is not None:
            return self._journal_item(journal)
        raise ReplayError(f"{item_id} is not in {queue.poison} (or another run holds it)")

    # -- what the stores already hold ----------------------------------------------
    def _record_state(self, consumer: str, message_id: str) -> str | None:
        """Whether the consumer's dedup already recorded this message: completed, in
        progress, closed as parked, or None (not recorded / nothing to look up)."""
        try:
            if consumer == "orders":
                store = self.services.stores["orders"]
                document_id = store_safe_id(message_id)
                record = store.get_record(document_id, document_id)
            elif consumer in NOTIFICATION_CONSUMERS:
                key = DedupKey.from_message_id(consumer, message_id)
                record = self.services.stores["notifications"].get_record(key.encoded,
                                                                          key.encoded)
            else:
                return None
        except InvalidKeyError:
            return None
        if record is None or record.is_expired(self.now()):
            return None
        if record.state is RecordState.IN_PROGRESS:
            return "in progress"
        if isinstance(record.result, dict) and "parked" in record.result:
            return f"closed as parked ({record.result['parked']})"
        return "completed"

    def _closed_record(self, consumer: str, message_id: str) -> IdempotencyRecord | None:
        """A notification's record closed as parked (an attempt of unknown outcome, or the
        maintenance sweep's stale claim): re-opened before a resubmission, or the consumer
        would absorb the copy as a duplicate of an effect that may never have happened."""
        if consumer not in NOTIFICATION_CONSUMERS:
            return None
        key = DedupKey.from_message_id(consumer, message_id)
        record = self.services.stores["notifications"].get_record(key.encoded, key.encoded)
        if (record is None or record.is_expired(self.now())
                or not (isinstance(record.result, dict) and "parked" in record.result)):
            return None
        return record

    def _notifications(self, consumer: str) -> Any:
        return self.services.notify if consumer == "notify" else self.services.audit

    def _ttl(self) -> float:
        return self.services.settings.ttl.total_seconds()

    # -- commands --------------------------------------------------------------------
    def show(self, item_id: str) -> tuple[Item, dict[str, Any]]:
        """The item and what the consumer's dedup already holds for it."""
        try:
            item = self.find(item_id)
        finally:
            self._release()
        facts: dict[str, Any] = {}
        if item.poisoned is not None:
            facts.update(self._poison_facts(item.poisoned))
        elif item.source == "deadletter" and item.key:
            facts["dedup"] = self._record_state(item.consumer, item.key) or (
                "versioned upsert: replays of older versions change nothing"
                if DEDUP_STYLE.get(item.consumer) == "natural" else "no effect recorded")
        elif item.entry is not None and item.consumer == PAYMENTS:
            payment = self._payment(item.entry)
            if isinstance(payment, Payment):
                facts["dedup"] = "completed" if self._ledger_marker(payment) else "no effect recorded"
            else:
                facts["invalid"] = payment
        elif item.entry is not None and item.key and item.consumer in NOTIFICATION_CONSUMERS:
            facts["dedup"] = self._record_state(item.consumer, item.key) or "no record"
        return item, facts

    def replay(self, item_ids: Iterable[str] = (), *, filters: Filters | None = None,
               options: Options | None = None, progress: Progress | None = None) -> list[Result]:
        """Replay the given ids, or every open item the filters select; `progress` hears of
        each result as it comes."""
        options = options or Options()
        ids = list(item_ids)
        try:
            targets = ([self.find(i) for i in ids] if ids
                       else self._items(filters or Filters(), hold=REPLAY_HOLD_SECONDS))
            results: list[Result] = []
            for item in targets:
                results.append(self._guarded(item, lambda item=item: self._replay_one(item,
                                                                                      options)))
                if progress is not None:
                    progress(results[-1], len(results), len(targets))
            return results
        finally:
            self._release()

    def discard(self, item_id: str, note: str) -> Result:
        if not note.strip():
            raise ReplayError("discard needs --note saying why (it is kept on the entry)")
        try:
            item = self.find(item_id)
            return self._guarded(item, lambda: self._discard(item, note))
        finally:
            self._release()

    def _discard(self, item: Item, note: str) -> Result:
        if item.state != "open":
            return self._already(item)
        if item.poisoned is not None:
            return self._discard_poisoned(item, item.poisoned, note)
        if item.message is not None:
            journal = self._ensure_journal(item.message, item.entry)
            self._claim(item, journal.entry_id)
            assert self.dead_letters is not None
            try:
                self.dead_letters.complete(item.message)
            except NotInDeadLetterQueueError as error:
                self._gone(item, journal.entry_id)
                return Result(item.id, "failed", str(error))
            self._mark(item.consumer, journal.entry_id, action="discarded",
                       outcome="dead-lettered copy completed without resubmitting", note=note,
                       resolved=True)
            return Result(item.id, "discarded", "removed from the dead-letter queue; note kept")
        assert item.entry is not None
        self._claim(item, item.entry.entry_id)
        self._mark(item.consumer, item.entry.entry_id, action="discarded", outcome="discarded",
                   note=note, resolved=True)
        return Result(item.id, "discarded", "entry closed; note kept")

    # -- claims: one actor per item at a time ------------------------------------------------
    def _guarded(self, item: Item, act: Callable[[], Result]) -> Result:
        """Run one action; whatever happens, drop the claims it still holds."""
        try:
            return act()
        except _Skip as skip:
            return skip.result
        except EntryResolvedError as error:  # resolved by someone else while this one acted
            return self._already(item, error.entry)
        finally:
            for (consumer, entry_id), token in list(self._claims.items()):
                with contextlib.suppress(IdempotencyError):  # else the claim simply expires
                    self.parking.release(consumer, entry_id, token)
            self._claims.clear()

    def _claim(self, item: Item, entry_id: str) -> None:
        """Take the entry before acting; _Skip when someone else has it or resolved it."""
        try:
            entry = self.parking.claim(item.consumer, entry_id, by=self.operator,
                                       lease_seconds=self.claim_seconds)
        except EntryResolvedError as error:
            raise _Skip(self._already(item, error.entry)) from error
        except EntryClaimedError as error:
            held = error.entry
            since = datetime.fromtimestamp(float(held.claimed_at or 0.0), UTC).strftime("%H:%M:%S")
            left = max(0.0, float(held.claim_expires_at or 0.0) - self.now())
            raise _Skip(Result(item.id, "skipped",
                               f"being replayed by {held.claimed_by} (since {since} UTC; their "
                               f"claim expires in {left:.0f} s); nothing done")) from error
        assert entry.claim_token is not None
        self._claims[(item.consumer, entry_id)] = entry.claim_token

    def _mark(self, consumer: str, entry_id: str, *, action: str, outcome: str, note: str = "",
              resolved: bool) -> ParkedEntry:
        """Record the action, dropping this tool's claim on the entry with it."""
        token = self._claims.pop((consumer, entry_id), None)
        return self.parking.mark(consumer, entry_id, action=action, by=self.operator,
                                 outcome=outcome, note=note, resolved=resolved, claim=token)

    def _gone(self, item: Item, entry_id: str) -> None:
        """The dead-lettered message left the queue under this tool's hands: when another run
        resolved its journal meanwhile (it resubmitted or discarded it), say that, not failed."""
        journal = self.parking.entry(item.consumer, entry_id)
        if journal is not None and journal.resolved:
            raise _Skip(self._already(item, journal))

    # -- replay, per kind ----------------------------------------------------------------
    @staticmethod
    def _already(item: Item, entry: ParkedEntry | None = None) -> Result:
        entry = entry or item.entry
        state = (entry.resolution or item.state) if entry is not None and entry.resolved else item.state
        who = f" by {entry.resolved_by}" if entry and entry.resolved_by else ""
        what = f": {entry.outcome}" if entry and entry.outcome else ""
        return Result(item.id, "skipped", f"already {state}{who}{what}; nothing done")

    def _replay_one(self, item: Item, options: Options) -> Result:
        if item.state != "open":
            return self._already(item)
        if item.poisoned is not None:
            return self._replay_poisoned(item, item.poisoned, options)
        if item.reason == CONFLICT:
            return Result(item.id, "refused",
                          "a different message was already applied under this key: a replay would "
                          "be refused again. Discard it with a note, or have the producer send the "
                          "new content under a new id")
        try:
            if item.message is not None:
                return self._resubmit(item, item.message, options)
            assert item.entry is not None
            if item.consumer == PAYMENTS:
                return self._replay_payment(item, item.entry, options)
            if item.consumer in NOTIFICATION_CONSUMERS:
                return self._replay_notification(item, item.entry, options)
            return Result(item.id, "refused", f"no replay path for consumer {item.consumer!r}: "
                          "resolve it by hand, then discard it with a note")
        except IdempotencyError as error:
            with contextlib.suppress(IdempotencyError):  # the store may still be down
                self._mark_failed(item, f"store error: {error}")
            return Result(item.id, "failed", f"store error, nothing recorded as done: {error}")

    def _mark_failed(self, item: Item, outcome: str) -> None:
        if item.entry is not None:
            self._mark(item.consumer, item.entry.entry_id, action="replay-failed", outcome=outcome,
                       resolved=False)

    def _done(self, item: Item, entry_id: str, outcome: str, effect: str) -> Result:
        self._mark(item.consumer, entry_id, action="replayed", outcome=outcome, resolved=True)
        return Result(item.id, "replayed", outcome, effect)

    # Service Bus -------------------------------------------------------------------------
    def _resubmit(self, item: Item, message: DeadLetteredMessage, options: Options) -> Result:
        assert self.dead_letters is not None
        if not message.message_id:
            return Result(item.id, "refused", "the message has no MessageId: without its identity "
                          "the consumer cannot deduplicate a resubmission (it would be dead-lettered "
                          "again); discard it and have the producer send it with one")
        age = item.age(self.now()) or 0.0
        window = self.dead_letters.duplicate_detection_window
        if age < window:
            return Result(item.id, "refused",
                          f"sent {age:.0f} s ago: inside the {window:.0f} s duplicate-detection "
                          f"window the broker would drop a copy with MessageId {message.message_id}; "
                          f"replay it in {window - age:.0f} s")
        style = DEDUP_STYLE.get(item.consumer)
        if style == "record" and age >= self._ttl() and not options.past_retention:
            return Result(item.id, "refused",
                          f"older than the dedup records' retention ({self._ttl():.0f} s): if it was "
                          "processed, its record may be gone and a copy would act again. Check, then "
                          "pass --past-retention")
        prior = self._record_state(item.consumer, message.message_id)
        closed = self._closed_record(item.consumer, message.message_id)
        if closed is not None and not self._notifications(item.consumer).api_honours_key \
                and not options.confirm_not_sent:
            return Result(item.id, "refused",
                          f"its record was closed as {prior}: nobody knows whether it was sent, "
                          "and the notification API does not honour Idempotency-Key. Check the "
                          "API's records: if it was NOT sent, replay with --confirm-not-sent; if "
                          "it was, discard with a note")
        expected = ("the consumer will absorb it as a duplicate" if prior == "completed"
                    else "the consumer's dedup decides on delivery")
        if closed is not None:  # absorbed as a duplicate otherwise: the effect would be lost
            expected = "its closed record re-opened, the consumer runs it again"
        fanout = ""
        if message.entity.is_topic:
            others = [e.consumer for e in self.entities
                      if e.queue_or_topic == message.entity.queue_or_topic
                      and e.consumer != item.consumer]
            if others:
                fanout = (f"; the topic copies it to {', '.join(others)} too, whose dedup absorbs "
                          "it (same MessageId)")
        target = ("topic " if message.entity.is_topic else "queue ") + message.entity.queue_or_topic
        if options.dry_run:
            return Result(item.id, "would-replay", f"would resubmit to {target} with MessageId "
                          f"{message.message_id}; {expected}{fanout}")
        journal = self._ensure_journal(message, item.entry)
        self._claim(item, journal.entry_id)
        if closed is not None:
            self.services.stores["notifications"].delete_record_if_unchanged(closed)
        try:
            self.dead_letters.resubmit_and_complete(message)
        except NotInDeadLetterQueueError as error:
            self._gone(item, journal.entry_id)
            self._mark(item.consumer, journal.entry_id, action="replay-failed", outcome=str(error),
                       resolved=False)
            return Result(item.id, "failed", str(error))
        except ResubmitDroppedError as error:
            self._mark(item.consumer, journal.entry_id, action="replay-failed", outcome=str(error),
                       resolved=False)
            return Result(item.id, "failed", str(error))
        outcome = (f"resubmitted to {target} with MessageId {message.message_id} (dedup before: "
                   f"{prior or 'no effect recorded'}; {expected}){fanout}; dead-lettered copy "
                   "completed")
        return self._done(item, journal.entry_id, outcome, "resubmitted")

    # Storage Queue poison envelopes ------------------------------------------------------------
    def _poison_facts(self, message: PoisonedMessage) -> dict[str, Any]:
        envelope = message.envelope
        if envelope is None:
            return {"invalid": message.problem}
        facts: dict[str, Any] = {"original": f"message {message.message_id}, dequeue count "
                                             f"{envelope.get('dequeueCount')}, dedup key "
                                             f"{envelope.get('dedupKey')}"}
        if envelope.get("bodyTruncated"):
            facts["invalid"] = (f"body cut to fit ({envelope.get('bodyBytes')} bytes, sha256 "
                                f"{envelope.get('bodySha256')}): re-send it from its source")
        else:
            facts["dedup"] = self._poison_record_state(message) or "no effect recorded"
        return facts

    def _poison_record_state(self, message: PoisonedMessage) -> str | None:
        """Whether the queue consumer already applied the envelope's message (its marker)."""
        body = message.envelope.get("body") if message.envelope is not None else None
        if message.queue.consumer != ORDER_AUDIT or not isinstance(body, str):
            return None
        try:
            event = parse_order_accepted(QueueMessageView(message.message_id, body.encode()))
            applied = self.services.order_audit.entry(event.customer_id, event.order_id)
        except PoisonMessageError:
            return None
        except IdempotencyError as error:
            return f"unknown (store error: {error})"
        return "completed" if applied is not None else None

    def _replay_poisoned(self, item: Item, message: PoisonedMessage, options: Options) -> Result:
        assert self.poison is not None
        kept = "; nothing sent, nothing deleted"
        if message.envelope is None:
            text = message.text
            if text is None:
                return Result(item.id, "refused", f"{message.problem}: re-send it from its "
                              f"source, then discard this one with a note{kept}")
            if not options.host_copies:
                return Result(item.id, "refused", f"{message.problem}. Without the original id "
                              "only a consumer keyed by a business key absorbs a copy: if "
                              f"{item.consumer} is, replay it with --host-copies; else discard it "
                              f"with a note{kept}")
            carrying = "as the host stored it"
        else:
            try:
                text = resubmission(message.envelope, by=self.operator,
                                    now=datetime.fromtimestamp(self.now(), UTC))
            except ValueError as error:
                return Result(item.id, "refused", f"cannot bring it back: {error}; then discard "
                              f"this one with a note{kept}")
            if item.reason not in RESUBMITTABLE and not options.include_refused:
                return Result(item.id, "refused", _poison_refusal(item) + kept)
            carrying = f"carrying the original id {message.message_id}"
        age = item.age(self.now()) or 0.0
        if (DEDUP_STYLE.get(item.consumer) == "record" and age >= self._ttl()
                and not options.past_retention):
            return Result(item.id, "refused", f"older than the dedup records' retention "
                          f"({self._ttl():.0f} s): check it was not applied, then pass "
                          f"--past-retention{kept}")
        prior = self._poison_record_state(message)
        expected = ("the consumer will absorb it as a duplicate" if prior == "completed"
                    else "the consumer's dedup decides on delivery")
        target = f"queue {message.queue.queue}"
        if options.dry_run:
            return Result(item.id, "would-replay", f"would resubmit to {target} {carrying}; "
                          f"{expected}")
        journal = self._ensure_poison_journal(message, item.entry)
        if journal.resolved:  # resubmitted before, its envelope left behind: remove it now
            with contextlib.suppress(PoisonQueueError, NotInPoisonQueueError):
                self.poison.delete(message)
            return self._already(item, journal)
        self._claim(item, journal.entry_id)
        try:
            sent = self.poison.resubmit(message, text)
        except EnvelopeLeftError as error:
            return self._done(item, journal.entry_id, f"{error}: replaying it again is absorbed "
                              "by the consumer's dedup; discard it with a note", "resubmitted")
        except (NotInPoisonQueueError, PoisonQueueError) as error:
            if isinstance(error, NotInPoisonQueueError):
                self._gone(item, journal.entry_id)
            self._mark(item.consumer, journal.entry_id, action="replay-failed", outcome=str(error),
                       resolved=False)
            return Result(item.id, "failed", str(error))
        return self._done(item, journal.entry_id,
                          f"resubmitted to {target} as message {sent} {carrying} (dedup before: "
                          f"{prior or 'no effect recorded'}; {expected}); envelope deleted from "
                          f"{message.queue.poison}", "resubmitted")

    def _discard_poisoned(self, item: Item, message: PoisonedMessage, note: str) -> Result:
        assert self.poison is not None
        journal = self._ensure_poison_journal(message, item.entry)
        self._claim(item, journal.entry_id)
        try:
            self.poison.delete(message)
        except (NotInPoisonQueueError, PoisonQueueError) as error:
            if isinstance(error, NotInPoisonQueueError):
                self._gone(item, journal.entry_id)
            return Result(item.id, "failed", str(error))
        self._mark(item.consumer, journal.entry_id, action="discarded",
                   outcome=f"deleted from {message.queue.poison} without resubmitting", note=note,
                   resolved=True)
        return Result(item.id, "discarded", "removed from the poison queue; note kept")

    def _ensure_poison_journal(self, message: PoisonedMessage,
                               known: ParkedEntry | None) -> ParkedEntry:
        if known is not None:
            return known
        consumer, entry_id = message.queue.consumer, _poison_journal_id(message)
        existing = self.parking.entry(consumer, entry_id)
        if existing is not None:
            return existing
        envelope = message.envelope or {}
        return self.parking.park_if_absent(  # only if absent: a racing run keeps its own
            consumer=consumer, entry_id=entry_id, reason=message.reason,
            payload=message.text or message.content, error=message.detail,
            context={"source": "poison", "queue": message.queue.queue,
                     "poison_queue": message.queue.poison, "poison_message_id": message.id,
                     "message_id": message.message_id, "dedup_key": envelope.get("dedupKey"),
                     "poisoned_at": message.poisoned_at})

    def _ensure_journal(self, message: DeadLetteredMessage, known: ParkedEntry | None) -> ParkedEntry:
        if known is not None:
            return known
        entry_id = _journal_id(message)
        existing = self.parking.entry(message.entity.consumer, entry_id)
        if existing is not None:
            return existing
        # Created only if absent: a run racing this one keeps its journal, marks and claim.
        return self.parking.park_if_absent(
            consumer=message.entity.consumer, entry_id=entry_id, reason=message.reason,
            payload=message.body, error=message.description,
            context={"source": "deadletter", "entity": message.entity.path,
                     "sequence_number": message.sequence_number, "message_id": message.message_id,
                     "enqueued_at": message.enqueued_at, "content_type": message.content_type,
                     "correlation_id": message.correlation_id,
                     "application_properties": message.application_properties,
                     "delivery_count": message.delivery_count})

    # Event Hubs payments ------------------------------------------------------------------
    def _payment(self, entry: ParkedEntry) -> Payment | str:
        """The parked event as the domain's Payment (same parsing as the trigger), or why not."""
        if not entry.payload_intact:
            return ("the payload was truncated or altered when parked (sha256 differs): re-send "
                    "the event from its source instead")
        context = entry.context
        try:
            event = parse_cloudevent(entry.payload.encode("utf-8"), context.get("properties") or {},
                                     context.get("content_type"))
            key = DedupKey.from_cloudevent(PAYMENTS, event.source, event.id)
            return payment_from(key, event.type, event.data, event_id=event.id)
        except InvalidEventError as error:
            return f"still invalid: {error.reason}: {error.detail}"
        except InvalidKeyError as error:
            return f"still invalid: no CloudEvent id/source to deduplicate on ({error})"
        except InvalidMessageError as error:
            return f"still invalid: {error.reason}: {error.detail}"

    def _ledger_marker(self, payment: Payment) -> bool:
        store = self.services.payments.ledger.store
        record = store.get_record(store_safe_id(payment.account_id), payment.key.encoded)
        return record is not None and not record.is_expired(self.now())

    def _replay_payment(self, item: Item, entry: ParkedEntry, options: Options) -> Result:
        payment = self._payment(entry)
        if not isinstance(payment, Payment):
            if not options.dry_run:
                self._claim(item, entry.entry_id)
                self._mark_failed(item, payment)
            return Result(item.id, "failed", payment)
        recorded = self._ledger_marker(payment)
        age = item.age(self.now()) or 0.0
        margin = self.services.settings.window.margin.total_seconds()
        if not recorded and age >= self._ttl() - margin and not options.past_retention:
            return Result(item.id, "refused",
                          f"parked {age:.0f} s ago, near or past the ledger markers' retention "
                          f"({self._ttl():.0f} s): if it had been applied, its marker may be gone "
                          "and a replay would apply it again. Check the balance, then pass "
                          "--past-retention")
        if options.dry_run:
            return Result(item.id, "would-replay",
                          f"would apply {payment.key.key} to {payment.account_id} "
                          f"({'duplicate: already applied' if recorded else 'not applied yet'})")
        self._claim(item, entry.entry_id)
        outcome = self.services.payments.apply(payment, {
            "replay": True, "entry_id": entry.entry_id, "operator": self.operator,
            "partition_id": entry.context.get("partition_id"),
            "sequence_number": entry.context.get("sequence_number")})
        if outcome.status is OutcomeStatus.PROCESSED:
            return self._done(item, entry.entry_id,
                              f"applied: {payment.amount_cents:+d} cents to {payment.account_id}, "
                              f"balance {outcome.result['balanceCents']}", "processed")
        if outcome.status is OutcomeStatus.DUPLICATE:
            return self._done(item, entry.entry_id,
                              "duplicate: the event had already been applied; nothing changed",
                              "duplicate")
        status = outcome.status.value
        self._mark_failed(item, f"not applied: {status}")
        return Result(item.id, "failed", f"not applied: {status}")

    # Notifications ---------------------------------------------------------------------------
    def _replay_notification(self, item: Item, entry: ParkedEntry, options: Options) -> Result:
        service = self._notifications(item.consumer)
        message_id = entry.context.get("message_id")
        if not message_id or not entry.payload_intact or "dedup_store" in entry.context:
            return Result(item.id, "refused",
                          "no message to re-deliver (parked by the maintenance sweep with its key "
                          "only, or the payload was truncated): ask the producer to re-send it, "
                          "then discard this entry with a note")
        if not service.api_honours_key and not options.confirm_not_sent:
            return Result(item.id, "refused",
                          "the notification API does not honour Idempotency-Key, so a replay sends "
                          "the notification again. Check the API's records: if it was NOT sent, "
                          "replay with --confirm-not-sent; if it was, discard with a note")
        key = DedupKey.from_message_id(item.consumer, str(message_id))
        store = self.services.stores["notifications"]  # the records notify and audit keep
        record = store.get_record(key.encoded, key.encoded)
        if record is not None and record.state is RecordState.IN_PROGRESS:
            return Result(item.id, "refused", "a delivery of this message holds it in progress "
                          "right now; try again after its lease")
        closed = (record is not None and isinstance(record.result, dict)
                  and "parked" in record.result)
        if options.dry_run:
            return Result(item.id, "would-replay",
                          f"would {'re-open the closed record and ' if closed else ''}re-deliver "
                          f"{message_id} to {item.consumer}")
        self._claim(item, entry.entry_id)
        if closed:
            assert record is not None
            store.delete_record_if_unchanged(record)  # a change meanwhile: RecordChangedError
        decision = self._loop.run(service.handle(MessageView(
            message_id=str(message_id), body=entry.payload.encode("utf-8"),
            correlation_id=entry.context.get("correlation_id"), content_type="application/json")))
        confirmed = " (operator confirmed it was not sent)" if options.confirm_not_sent else ""
        if decision.action is Action.COMPLETE and decision.outcome == "parked":
            outcome = "parked again: the outcome of this attempt is unknown too"
            self._mark_failed(item, outcome)
            return Result(item.id, "failed", outcome)
        if decision.action is Action.COMPLETE:
            effect = decision.outcome or "processed"
            text = ("sent" if effect in ("processed", "taken_over")
                    else "duplicate: already sent, nothing sent now")
            return self._done(item, entry.entry_id,
                              f"{text}{confirmed}{'; closed record re-opened' if closed else ''}",
                              effect)
        self._mark_failed(item, f"{decision.action.value}: {decision.reason}: {decision.description}")
        return Result(item.id, "failed", f"not sent: {decision.reason}: {decision.description}")



# -- the outbox: outgoing messages committed but not recorded as dispatched -------------------
@dataclass
class PendingOutgoing:
    """One marker still carrying outgoing messages, and what the tool did with it."""

    consumer: str
    key: str
    marker: str  # partition/id of the marker
    pending_since: float
    messages: list[dict[str, Any]]
    status: str = "pending"  # pending | would dispatch | dispatched | failed
    detail: str = ""

    def to_json(self, now: float) -> dict[str, Any]:
        return {"consumer": self.consumer, "key": self.key, "marker": self.marker,
                "pendingSince": self.pending_since, "ageSeconds": round(now - self.pending_since, 1),
                "messages": self.messages, "status": self.status, "detail": self.detail}


def pending_outgoing(services: Services, *, older_than: float, now: float, dispatch: bool = False,
                     dry_run: bool = False) -> list[PendingOutgoing]:
    """Markers of the sending consumers pending for longer than `older_than` seconds; with
    `dispatch`, each dispatched and recorded as a copy of its message would (same ids: the
    destination's duplicate detection and the next consumer's dedup absorb a re-send);
    `dry_run` says what would be dispatched and changes nothing."""
    from shared._core.exceptions import DispatchRejectedError, DispatchUnavailableError

    found: list[PendingOutgoing] = []
    for name, idempotency in services.maintenance.outbox.items():
        for record in idempotency.store.iter_pending(since_before=now - older_than):
            entry = PendingOutgoing(
                name, record.key.key, f"{record.partition_key}/{record.id}", record.updated_at,
                [{"id": m.message_id, "destination": m.destination, "bytes": len(m.body)}
                 for m in record.outbox])
            if dispatch and dry_run:
                entry.status = "would dispatch"
            elif dispatch:
                try:
                    idempotency.dispatch_pending(record)
                    entry.status = "dispatched"
                except (DispatchUnavailableError, DispatchRejectedError) as error:
                    entry.status, entry.detail = "failed", str(error)
            found.append(entry)
    return found


def reused_keys(services: Services, *, consumer: str | None = None) -> list[ReuseScan]:
    """Each dedup key the app recorded in more than one partition, store by store: every table
    or container of the app's records read once (the parking lot holds none)."""
    scans: dict[str, ReuseScan] = {}
    for role, store in services.stores.items():
        scope = store_scope(store)
        if role != "parked" and scope not in scans:
            scans[scope] = scan_reused_keys(store, consumer=consumer)
    return list(scans.values())
