"""The consumers compared: this project's flows and the baselines, on one store each.

Every variant applies the same business effect for a new message: one ledger
entry with a fresh id (a non-idempotent insert, so a duplicate that gets
through shows up as an extra entry), in the message's own partition.

Baselines (implemented here, straight on the SDK clients, one request per call):

* `no-dedup`: apply the effect; nothing else.
* `naive`: check-then-act. Read the marker; if absent, apply the effect, then
  upsert the marker. Two copies can both read "absent".
* `powertools`: the AWS Lambda Powertools idempotency flow mapped to Azure:
  conditional put of an IN_PROGRESS record, the effect, then an
  etag-conditional update to COMPLETED. A 409 carries no body on Azure, so a
  duplicate reads the record (Powertools on DynamoDB gets it back from the
  failed put). Expired-record takeover is left out: this workload has none.

This project (through `shared.idempotency.Idempotency`):

* `two-phase`: `Idempotency.run` (claim in progress, effect, complete).
* `atomic`: `Idempotency.run_atomic`, marker and effect in one Cosmos
  transactional batch / Table entity-group transaction.
* `atomic+cache`: the same with the local LRU of completed keys (10 000 entries,
  30 min max age, so entries from the new-message phase are still warm when
  their duplicates come).
* `atomic+hwm`: the same as `atomic` per message; Event Hubs batches go
  through the partition high-water mark first.

Every variant other than `atomic+hwm` handles an Event Hubs batch one event at
a time, i.e. a replay without a high-water mark.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.cosmos.exceptions import (
    CosmosAccessConditionFailedError,
    CosmosResourceExistsError,
    CosmosResourceNotFoundError,
)
from azure.data.tables import UpdateMode

from benchmarks.workload import Message
from shared.cache import CompletedKeyCache
from shared.dispatch import InMemoryDispatcher
from shared.flow import Transaction
from shared.idempotency import Idempotency
from shared.keys import DedupKey, request_hash
from shared.stores import CosmosIdempotencyStore, IdempotencyStore, TableIdempotencyStore
from shared.telemetry import Telemetry
from shared.watermark import PartitionWatermark

CONSUMER = "bench"
EVENT_HUB = "payments"
CONSUMER_GROUP = "$Default"
TTL_SECONDS = 7 * 24 * 3600.0
LEASE_SECONDS = 300.0


class ExistsError(Exception):
    """Conditional create found the item (409)."""


class ChangedError(Exception):
    """Etag-conditional write lost (412/404)."""


class RawStore:
    """The handful of single-request operations the baselines need."""

    def create(self, partition: str, item_id: str, body: dict[str, Any]) -> str | None:
        raise NotImplementedError

    def read(self, partition: str, item_id: str) -> tuple[dict[str, Any], str | None] | None:
        raise NotImplementedError

    def upsert(self, partition: str, item_id: str, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def replace_if(self, partition: str, item_id: str, body: dict[str, Any], etag: str | None
                   ) -> str | None:
        raise NotImplementedError


class TableRaw(RawStore):
    def __init__(self, store: TableIdempotencyStore) -> None:
        self._client = store.client

    def create(self, partition: str, item_id: str, body: dict[str, Any]) -> str | None:
        try:
            meta = self._client.create_entity({**body, "PartitionKey": partition, "RowKey": item_id})
        except ResourceExistsError as error:
            raise ExistsError(item_id) from error
        return meta.get("etag")

    def read(self, partition: str, item_id: str) -> tuple[dict[str, Any], str | None] | None:
        try:
            entity = self._client.get_entity(partition, item_id)
        except ResourceNotFoundError:
            return None
        return dict(entity), entity.metadata.get("etag")

    def upsert(self, partition: str, item_id: str, body: dict[str, Any]) -> None:
        self._client.upsert_entity({**body, "PartitionKey": partition, "RowKey": item_id},
                                   mode=UpdateMode.REPLACE)

    def replace_if(self, partition: str, item_id: str, body: dict[str, Any], etag: str | None
                   ) -> str | None:
        try:
            meta = self._client.update_entity(
                {**body, "PartitionKey": partition, "RowKey": item_id}, mode=UpdateMode.REPLACE,
                etag=etag, match_condition=MatchConditions.IfNotModified)
        except (ResourceModifiedError, ResourceNotFoundError) as error:
            raise ChangedError(item_id) from error
        return meta.get("etag")


class CosmosRaw(RawStore):
    def __init__(self, store: CosmosIdempotencyStore) -> None:
        self._container = store.container

    def create(self, partition: str, item_id: str, body: dict[str, Any]) -> str | None:
        try:
            item = self._container.create_item({**body, "id": item_id, "pk": partition})
        except CosmosResourceExistsError as error:
            raise ExistsError(item_id) from error
        return item.get("_etag")

    def read(self, partition: str, item_id: str) -> tuple[dict[str, Any], str | None] | None:
        try:
            item = self._container.read_item(item_id, partition)
        except CosmosResourceNotFoundError:
            return None
        return item, item.get("_etag")

    def upsert(self, partition: str, item_id: str, body: dict[str, Any]) -> None:
        self._container.upsert_item({**body, "id": item_id, "pk": partition})

    def replace_if(self, partition: str, item_id: str, body: dict[str, Any], etag: str | None
                   ) -> str | None:
        try:
            item = self._container.replace_item(item_id, {**body, "id": item_id, "pk": partition},
                                                etag=etag, match_condition=MatchConditions.IfNotModified)
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError) as error:
            raise ChangedError(item_id) from error
        return item.get("_etag")


def raw_store(store: IdempotencyStore) -> RawStore:
    if isinstance(store, TableIdempotencyStore):
        return TableRaw(store)
    if isinstance(store, CosmosIdempotencyStore):
        return CosmosRaw(store)
    raise TypeError(f"no raw adapter for {type(store).__name__}")


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


class Variant:
    name = "variant"
    label = "variant"
    project = False

    def __init__(self, backend: str, store: IdempotencyStore) -> None:
        self.backend = backend
        self.store = store
        self.raw = raw_store(store)
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

    def restart(self) -> None:
        """A host restart or partition move: process-local state is gone."""


class NoDedup(Variant):
    name, label = "no-dedup", "No dedup (baseline)"

    def handle(self, message: Message) -> str:
        self.effect(message, dedup_key(message).encoded)
        return "processed"


class NaiveCheckThenAct(Variant):
    name, label = "naive", "Naive check-then-act"

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        partition = key.encoded
        if self.raw.read(partition, key.encoded) is not None:
            return "duplicate"
        self.effect(message, partition)
        self.raw.upsert(partition, key.encoded, {"state": "completed",
                                                 "hash": str(request_hash(message.body))})
        return "processed"


class PowertoolsStyle(Variant):
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


class _ProjectVariant(Variant):
    project = True

    def __init__(self, backend: str, store: IdempotencyStore, *,
                 cache: CompletedKeyCache | None = None) -> None:
        super().__init__(backend, store)
        self.cache = cache
        self.idempotency = Idempotency(store, telemetry=Telemetry(), cache=cache)


class TwoPhase(_ProjectVariant):
    name, label = "two-phase", "This project: two-phase (run)"

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        outcome = self.idempotency.run(key, request_hash(message.body),
                                       lambda: self.effect(message, key.encoded))
        return outcome.status.value


class Atomic(_ProjectVariant):
    name, label = "atomic", "This project: atomic (run_atomic)"

    def _build(self, message: Message) -> Callable[[Transaction], Any]:
        def build(tx: Transaction) -> dict[str, Any]:
            entry_id = f"entry-{uuid.uuid4().hex}"
            tx.create(entry_id, entry_body(message))
            return {"entry": entry_id}
        return build

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        outcome = self.idempotency.run_atomic(key, request_hash(message.body), self._build(message))
        if outcome.effect_applied_now:
            self.effects.add(message.message_id)
        return outcome.status.value


class AtomicOutbox(Atomic):
    """`atomic` with one outgoing message per new message (the outbox: recorded on the marker
    in the commit, dispatched after it, recorded as dispatched); a redelivery reads the marker
    first (`read_first`), as `orders` does. The dispatcher is in memory: store requests only."""

    name, label = "atomic+outbox", "This project: atomic + one outgoing message (outbox)"

    def __init__(self, backend: str, store: IdempotencyStore) -> None:
        super().__init__(backend, store)
        self.idempotency.dispatcher = self.dispatcher = InMemoryDispatcher()

    def _build(self, message: Message) -> Callable[[Transaction], Any]:
        effect = super()._build(message)

        def build(tx: Transaction) -> dict[str, Any]:
            result = effect(tx)
            tx.send("notifications", {"type": "Accepted", "id": message.message_id})
            return result
        return build

    def handle(self, message: Message) -> str:
        key = dedup_key(message)
        outcome = self.idempotency.run_atomic(key, request_hash(message.body), self._build(message),
                                              read_first=message.delivery_count > 1)
        if outcome.effect_applied_now:
            self.effects.add(message.message_id)
        return outcome.status.value


class AtomicCached(Atomic):
    name, label = "atomic+cache", "This project: atomic + local cache"

    def __init__(self, backend: str, store: IdempotencyStore) -> None:
        super().__init__(backend, store,
                         cache=CompletedKeyCache(10_000, max_age=timedelta(minutes=30)))

    def restart(self) -> None:
        assert self.cache is not None
        self.cache.clear()


class AtomicWatermark(Atomic):
    name, label = "atomic+hwm", "This project: atomic + Event Hubs high-water mark"

    def __init__(self, backend: str, store: IdempotencyStore) -> None:
        super().__init__(backend, store)
        self.watermark = PartitionWatermark(store, consumer=CONSUMER, event_hub=EVENT_HUB,
                                            consumer_group=CONSUMER_GROUP)

    def handle_batch(self, batch: list[Message]) -> list[str]:
        partition_id = batch[0].partition_id or "0"
        mark = self.watermark.read(partition_id)  # one point read per batch
        below = mark.sequence_number if mark is not None else -1
        outcomes: list[str] = []
        skipped = 0
        for event in batch:
            if event.sequence_number is not None and event.sequence_number <= below:
                skipped += 1
                outcomes.append("replay_skipped")
            else:
                outcomes.append(self.handle(event))
        self.idempotency.telemetry.replay_skipped(skipped, consumer=CONSUMER,
                                                  partition_id=partition_id)
        if skipped < len(batch):  # every event committed: move the mark (a no-op when it is ahead)
            last = max(e.sequence_number or 0 for e in batch)
            self.watermark.advance(partition_id, last, known=mark)
        return outcomes


VARIANTS: dict[str, type[Variant]] = {
    cls.name: cls for cls in (NoDedup, NaiveCheckThenAct, PowertoolsStyle, TwoPhase, Atomic,
                              AtomicOutbox, AtomicCached, AtomicWatermark)
}
BASELINE = NoDedup.name
DEDUP_VARIANTS = ("powertools", "two-phase", "atomic", "atomic+cache", "atomic+hwm")
