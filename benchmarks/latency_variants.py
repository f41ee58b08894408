"""The payment consumers compared by the latency benchmark, and their workload.

Every variant turns the same Event Hubs batches of payment CloudEvents into
account balances (one `balance` document per account, in the account's
partition, as `domain.payments` keeps it):

* `per-event`: the dedup path as the payments batch was before
  grouped commits, kept here as a benchmark variant only. Per batch: read the
  partition's high-water mark; per fresh event, in sequence order: read the
  balance, then commit the marker + the new balance in one transaction
  (`Idempotency.run_atomic`); then advance the mark. 2 requests per event.
* `no-dedup-seq`: the same sequential shape without markers or a mark: per
  event, read the balance and write it back (one single-document request,
  etag-conditional). 2 requests per event.
* `no-dedup-grouped`: the limit for grouped dedup: per batch, one read and one
  single-document write per account, accounts run concurrently on a bounded
  thread pool. 2 requests per account per batch.
* `no-dedup-etags`: the limit for the app's own shape (what the app would cost with
  the dedup work free): async on the same aio clients, the balances and their etags
  remembered, so per batch one etag-conditional balance write per account (no read;
  accounts concurrent, bounded like the app) and then the partition's mark write.
  An account it has not written yet is created (a 409 reads and replaces it).
  `len(accounts) + 1` requests per batch.
* `app`: what the `payments` function runs, whatever it is when the benchmark
  runs: `shared.aio.PartitionBatchProcessor.process_batch(events, partition_id)` built by
  `functions.services.build_services` on the benchmark's counted async stores
  (azure.cosmos.aio, azure.data.tables.aio), awaited on one event loop.
* `app-sync`: the same batch through the sync `PartitionBatchProcessor` (account groups
  on threads, sync SDKs), as the HTTP API and the replay tool use it.
* `app-cold`: `app` rebuilt before every batch, so it remembers no mark and no
  balance: a mark read, a balance read per account, then the same transactions.

The no-dedup variants are the cheapest store traffic that produces the same
balances when nothing is delivered twice (a replay applies a batch again).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.cosmos.exceptions import (
    CosmosAccessConditionFailedError,
    CosmosResourceExistsError,
    CosmosResourceNotFoundError,
)
from azure.data.tables import UpdateMode

from benchmarks.variants import ChangedError, ExistsError, RawStore, raw_store
from domain.messages import InboundEvent
from functions.services import Services, build_services
from functions.settings import Settings
from shared import (
    DedupKey,
    Idempotency,
    IdempotencyConfig,
    IdempotencyError,
    IdempotencyStore,
    InMemoryIdempotencyStore,
    OutcomeStatus,
    request_hash,
    store_safe_id,
)
from shared.batch import BatchReport
from shared.cloudevents import parse_cloudevent
from shared.telemetry import Telemetry
from shared.watermark import PartitionWatermark

CONSUMER = "payments"  # as domain.payments
ACCOUNT_DOCUMENT = "balance"
EVENT_HUB = "payments"
CONSUMER_GROUP = "$Default"
CLOUDEVENTS_JSON = "application/cloudevents+json; charset=utf-8"
SIGNS = {"payment.credit": 1, "payment.debit": -1}
MAX_ATTEMPTS = 3  # PAYMENTS_MAX_ATTEMPTS default
BACKOFF = 0.2


# -- workload ---------------------------------------------------------------------------------
@dataclass
class PaymentWorkload:
    """Batches of payment events on one partition, and the balances they must produce."""

    accounts: list[str]
    batches: list[list[InboundEvent]]
    warmup: list[InboundEvent]
    expected: dict[str, int]  # account -> balance after every batch once
    amounts: dict[int, tuple[str, int]] = field(default_factory=dict)  # sequence -> (account, cents)

    @property
    def events(self) -> int:
        return sum(len(b) for b in self.batches)

    def accounts_in(self, batch: list[InboundEvent]) -> set[str]:
        return {self.amounts[e.sequence_number][0] for e in batch}

    def batch_delta(self, batch: list[InboundEvent]) -> dict[str, int]:
        delta: dict[str, int] = defaultdict(int)
        for event in batch:
            account, cents = self.amounts[event.sequence_number]
            delta[account] += cents
        return delta


def _event(source: str, sequence: int, event_id: str, account: str, cents: int,
           rng: random.Random) -> InboundEvent:
    kind = "payment.credit" if rng.random() < 0.7 else "payment.debit"
    envelope = {"specversion": "1.0", "id": event_id, "source": source, "type": kind,
                "datacontenttype": "application/json",
                "data": {"accountId": account, "amountCents": cents}}
    return InboundEvent(sequence_number=sequence, body=json.dumps(envelope).encode(),
                        content_type=CLOUDEVENTS_JSON, offset=str(sequence * 512),
                        partition_key=account)


def build_payment_workload(*, events: int, accounts: int, batch_size: int, seed: int,
                           warmup_events: int) -> PaymentWorkload:
    """Seeded: the same events, accounts and amounts for every variant."""
    rng = random.Random(f"latency-{seed}-{accounts}")
    names = [f"acct-{seed}-{n:04d}" for n in range(accounts)]
    source = f"/bench/{seed}/payments"
    workload = PaymentWorkload(names, [], [], dict.fromkeys(names, 0))
    flat: list[InboundEvent] = []
    for sequence in range(1, events + 1):
        account = rng.choice(names)
        cents = rng.randint(1, 100_000)
        event = _event(source, sequence, f"pay-{sequence:07d}", account, cents, rng)
        signed = SIGNS[json.loads(event.body)["type"]] * cents
        workload.amounts[sequence] = (account, signed)
        workload.expected[account] += signed
        flat.append(event)
    workload.batches = [flat[i:i + batch_size] for i in range(0, len(flat), batch_size)]
    warm_names = [f"warm-{seed}-{n:04d}" for n in range(min(accounts, max(1, warmup_events)))]
    workload.warmup = [_event(f"/bench/{seed}/warmup", n, f"warm-{n:07d}", rng.choice(warm_names),
                              rng.randint(1, 1000), rng) for n in range(1, warmup_events + 1)]
    return workload


@dataclass(frozen=True)
class Payment:
    key: DedupKey
    account: str
    cents: int  # signed
    content: dict[str, Any]


def parse_payment(event: InboundEvent) -> Payment:
    """The same decoding and validation work for every variant."""
    cloud_event = parse_cloudevent(event.body, event.properties, event.content_type)
    key = DedupKey.from_cloudevent(CONSUMER, cloud_event.source, cloud_event.id)
    data = cloud_event.data
    sign = SIGNS.get(cloud_event.type)
    if sign is None or not isinstance(data, dict):
        raise ValueError(f"not a payment: {cloud_event.type!r}")
    account, amount = data.get("accountId"), data.get("amountCents")
    if not isinstance(account, str) or not isinstance(amount, int) or amount <= 0:
        raise ValueError("invalid payment data")
    content = {"type": cloud_event.type, "accountId": account, "amountCents": amount}
    return Payment(key, account, sign * amount, content)


# -- stores -------------------------------------------------------------------------------------
@dataclass
class PaymentStores:
    """A variant's stores by the app's role names (ledger, dedup, parked), all counted."""

    ledger: IdempotencyStore
    dedup: IdempotencyStore | None = None
    parked: IdempotencyStore | None = None
    aio: dict[str, Any] = field(default_factory=dict)  # async stores on the same tables, by role
    run: Callable[[Coroutine[Any, Any, Any]], Any] | None = None  # runs on the async stores' loop

    def factory(self) -> Callable[[str], IdempotencyStore]:
        """For `build_services(stores=...)`: payments' roles here, the others in memory (unused)."""
        spare: dict[str, IdempotencyStore] = {}

        def store(role: str) -> IdempotencyStore:
            found = {"ledger": self.ledger, "dedup": self.dedup, "parked": self.parked}.get(role)
            if found is not None:
                return found
            return spare.setdefault(role, InMemoryIdempotencyStore())

        return store


def balance_of(store: IdempotencyStore, account: str) -> int | None:
    document = store.read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    return None if document is None else int(document.body["balanceCents"])


# -- variants -------------------------------------------------------------------------------------
class PaymentVariant:
    name = "variant"
    label = "variant"
    dedup = True
    roles: tuple[str, ...] = ("ledger",)

    def __init__(self, backend: str, stores: PaymentStores, *, settings: Settings,
                 concurrency: int) -> None:
        self.backend = backend
        self.stores = stores
        self.settings = settings
        self.concurrency = concurrency
        self.outcomes: dict[str, int] = defaultdict(int)

    def process(self, events: list[InboundEvent], partition_id: str) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        """A host restart or partition move: process-local state is gone."""

    def close(self) -> None:
        """Release threads (stores are closed by the harness)."""


class PerEventDedup(PaymentVariant):
    """A copy of the payments batch (`PartitionBatchProcessor.process_batch`) before grouped
    commits (parking left out)."""

    name, label = "per-event", "Dedup, per event, sequential (old path)"
    roles = ("ledger", "dedup")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.restart()

    def restart(self) -> None:
        config: IdempotencyConfig = self.settings.idempotency_config()
        self.ledger = Idempotency(self.stores.ledger, config=config, telemetry=Telemetry())
        assert self.stores.dedup is not None
        self.watermark = PartitionWatermark(self.stores.dedup, consumer=CONSUMER,
                                            event_hub=EVENT_HUB, consumer_group=CONSUMER_GROUP)

    def _apply(self, payment: Payment, context: dict[str, Any]) -> OutcomeStatus:
        partition = store_safe_id(payment.account)

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
                                      partition=partition, context=context).status

    def process(self, events: list[InboundEvent], partition_id: str) -> None:
        mark = self.watermark.read(partition_id)
        fresh = [e for e in events if mark is None or e.sequence_number > mark.sequence_number]
        self.outcomes["replay_skipped"] += len(events) - len(fresh)
        self.ledger.telemetry.replay_skipped(len(events) - len(fresh), consumer=CONSUMER,
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


class _NoDedup(PaymentVariant):
    dedup = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raw: RawStore = raw_store(self.stores.ledger)

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


class NoDedupSequential(_NoDedup):
    name, label = "no-dedup-seq", "No dedup, per event, sequential"

    def process(self, events: list[InboundEvent], partition_id: str) -> None:
        for event in sorted(events, key=lambda e: e.sequence_number):
            payment = parse_payment(event)
            self._add(payment.account, payment.cents)
            self.outcomes["applied"] += 1


class NoDedupGrouped(_NoDedup):
    name, label = "no-dedup-grouped", "No dedup, per account, concurrent (limit)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="limit")

    def process(self, events: list[InboundEvent], partition_id: str) -> None:
        totals: dict[str, int] = defaultdict(int)
        for event in events:
            payment = parse_payment(event)
            totals[payment.account] += payment.cents
        for future in [self._pool.submit(self._add, account, cents)
                       for account, cents in totals.items()]:
            future.result()
        self.outcomes["applied"] += len(events)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class AsyncRaw:
    """Single-request writes and reads on an async store's own SDK client (no store layer)."""

    def __init__(self, store: Any) -> None:
        self.cosmos = hasattr(store, "container")
        self._client = store.container if self.cosmos else store.client

    async def create(self, partition: str, item_id: str, body: dict[str, Any]) -> str | None:
        try:
            if self.cosmos:
                item = await self._client.create_item({**body, "id": item_id, "pk": partition})
                return item.get("_etag")
            meta = await self._client.create_entity({**body, "PartitionKey": partition, "RowKey": item_id})
            return meta.get("etag")
        except (CosmosResourceExistsError, ResourceExistsError) as error:
            raise ExistsError(item_id) from error

    async def read(self, partition: str, item_id: str) -> tuple[dict[str, Any], str | None] | None:
        try:
            if self.cosmos:
                item = await self._client.read_item(item_id, partition)
                return item, item.get("_etag")
            entity = await self._client.get_entity(partition, item_id)
            return dict(entity), entity.metadata.get("etag")
        except (CosmosResourceNotFoundError, ResourceNotFoundError):
            return None

    async def replace_if(self, partition: str, item_id: str, body: dict[str, Any],
                         etag: str | None) -> str | None:
        try:
            if self.cosmos:
                item = await self._client.replace_item(
                    item_id, {**body, "id": item_id, "pk": partition}, etag=etag,
                    match_condition=MatchConditions.IfNotModified)
                return item.get("_etag")
            meta = await self._client.update_entity(
                {**body, "PartitionKey": partition, "RowKey": item_id}, mode=UpdateMode.REPLACE,
                etag=etag, match_condition=MatchConditions.IfNotModified)
            return meta.get("etag")
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError,
                ResourceModifiedError, ResourceNotFoundError) as error:
            raise ChangedError(item_id) from error


class NoDedupRemembered(PaymentVariant):
    """The app's request shape with the dedup work taken out: what `app` would cost if
    markers, hashing and the flow were free. Async on the same aio clients as `app`,
    balances and etags remembered between batches (as the app remembers them)."""

    name, label = "no-dedup-etags", "No dedup, remembered etags, per account, concurrent (async)"
    dedup = False
    roles = ("ledger", "dedup")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger = AsyncRaw(self.stores.aio["ledger"])
        self.marks = AsyncRaw(self.stores.aio["dedup"])
        self.restart()

    def restart(self) -> None:
        self.known: dict[tuple[str, str], tuple[int, str | None]] = {}  # (partition, id) -> (value, etag)

    async def _put(self, raw: AsyncRaw, partition: str, item_id: str,
                   body: Callable[[int | None], dict[str, Any]], value_of: Callable[[dict[str, Any]], int]
                   ) -> None:
        """Write with the remembered etag; an unknown item is created; a lost race re-reads."""
        key = (partition, item_id)
        for _ in range(10):
            known = self.known.get(key)
            try:
                if known is None:
                    new = body(None)
                    etag = await raw.create(partition, item_id, new)
                else:
                    new = body(known[0])
                    etag = await raw.replace_if(partition, item_id, new, known[1])
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

    async def _batch(self, events: list[InboundEvent], partition_id: str) -> None:
        totals: dict[str, int] = defaultdict(int)
        for event in events:
            payment = parse_payment(event)
            totals[payment.account] += payment.cents
        gate = asyncio.Semaphore(self.concurrency)

        async def account(name: str, cents: int) -> None:
            async with gate:
                await self._put(
                    self.ledger, store_safe_id(name), ACCOUNT_DOCUMENT,
                    lambda old: {"accountId": name, "balanceCents": (old or 0) + cents, "kind": "account"},
                    lambda doc: int(doc["balanceCents"]))

        await asyncio.gather(*(account(name, cents) for name, cents in totals.items()))
        last = max(e.sequence_number for e in events)
        await self._put(self.marks, store_safe_id(f"{CONSUMER}:{partition_id}"), "mark",
                        lambda _old: {"sequenceNumber": last, "kind": "mark"},
                        lambda doc: int(doc["sequenceNumber"]))
        self.outcomes["applied"] += len(events)

    def process(self, events: list[InboundEvent], partition_id: str) -> None:
        assert self.stores.run is not None
        self.stores.run(self._batch(events, partition_id))


class SyncAppPath(PaymentVariant):
    """The payments `PartitionBatchProcessor.process_batch` (threads, sync SDKs) as
    `build_services` wires it: the processor behind the HTTP API and the replay tool."""

    name, label = "app-sync", "This project: PartitionBatchProcessor (threads)"
    roles = ("ledger", "dedup", "parked")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.restart()

    def restart(self) -> None:
        self.services: Services = build_services(self.settings, stores=self.stores.factory())

    def _report(self, events: list[InboundEvent], partition_id: str) -> BatchReport:
        return self.services.payments.process_batch(events, partition_id)

    def process(self, events: list[InboundEvent], partition_id: str) -> None:
        report = self._report(events, partition_id)
        self.outcomes["applied"] += report.applied
        self.outcomes["duplicate"] += report.duplicates
        self.outcomes["replay_skipped"] += report.replay_skipped
        for reason, count in report.parked.items():
            self.outcomes[f"parked:{reason}"] += count


class AppPath(SyncAppPath):
    """What the `payments` function runs: `shared.aio.PartitionBatchProcessor.process_batch` on
    the async stores (azure.cosmos.aio, azure.data.tables.aio), awaited on one event loop."""

    name, label = "app", "This project: payments function (async)"

    def restart(self) -> None:
        self.services = build_services(self.settings, stores=self.stores.factory(),
                                       async_stores=self.stores.aio.__getitem__)

    def _report(self, events: list[InboundEvent], partition_id: str) -> BatchReport:
        assert self.stores.run is not None
        return self.stores.run(self.services.payments_async.process_batch(events, partition_id))


class ColdAppPath(AppPath):
    """`app` with nothing remembered between batches (a restart before each): it reads the
    mark and every balance, as the no-dedup limit does, so the two make the same round trips."""

    name, label = "app-cold", "This project: payments function, nothing remembered"

    def process(self, events: list[InboundEvent], partition_id: str) -> None:
        self.restart()
        super().process(events, partition_id)


LATENCY_VARIANTS: dict[str, type[PaymentVariant]] = {
    cls.name: cls for cls in (PerEventDedup, NoDedupSequential, NoDedupGrouped, NoDedupRemembered,
                              SyncAppPath, AppPath, ColdAppPath)}
PER_EVENT, LIMIT, APP, SYNC_APP, COLD_APP = (PerEventDedup.name, NoDedupGrouped.name,
                                             AppPath.name, SyncAppPath.name, ColdAppPath.name)
REMEMBERED = NoDedupRemembered.name
