"""The consumers compared: this project's flows, the app, and the baselines they are held to.

Loopback mode (`LOOPBACK_VARIANTS`): each new message applies one ledger entry
with a fresh id (a non-idempotent insert, so a duplicate that gets through
shows up as an extra entry), in the message's own partition.

* `no-dedup`: the effect only. `naive`: read the marker; if absent, the effect,
  then upsert the marker (two copies can both read "absent").
* `powertools`: the AWS Lambda Powertools flow on Azure: conditional put of an
  IN_PROGRESS record, the effect, an etag-conditional update to COMPLETED; a 409
  has no body on Azure, so a duplicate also reads the record.
* `two-phase` (`Idempotency.run`), `atomic` (`run_atomic`: marker and effect in
  one transaction), `atomic+outbox` (one outgoing message per new message),
  `atomic+cache` (a warm local cache of completed keys), `atomic+hwm` (Event
  Hubs batches check the partition's high-water mark first). Every other variant
  handles a batch one event at a time: a replay without a high-water mark.

Latency mode (`LATENCY_VARIANTS`): each turns the same payment batches into
account balances (one `balance` document per account, in the account's
partition, as `domain.payments` keeps it).

* `per-event`: the dedup path before grouped commits (kept here only): mark
  read; per event, the balance read, then marker + balance in one transaction;
  mark write. `no-dedup-seq`: the same shape without markers or mark.
* `no-dedup-grouped`, the limit: per account, one read and one write, accounts
  concurrent (bounded like the app).
* `no-dedup-etags`, the limit for the app's shape: async on the same clients as
  `app`, balances and etags remembered, so one etag-conditional write per account
  and then the mark write; what `app` would cost with the dedup work free.
* `same-transactions`: the transactions `app` sends (every marker, every balance, the mark,
  per batch, grouped by account, bounded like the app, its `BalanceChanged` costed alike)
  written inline on the raw async SDK clients with no library code on the hot path
  (`benchmarks.raw_payments`), the documents' layout learnt from the app at set-up
  (`benchmarks.app_requests`): `app` against it is the library's own overhead.
* `app`: what the `payments` function runs (`build_services`, then
  `payments_async.process_batch`) on counted async stores, its outgoing messages
  costed by the scenario's RTT (`benchmarks.counting.AsyncCostedDispatcher`);
  `app-no-publish`: the same with `BALANCE_CHANGES_QUEUE` empty (no outgoing
  messages); `app-sync`: the sync processor (threads), as the HTTP API and the
  replay tool use it; `app-cold`: `app` rebuilt before every batch (nothing
  remembered).

The no-dedup variants are the cheapest store traffic that produces the same
balances when nothing is delivered twice (a replay applies a batch again).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import Any, ClassVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.cosmos.exceptions import (
    CosmosAccessConditionFailedError,
    CosmosResourceExistsError,
    CosmosResourceNotFoundError,
)
from azure.data.tables import UpdateMode

from benchmarks import raw_payments as raw
from benchmarks.app_requests import PROBE_TIME, AppShape, learn_app, probe_dispatcher
from benchmarks.counting import AsyncCostedDispatcher, CostedDispatcher, RequestCounter, SendTally
from benchmarks.workload import SIGNS, Message
from functions.services import Services, build_services
from functions.settings import Settings
from shared import DedupKey, Idempotency, IdempotencyError, OutcomeStatus, request_hash
from shared._backends.dispatch import (  # the send cut of the app's dispatcher (set-up)
    _HEADER_ALLOWANCE,
    SEND_BYTES,
)
from shared._core.cloudevents import parse_cloudevent
from shared._core.keys import store_safe_id
from shared._core.outbox import _ID_NAMESPACE  # the namespace of the app's message ids (set-up)
from shared._core.store import IdempotencyStore
from shared._core.telemetry import Telemetry
from shared._flows.batch import BatchReport
from shared._flows.cache import CompletedKeyCache
from shared._flows.drivers import Transaction
from shared._flows.watermark import PartitionWatermark
from shared._triggers.eventhubs import EventView
from shared.testing import AsyncInMemoryIdempotencyStore, InMemoryIdempotencyStore

CONSUMER = "bench"
PAYMENTS = "payments"  # as domain.payments
ACCOUNT_DOCUMENT = "balance"
EVENT_HUB = "payments"
CONSUMER_GROUP = "$Default"
TTL_SECONDS = 7 * 24 * 3600.0
LEASE_SECONDS = 300.0
MAX_ATTEMPTS = 3  # PAYMENTS_MAX_ATTEMPTS default
BACKOFF = 0.2


# -- what a variant is given ---------------------------------------------------------------------
@dataclass
class StoreSet:
    """A variant's counted stores by the app's role names; async ones on the same tables."""

    sync: dict[str, IdempotencyStore]
    aio: dict[str, Any] = field(default_factory=dict)
    run: Callable[[Coroutine[Any, Any, Any]], Any] | None = None  # the async stores' loop

    def factory(self) -> Callable[[str], IdempotencyStore]:
        """For `build_services(stores=...)`: the roles here, the others in memory (unused)."""
        spare: dict[str, IdempotencyStore] = {}

        def store(role: str) -> IdempotencyStore:
            return self.sync.get(role) or spare.setdefault(role, InMemoryIdempotencyStore())

        return store

    def async_factory(self) -> Callable[[str], Any]:
        """For `build_services(async_stores=...)`: the async roles here, the others in memory."""
        spare: dict[str, Any] = {}

        def store(role: str) -> Any:
            return self.aio.get(role) or spare.setdefault(role, AsyncInMemoryIdempotencyStore())

        return store


@dataclass(frozen=True)
class Setup:
    backend: str
    stores: StoreSet
    tally: SendTally  # the variant's outgoing sends
    rtt_ms: float = 0.0  # what one send costs (latency mode: the scenario's nominal RTT)
    env: Mapping[str, str] = field(default_factory=dict[str, str])  # app settings (latency mode)
    concurrency: int = 16  # concurrent account groups of the no-dedup limits
    counters: tuple[RequestCounter, ...] = ()  # the variant's store clients' (set-up recording)
    clock: Callable[[], float] = time.time  # the app's and the same-transactions variant's


class Variant:
    name: ClassVar[str] = "variant"
    label: ClassVar[str] = "variant"
    project: ClassVar[bool] = False  # this project's code (not a baseline)
    dedup: ClassVar[bool] = True  # applies each delivery's effect once
    roles: ClassVar[tuple[str, ...]] = ("ledger",)
    aio: ClassVar[bool] = False  # needs async stores
    env: ClassVar[Mapping[str, str]] = {}  # app settings over the scenario's

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.backend = setup.backend
        self.stores = setup.stores
        self.outcomes: Counter[str] = Counter()

    @cached_property
    def settings(self) -> Settings:
        """The app's settings for this variant (latency mode), read once."""
        return Settings.from_env({**self.setup.env, **self.env})

    def restart(self) -> None:
        """A host restart or partition move: process-local state is gone."""

    def close(self) -> None:
        """Release threads (the runner closes the stores)."""


# -- single requests on the SDK clients (the baselines) ------------------------------------------
class ExistsError(Exception):
    """Conditional create found the item (409)."""


class ChangedError(Exception):
    """Etag-conditional write lost (412/404)."""


_EXISTS = (CosmosResourceExistsError, ResourceExistsError)
_MISSING = (CosmosResourceNotFoundError, ResourceNotFoundError)
_CHANGED = (CosmosAccessConditionFailedError, ResourceModifiedError, *_MISSING)


def _entity(cosmos: bool, partition: str, item_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return ({**body, "id": item_id, "pk": partition} if cosmos
            else {**body, "PartitionKey": partition, "RowKey": item_id})


class Raw:
    """Single-request reads and writes on a sync store's own SDK client (no store layer)."""

    def __init__(self, store: Any) -> None:
        self.cosmos = hasattr(store, "container")
        self._client = store.container if self.cosmos else store.client

    def create(self, partition: str, item_id: str, body: dict[str, Any]) -> str | None:
        entity = _entity(self.cosmos, partition, item_id, body)
        try:
            if self.cosmos:
                return self._client.create_item(entity).get("_etag")
            return self._client.create_entity(entity).get("etag")
        except _EXISTS as error:
            raise ExistsError(item_id) from error

    def read(self, partition: str, item_id: str) -> tuple[dict[str, Any], str | None] | None:
        try:
            if self.cosmos:
                item = self._client.read_item(item_id, partition)
                return item, item.get("_etag")
            entity = self._client.get_entity(partition, item_id)
            return dict(entity), entity.metadata.get("etag")
        except _MISSING:
            return None

    def upsert(self, partition: str, item_id: str, body: dict[str, Any]) -> None:
        entity = _entity(self.cosmos, partition, item_id, body)
        if self.cosmos:
            self._client.upsert_item(entity)
        else:
            self._client.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def replace_if(self, partition: str, item_id: str, body: dict[str, Any],
                   etag: str | None) -> str | None:
        entity = _entity(self.cosmos, partition, item_id, body)
        condition = MatchConditions.IfNotModified
        try:
            if self.cosmos:
                return self._client.replace_item(item_id, entity, etag=etag,
                                                 match_condition=condition).get("_etag")
            return self._client.update_entity(entity, mode=UpdateMode.REPLACE, etag=etag,
                                              match_condition=condition).get("etag")
        except _CHANGED as error:
            raise ChangedError(item_id) from error


class AsyncRaw:
    """`Raw` on an async store's SDK client (azure.cosmos.aio, azure.data.tables.aio)."""

    def __init__(self, store: Any) -> None:
        self.cosmos = hasattr(store, "container")
        self._client = store.container if self.cosmos else store.client

    async def create(self, partition: str, item_id: str, body: dict[str, Any]) -> str | None:
        entity = _entity(self.cosmos, partition, item_id, body)
        try:
            if self.cosmos:
                return (await self._client.create_item(entity)).get("_etag")
            return (await self._client.create_entity(entity)).get("etag")
        except _EXISTS as error:
            raise ExistsError(item_id) from error

    async def read(self, partition: str, item_id: str) -> tuple[dict[str, Any], str | None] | None:
        try:
            if self.cosmos:
                item = await self._client.read_item(item_id, partition)
                return item, item.get("_etag")
            entity = await self._client.get_entity(partition, item_id)
            return dict(entity), entity.metadata.get("etag")
        except _MISSING:
            return None

    async def replace_if(self, partition: str, item_id: str, body: dict[str, Any],
                         etag: str | None) -> str | None:
        entity = _entity(self.cosmos, partition, item_id, body)
        condition = MatchConditions.IfNotModified
        try:
            if self.cosmos:
                return (await self._client.replace_item(item_id, entity, etag=etag,
                                                        match_condition=condition)).get("_etag")
            return (await self._client.update_entity(entity, mode=UpdateMode.REPLACE, etag=etag,
                                                     match_condition=condition)).get("etag")
        except _CHANGED as error:
            raise ChangedError(item_id) from error


# -- loopback: one message at a time -------------------------------------------------------------
class EffectLog:
    """How many times each message's effect was applied (the ground truth for extra effects)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def add(self, message_id: str) -> None:
        with self._lock:
            self.counts[message_id] += 1

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def extra(self, message_ids: list[str] | None = None) -> int:
        with self._lock:
            ids = message_ids if message_ids is not None else list(self.counts)
            return sum(max(0, self.counts[i] - 1) for i in set(ids))


def dedup_key(message: Message) -> DedupKey:
    if message.sequence_number is not None:
        return DedupKey.from_business_key(CONSUMER, message.message_id, field="paymentId")
    return DedupKey.from_message_id(CONSUMER, message.message_id)


def entry_body(message: Message) -> dict[str, Any]:
    return {"messageId": message.message_id, "amount": message.body.get("amount"), "kind": "entry"}


class MessageVariant(Variant):
    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.store = self.stores.sync["ledger"]
        self.raw = Raw(self.store)
        self.effects = EffectLog()

    def effect(self, message: Message, partition: str) -> dict[str, Any]:
        entry_id = f"entry-{uuid.uuid4().hex}"
        self.raw.create(partition, entry_id, entry_body(message))
        self.effects.add(message.message_id)
        return {"entry": entry_id}

    def handle(self, message: Message) -> str:
        raise NotImplementedError

    def handle_batch(self, batch: list[Message]) -> list[str]:
        return [self.handle(event) for event in batch]


class NoDedup(MessageVariant):
    name, label, dedup = "no-dedup", "No dedup (baseline)", False

    def handle(self, message: Message) -> str:
        self.effect(message, dedup_key(message).encoded)
        return "processed"


class NaiveCheckThenAct(MessageVariant):
    name, label, dedup = "naive", "Naive check-then-act", False

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        partition = key.encoded
        if self.raw.read(partition, key.encoded) is not None:
            return "duplicate"
        self.effect(message, partition)
        self.raw.upsert(partition, key.encoded, {"state": "completed",
                                                 "hash": str(request_hash(message.body))})
        return "processed"


class PowertoolsStyle(MessageVariant):
    name, label = "powertools", "Powertools-style (put in-progress, effect, update)"

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        digest = str(request_hash(message.body))  # stored by hand: the SDK takes exact str
        partition = key.encoded
        now = time.time()
        record = {"status": "INPROGRESS", "hash": digest, "expiration": now + TTL_SECONDS,
                  "inProgressExpiration": now + LEASE_SECONDS}
        try:
            etag = self.raw.create(partition, key.encoded, record)
        except ExistsError:
            found = self.raw.read(partition, key.encoded)
            if found is None:
                return "in_progress"  # released meanwhile: the broker redelivers
            existing, _ = found
            if existing.get("hash") != digest:
                return "conflict"
            return "duplicate" if existing.get("status") == "COMPLETED" else "in_progress"
        result = self.effect(message, partition)
        done = {**record, "status": "COMPLETED", "result": json.dumps(result)}
        done.pop("inProgressExpiration")
        self.raw.replace_if(partition, key.encoded, done, etag)
        return "processed"


class TwoPhase(MessageVariant):
    name, label, project = "two-phase", "This project: two-phase (run)", True
    cache: CompletedKeyCache | None = None

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.idempotency = Idempotency(self.store, telemetry=Telemetry(), cache=self.cache)

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        outcome = self.idempotency.run(key, request_hash(message.body),
                                       lambda: self.effect(message, key.encoded))
        return outcome.status.value


class Atomic(TwoPhase):
    name, label = "atomic", "This project: atomic (run_atomic)"

    def _build(self, message: Message) -> Callable[[Transaction], Any]:
        def build(tx: Transaction) -> dict[str, Any]:
            entry_id = f"entry-{uuid.uuid4().hex}"
            tx.create(entry_id, entry_body(message))
            return {"entry": entry_id}
        return build

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        outcome = self.idempotency.run_atomic(key, request_hash(message.body), self._build(message),
                                              read_first=self.read_first(message))
        if outcome.status in (OutcomeStatus.PROCESSED, OutcomeStatus.TAKEN_OVER,
                              OutcomeStatus.LEASE_LOST):  # the effect ran now
            self.effects.add(message.message_id)
        return outcome.status.value

    def read_first(self, message: Message) -> bool:
        return False


class AtomicOutbox(Atomic):
    """`atomic` with one outgoing message per new message (recorded on the marker in the
    commit, dispatched after it, recorded as dispatched); a redelivery reads the marker first
    (`read_first`), as `orders` does. Sends are costed, not made (`benchmarks.counting`)."""

    name, label = "atomic+outbox", "This project: atomic + one outgoing message (outbox)"

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.idempotency.dispatcher = CostedDispatcher(setup.tally, setup.rtt_ms)

    def _build(self, message: Message) -> Callable[[Transaction], Any]:
        effect = super()._build(message)

        def build(tx: Transaction) -> dict[str, Any]:
            result = effect(tx)
            tx.send("notifications", {"type": "Accepted", "id": message.message_id})
            return result
        return build

    def read_first(self, message: Message) -> bool:
        return message.delivery_count > 1


class AtomicCached(Atomic):
    name, label = "atomic+cache", "This project: atomic + local cache"

    def __init__(self, setup: Setup) -> None:
        self.cache = CompletedKeyCache(10_000, max_age=timedelta(minutes=30))
        super().__init__(setup)

    def restart(self) -> None:
        assert self.cache is not None
        self.cache.clear()


class AtomicWatermark(Atomic):
    name, label = "atomic+hwm", "This project: atomic + Event Hubs high-water mark"

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.watermark = PartitionWatermark(self.store, consumer=CONSUMER, event_hub=EVENT_HUB,
                                            consumer_group=CONSUMER_GROUP)

    def handle_batch(self, batch: list[Message]) -> list[str]:
        partition_id = batch[0].partition_id or "0"
        mark = self.watermark.read(partition_id)  # one point read per batch
        below = mark.sequence_number if mark is not None else -1
        outcomes: list[str] = []
        for event in batch:
            fresh = event.sequence_number is None or event.sequence_number > below
            outcomes.append(self.handle(event) if fresh else "replay_skipped")
        skipped = outcomes.count("replay_skipped")
        self.idempotency.telemetry.replay_skipped(skipped, consumer=CONSUMER,
                                                  partition_id=partition_id)
        if skipped < len(batch):  # every event committed: move the mark (a no-op when it is ahead)
            last = max(e.sequence_number or 0 for e in batch)
            self.watermark.advance(partition_id, last, known=mark)
        return outcomes


# -- latency: payment batches --------------------------------------------------------------------
@dataclass(frozen=True)
class Payment:
    key: DedupKey
    account: str
    cents: int  # signed
    content: dict[str, Any]


def parse_payment(event: EventView) -> Payment:
    """The same decoding and validation work for every variant."""
    cloud_event = parse_cloudevent(event.body, event.properties, event.content_type)
    key = DedupKey.from_cloudevent(PAYMENTS, cloud_event.source, cloud_event.id)
    data = cloud_event.data
    sign = SIGNS.get(cloud_event.type)
    if sign is None or not isinstance(data, dict):
        raise ValueError(f"not a payment: {cloud_event.type!r}")
    account, amount = data.get("accountId"), data.get("amountCents")
    if not isinstance(account, str) or not isinstance(amount, int) or amount <= 0:
        raise ValueError("invalid payment data")
    content = {"type": cloud_event.type, "accountId": account, "amountCents": amount}
    return Payment(key, account, sign * amount, content)


def account_totals(events: list[EventView]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for event in events:
        payment = parse_payment(event)
        totals[payment.account] += payment.cents
    return totals


def balance_of(store: IdempotencyStore, account: str) -> int | None:
    document = store.read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    return None if document is None else int(document.body["balanceCents"])


class PaymentVariant(Variant):
    def process(self, events: list[EventView], partition_id: str) -> None:
        raise NotImplementedError


class PerEventDedup(PaymentVariant):
    """A copy of the payments batch before grouped commits (parking left out)."""

    name, label = "per-event", "Dedup, per event, sequential (old path)"
    roles = ("ledger", "dedup")

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.restart()

    def restart(self) -> None:
        self.ledger = Idempotency(self.stores.sync["ledger"],
                                  config=self.settings.idempotency_config(), telemetry=Telemetry())
        self.watermark = PartitionWatermark(self.stores.sync["dedup"], consumer=PAYMENTS,
                                            event_hub=EVENT_HUB, consumer_group=CONSUMER_GROUP)

    def _apply(self, payment: Payment, context: dict[str, Any]) -> OutcomeStatus:
        def build(tx: Any) -> dict[str, Any]:
            account = tx.read(ACCOUNT_DOCUMENT)
            balance = int(account.body["balanceCents"]) if account else 0
            body = {"accountId": payment.account, "balanceCents": balance + payment.cents,
                    "kind": "account"}
            if account is None:
                tx.create(ACCOUNT_DOCUMENT, body)
            else:
                tx.replace(ACCOUNT_DOCUMENT, body, etag=account.etag)
            return {"balanceCents": body["balanceCents"]}

        return self.ledger.run_atomic(payment.key, request_hash(payment.content), build,
                                      partition=store_safe_id(payment.account),
                                      context=context).status

    def process(self, events: list[EventView], partition_id: str) -> None:
        mark = self.watermark.read(partition_id)
        fresh = [e for e in events if mark is None or e.sequence_number > mark.sequence_number]
        self.outcomes["replay_skipped"] += len(events) - len(fresh)
        self.ledger.telemetry.replay_skipped(len(events) - len(fresh), consumer=PAYMENTS,
                                             partition_id=partition_id)
        for event in sorted(fresh, key=lambda e: e.sequence_number):
            payment = parse_payment(event)
            context = {"partition_id": partition_id, "sequence_number": event.sequence_number,
                       "event_hub": EVENT_HUB}
            for attempt in range(1, MAX_ATTEMPTS + 1):
                try:
                    status = self._apply(payment, {**context, "attempt": attempt})
                except IdempotencyError:
                    if attempt == MAX_ATTEMPTS:
                        raise
                    time.sleep(BACKOFF * 2 ** (attempt - 1))
                    continue
                self.outcomes[status.value] += 1
                break
        if fresh:
            self.watermark.advance(partition_id, max(e.sequence_number for e in fresh), known=mark)


class NoDedupSequential(PaymentVariant):
    name, label, dedup = "no-dedup-seq", "No dedup, per event, sequential", False

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.raw = Raw(self.stores.sync["ledger"])

    def _add(self, account: str, cents: int) -> None:
        """One read and one single-document write (etag-conditional; re-read on a lost race)."""
        partition = store_safe_id(account)
        for _ in range(10):
            found = self.raw.read(partition, ACCOUNT_DOCUMENT)
            balance = int(found[0]["balanceCents"]) if found else 0
            body = {"accountId": account, "balanceCents": balance + cents, "kind": "account"}
            try:
                if found is None:
                    self.raw.create(partition, ACCOUNT_DOCUMENT, body)
                else:
                    self.raw.replace_if(partition, ACCOUNT_DOCUMENT, body, found[1])
                return
            except (ExistsError, ChangedError):
                self.outcomes["lost_race"] += 1
        raise RuntimeError(f"balance of {account}: lost 10 races")

    def process(self, events: list[EventView], partition_id: str) -> None:
        for event in sorted(events, key=lambda e: e.sequence_number):
            payment = parse_payment(event)
            self._add(payment.account, payment.cents)
            self.outcomes["applied"] += 1


class NoDedupGrouped(NoDedupSequential):
    name, label = "no-dedup-grouped", "No dedup, per account, concurrent (limit)"

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self._pool = ThreadPoolExecutor(max_workers=setup.concurrency, thread_name_prefix="limit")

    def process(self, events: list[EventView], partition_id: str) -> None:
        for future in [self._pool.submit(self._add, account, cents)
                       for account, cents in account_totals(events).items()]:
            future.result()
        self.outcomes["applied"] += len(events)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class NoDedupRemembered(PaymentVariant):
    """The app's request shape with the dedup work taken out: what `app` would cost if
    markers, hashing and the flow were free. An account not written yet is created (a 409
    reads and replaces it)."""

    name, label = "no-dedup-etags", "No dedup, remembered etags, per account, concurrent (async)"
    dedup, aio = False, True
    roles = ("ledger", "dedup")

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.ledger = AsyncRaw(self.stores.aio["ledger"])
        self.marks = AsyncRaw(self.stores.aio["dedup"])
        self.restart()

    def restart(self) -> None:
        self.known: dict[tuple[str, str], tuple[int, str | None]] = {}  # (partition, id) -> (value, etag)

    async def _put(self, raw: AsyncRaw, partition: str, item_id: str,
                   body: Callable[[int | None], dict[str, Any]],
                   value_of: Callable[[dict[str, Any]], int]) -> None:
        """Write with the remembered etag; an unknown item is created; a lost race re-reads."""
        key = (partition, item_id)
        for _ in range(10):
            known = self.known.get(key)
            try:
                new = body(None if known is None else known[0])
                etag = (await raw.create(partition, item_id, new) if known is None
                        else await raw.replace_if(partition, item_id, new, known[1]))
                self.known[key] = (value_of(new), etag)
                return
            except (ExistsError, ChangedError):
                self.outcomes["lost_race"] += 1
                found = await raw.read(partition, item_id)
                if found is None:
                    self.known.pop(key, None)
                else:
                    self.known[key] = (value_of(found[0]), found[1])
        raise RuntimeError(f"{item_id} in {partition}: lost 10 races")

    async def _batch(self, events: list[EventView], partition_id: str) -> None:
        gate = asyncio.Semaphore(self.setup.concurrency)

        async def account(name: str, cents: int) -> None:
            async with gate:
                await self._put(
                    self.ledger, store_safe_id(name), ACCOUNT_DOCUMENT,
                    lambda old: {"accountId": name, "balanceCents": (old or 0) + cents, "kind": "account"},
                    lambda doc: int(doc["balanceCents"]))

        await asyncio.gather(*(account(name, cents) for name, cents in account_totals(events).items()))
        last = max(e.sequence_number for e in events)
        await self._put(self.marks, store_safe_id(f"{PAYMENTS}:{partition_id}"), "mark",
                        lambda _old: {"sequenceNumber": last, "kind": "mark"},
                        lambda doc: int(doc["sequenceNumber"]))
        self.outcomes["applied"] += len(events)

    def process(self, events: list[EventView], partition_id: str) -> None:
        assert self.stores.run is not None
        self.stores.run(self._batch(events, partition_id))


class SyncAppPath(PaymentVariant):
    """The sync `PartitionBatchProcessor.process_batch` (account groups on threads, sync SDKs)
    as `build_services` wires it: the processor behind the HTTP API and the replay tool."""

    name, label, project = "app-sync", "This project: PartitionBatchProcessor (threads)", True
    roles = ("ledger", "dedup", "parked")

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        self.restart()

    def restart(self) -> None:
        self.services: Services = build_services(
            self.settings, stores=self.stores.factory(),
            dispatcher=CostedDispatcher(self.setup.tally, self.setup.rtt_ms))

    def _report(self, events: list[EventView], partition_id: str) -> BatchReport:
        return self.services.payments.process_batch(events, partition_id)

    def process(self, events: list[EventView], partition_id: str) -> None:
        report = self._report(events, partition_id)
        self.outcomes["applied"] += report.applied
        self.outcomes["duplicate"] += report.duplicates
        self.outcomes["replay_skipped"] += report.replay_skipped
        for reason, count in report.parked.items():
            self.outcomes[f"parked:{reason}"] += count


class AppPath(SyncAppPath):
    """What the `payments` function runs: `shared.aio.PartitionBatchProcessor.process_batch` on
    the async stores, awaited on one event loop, its sends awaited."""

    name, label, aio = "app", "This project: payments function (async)", True

    def restart(self) -> None:
        self.services = build_services(
            self.settings, stores=self.stores.factory(), async_stores=self.stores.async_factory(),
            async_dispatcher=AsyncCostedDispatcher(self.setup.tally, self.setup.rtt_ms),
            clock=self.setup.clock)

    def _report(self, events: list[EventView], partition_id: str) -> BatchReport:
        assert self.stores.run is not None
        return self.stores.run(self.services.payments_async.process_batch(events, partition_id))


class AppNoPublish(AppPath):
    """`app` with `BALANCE_CHANGES_QUEUE` empty: no outgoing messages."""

    name, label = "app-no-publish", "This project: payments function, publishing off"
    env = {"BALANCE_CHANGES_QUEUE": ""}


class ColdAppPath(AppPath):
    """`app` with nothing remembered between batches (a restart before each): it reads the
    mark and every balance, as the no-dedup limit does, so the two make the same round trips."""

    name, label = "app-cold", "This project: payments function, nothing remembered"

    def process(self, events: list[EventView], partition_id: str) -> None:
        self.restart()
        super().process(events, partition_id)


class SameTransactions(PaymentVariant):
    """The transactions `app` sends, written inline on the raw async SDK clients: per batch the
    mark read (the partition's first batch), a balance read for each account not written
    yet, one transaction per account (each event's marker, the first carrying the account's
    `BalanceChanged` and its event's position, then the balance created or replaced under its
    etag), accounts concurrently up to the app's bound, the messages' sends costed as the
    app's, then the mark created or replaced under its etag; after a restart, a batch the mark
    covers costs its read. No library code per event (`benchmarks.raw_payments`); what the
    documents hold is learnt from the app at set-up (`benchmarks.app_requests`), so the
    markers are the app's byte for byte. Failures are not handled (none are provoked): a
    refused write stops the run. What `app` costs beyond this is the library's own work."""

    name, label = "same-transactions", "Same transactions, raw SDK, no library (async)"
    aio = True
    roles = ("ledger", "dedup", "parked")  # parked: the app's, for the set-up probe

    def __init__(self, setup: Setup) -> None:
        super().__init__(setup)
        ledger, marks = self.stores.aio["ledger"], self.stores.aio["dedup"]
        self.cosmos = hasattr(ledger, "container")
        self.shape = self._learn()
        t = self.shape.templates
        self._first, self._marker, self._balance, self._mark = (
            t.first_marker.build, t.marker.build, t.balance.build, t.mark.build)
        if self.cosmos:
            self._ledger, self._marks = ledger.container, marks.container
        else:
            self._ledger_batch = raw.TableBatch(ledger.client)
            self._marks_batch = raw.TableBatch(marks.client)
        self._reader, self._mark_reader = AsyncRaw(ledger), AsyncRaw(marks)
        self._id, self._pk = ("id", "pk") if self.cosmos else ("RowKey", "PartitionKey")
        self.restart()

    def _learn(self) -> AppShape:
        """The app's documents, learnt from the app itself on these stores (see app_requests)."""
        assert self.stores.run is not None
        services = build_services(self.settings, stores=self.stores.factory(),
                                  async_stores=self.stores.async_factory(),
                                  async_dispatcher=probe_dispatcher(), clock=lambda: PROBE_TIME)
        roles = {**{store.container.id: role for role, store in self.stores.aio.items()
                    if hasattr(store, "container")},
                 **{store.client.table_name: role for role, store in self.stores.aio.items()
                    if not hasattr(store, "container")}}
        return learn_app(services=services, run=self.stores.run, counters=self.setup.counters,
                         roles=roles, cosmos=hasattr(self.stores.aio["ledger"], "container"),
                         settings=self.settings, send_limit=SEND_BYTES,
                         header_allowance=_HEADER_ALLOWANCE, namespace=_ID_NAMESPACE)

    def restart(self) -> None:
        self.balances: dict[str, tuple[int, int, str]] = {}  # account -> (cents, version, etag)
        self.marks: dict[str, tuple[int, str]] = {}  # partition id -> (sequence, etag)

    async def _commit(self, ledger: bool, partition: str,
                      operations: list[tuple[str, dict[str, Any], str | None]]) -> list[str]:
        """One transaction; the new etag of each write."""
        if not self.cosmos:
            batch = self._ledger_batch if ledger else self._marks_batch
            return await batch.submit(operations)
        container = self._ledger if ledger else self._marks
        ops = [("create", (doc,)) if kind == "create" else
               ("replace", (doc["id"], doc), {"if_match_etag": etag})
               for kind, doc, etag in operations]
        # As the app's stores send it: the service echoes no item (Prefer: return=minimal).
        results = await container.execute_item_batch(ops, partition_key=partition, no_response=True)
        return [str(result.get("eTag") or (result.get("resourceBody") or {}).get("_etag"))
                for result in results]

    async def _account(self, account: str, group: list[raw.Payment], partition_id: str,
                       gate: asyncio.Semaphore, outgoing: list[int]) -> None:
        shape, clock = self.shape, self.setup.clock
        partition = raw.safe_id(account)
        async with gate:
            known = self.balances.get(account)
            if known is None:
                found = await self._reader.read(partition, shape.balance_id)
                if found is not None:
                    body, etag = found
                    known = (int(body["balanceCents"]), int(body.get("version", 0)), etag or "")
            cents, version = (known[0], known[1]) if known else (0, 0)
            documents: list[tuple[str, dict[str, Any], str | None]] = []
            facts: list[raw.MarkerFacts] = []
            for paid in group:
                cents += paid.cents
                now = clock()
                facts.append(raw.MarkerFacts(paid.key, raw.record_id(PAYMENTS, paid.key),
                                             partition, paid.digest, cents, now,
                                             now + shape.ttl_seconds))
            version += len(group)
            if not -2**31 <= cents < 2**31:
                raise ValueError(f"balance {cents} of {account}: the templates know Int32 balances")
            if shape.queue:
                first = group[0]
                message = raw.balance_changed(
                    consumer=PAYMENTS, key=first.key, marker_id=facts[0].record_id,
                    queue=shape.queue, account=account, balance=cents,
                    version=version, event_ids=[p.event_id for p in group],
                    header_allowance=shape.header_allowance)
                facts[0].outbox = message.stored
                facts[0].position = raw.position(shape.event_hub, partition_id, first.sequence)
                outgoing.append(message.weight)
            documents.append(("create", self._first(facts[0]), None))
            documents += [("create", self._marker(f), None) for f in facts[1:]]
            balance = self._balance(raw.BalanceFacts(account, partition, cents, version))
            documents.append(("create", balance, None) if known is None
                             else ("replace", balance, known[2]))
            etags = await self._commit(True, partition, documents)
            self.balances[account] = (cents, version, etags[-1])

    async def _batch(self, events: list[EventView], partition_id: str) -> None:
        shape = self.shape
        mark_id = raw.safe_id(partition_id)
        mark = self.marks.get(partition_id)
        if mark is None:
            found = await self._mark_reader.read(shape.mark_partition, mark_id)
            if found is not None:
                mark = (int(found[0]["sequenceNumber"]), found[1] or "")
                self.marks[partition_id] = mark
        fresh = sorted((e for e in events if mark is None or e.sequence_number > mark[0]),
                       key=lambda e: e.sequence_number)
        self.outcomes["replay_skipped"] += len(events) - len(fresh)
        if not fresh:
            return
        groups: dict[str, list[raw.Payment]] = {}
        for event in fresh:
            if event.enqueued_time is not None:
                raise ValueError("the templates know positions without an enqueued time")
            paid = raw.payment(event.body, event.sequence_number, event.offset)
            groups.setdefault(paid.account, []).append(paid)
        if max(len(g) for g in groups.values()) >= 100:
            raise ValueError("an account's group exceeds one transaction (the app splits it)")
        gate = asyncio.Semaphore(shape.concurrency)
        outgoing: list[int] = []
        await asyncio.gather(*(self._account(account, group, partition_id, gate, outgoing)
                               for account, group in groups.items()))
        if outgoing:  # one dispatch of the batch's messages, costed as the app's dispatcher's
            sends = raw.sends(outgoing, shape.send_limit)
            self.setup.tally.count(sends, len(outgoing))
            await asyncio.sleep(sends * self.setup.rtt_ms / 1000 if self.setup.rtt_ms > 0 else 0)
        newest = fresh[-1]
        document = self._mark(raw.MarkFacts(mark_id, shape.mark_partition, newest.sequence_number,
                                            partition_id, newest.offset))
        (etag,) = await self._commit(False, shape.mark_partition,
                                     [("create", document, None) if mark is None
                                      else ("replace", document, mark[1])])
        self.marks[partition_id] = (newest.sequence_number, etag)
        self.outcomes["applied"] += len(fresh)

    def process(self, events: list[EventView], partition_id: str) -> None:
        assert self.stores.run is not None
        self.stores.run(self._batch(events, partition_id))


LOOPBACK_VARIANTS: dict[str, type[MessageVariant]] = {
    cls.name: cls for cls in (NoDedup, NaiveCheckThenAct, PowertoolsStyle, TwoPhase, Atomic,
                              AtomicOutbox, AtomicCached, AtomicWatermark)}
LATENCY_VARIANTS: dict[str, type[PaymentVariant]] = {
    cls.name: cls for cls in (PerEventDedup, NoDedupSequential, NoDedupGrouped, NoDedupRemembered,
                              SameTransactions, SyncAppPath, AppPath, AppNoPublish, ColdAppPath)}
BASELINE = NoDedup.name
PER_EVENT, LIMIT, REMEMBERED = PerEventDedup.name, NoDedupGrouped.name, NoDedupRemembered.name
SAME = SameTransactions.name
APP, NO_PUBLISH, SYNC_APP, COLD_APP = (AppPath.name, AppNoPublish.name, SyncAppPath.name,
                                       ColdAppPath.name)
