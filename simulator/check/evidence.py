"""The one value every check reads: the workload's items, the stores' rows, and what the
harness saw outside the stores (dead letters, the notification API's log, the host's log).

Each store is read once, on the first check that asks for it (`Evidence.rows`): a
consumer's check names the rows it needs and shares what another check read. Where the
harness cannot see (real brokers), its fields are None and the checks say so.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from shared._core.store import IdempotencyStore
from simulator.check.stores import Row, Stores, scan, store_identity
from simulator.faults import ApiCall
from simulator.workload import Item

CONFLICT = "IdempotencyKeyConflict"
CHANNELS = ("notify", "audit")
OUTCOME_UNKNOWN = "OutcomeUnknown"
# The consumers (function names) that receive each kind of message.
CONSUMERS = {"order": ("orders",), "order_status": ("order_status",), "notification": CHANNELS,
             "payment": ("payments",)}

# Dead-letter / parking reasons that say something went wrong in processing (a failure, a
# timeout, a lost race), not what is wrong with the input: never a rejection of bad input.
OPERATIONAL_REASONS = frozenset({
    "MaxDeliveryCountExceeded", "TTLExpiredException", "StaleInProgress", "ProcessingFailed",
    OUTCOME_UNKNOWN, "Transient", "UnexpectedError", "InProgress", "LeaseLost", "StoreRejected",
    "StoreUnavailable"})
_OPERATIONAL_MARKERS = ("Transient", "Unavailable", "Timeout", "TimedOut", "Throttl", "Unexpected",
                        "Stale", "InProgress", "LockLost", "LeaseLost", "MaxDeliveryCount",
                        "Failed", "Exception", "Error")
# Exceptions that may reach the host: a store or API failure worth retrying (the Event Hubs
# function raises them so the retry policy re-runs the batch).
_TRANSIENT_MARKERS = ("Unavailable", "Timeout", "TimedOut", "Throttl", "Transient", "Retry",
                      "Exhausted", "LeaseLost", "NotSent")


def is_operational(reason: str | None) -> bool:
    """True for a reason that is no rejection of the input (empty, or a processing failure)."""
    return not reason or reason in OPERATIONAL_REASONS or any(
        marker in reason for marker in _OPERATIONAL_MARKERS)


def is_transient_error(name: str) -> bool:
    """True for an exception name that a retry can fix (may reach the host)."""
    return any(marker in name for marker in _TRANSIENT_MARKERS)


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered copy, as the (simulated) broker holds it."""

    consumer: str
    logical: str
    variant: int
    reason: str
    description: str = ""
    delivery_count: int = 0  # the delivery that dead-lettered it (0: not known)
    copy: int | None = None  # which producer copy (simulator only)


@dataclass
class Evidence:
    """What the checks read. The harness fills what it saw outside the stores; `gather`
    adds the workload and the stores, whose rows are read on first use."""

    # -- what the harness saw outside the stores (None where it cannot see: real brokers) --
    dead_letters: list[DeadLetter] | None = None
    api_calls: list[ApiCall] | None = None
    api_honours_key: bool = True
    # Service Bus messages (logical, variant) of which the broker accepted no copy: its
    # duplicate detection dropped them (same MessageId inside the window), so no consumer saw them.
    broker_dropped: set[tuple[str, int]] = field(default_factory=set)
    # The host's view (simulator only; None with real brokers): delivery outcomes by
    # (function, logical, variant), e.g. "deadletter (MalformedJson)", "crash", "raised X";
    # and Event Hubs batches the host retried until it gave up.
    outcomes: dict[tuple[str, str, int], Counter[str]] | None = None
    stalled_batches: int | None = None
    # Service Bus deliveries per (function, logical, variant, copy): (deliveries, deliveries
    # for which the harness drew a fault). All of them faulted = the broker's max delivery
    # count was run out by the fault injector, not by a decision of the app.
    faulted_deliveries: dict[tuple[str, str, int, int], tuple[int, int]] | None = None
    # What the outbox published went through a broker to its consumers (orders: notify and
    # audit, so each committed order's OrderAccepted must show in `api_calls`; payments:
    # balance_projection). False: a test's own dispatcher kept it.
    outbox_delivered: bool = False
    outbox_orders: dict[str, str] = field(default_factory=dict)  # message id -> order id
    # Every message the outbox's dispatcher sent, by id: (destination, body) (None where the
    # harness cannot see: real brokers).
    published: dict[str, tuple[str, bytes]] | None = None
    # -- the run: what was sent, and where its effects are ------------------------------
    items: list[Item] = field(default_factory=list)
    stores: Stores | None = None
    run_id: str = ""
    hub: str = ""
    _scans: dict[tuple[str, str], list[Row]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    # -- reading ----------------------------------------------------------------------------
    @property
    def store(self) -> Stores:
        if self.stores is None:
            raise ValueError("no stores: build the evidence with `gather`")
        return self.stores

    def rows(self, store: IdempotencyStore, *, partition: str | None = None) -> list[Row]:
        """A store's rows whose partition key starts with `partition` (default: this run's
        id; "" for every row), read once however many checks ask."""
        prefix = self.run_id if partition is None else partition
        key = (store_identity(store), prefix)
        if key not in self._scans:
            self._scans[key] = scan(store, prefix or None)
        return self._scans[key]

    def of_kind(self, kind: str) -> dict[str, list[Item]]:
        """The workload's logical messages of a kind: key -> its variants."""
        groups: dict[str, list[Item]] = defaultdict(list)
        for item in self.items:
            if item.kind == kind:
                groups[item.key].append(item)
        return groups

    # -- refusals: dead letters and parked entries ------------------------------------------
    @functools.cached_property
    def _letters(self) -> dict[tuple[str, str, int], list[DeadLetter]]:
        by_copy: dict[tuple[str, str, int], list[DeadLetter]] = defaultdict(list)
        for letter in self.dead_letters or []:
            by_copy[(letter.consumer, letter.logical, letter.variant)].append(letter)
        return by_copy

    @functools.cached_property
    def parked(self) -> list[Row]:
        """This run's parked entries (and the replay tool's journal entries)."""
        return [row for row in self.rows(self.store.parked, partition="")
                if self.run_id in str(row.get("entryId", "")) + str(row.get("payload", ""))]

    @functools.cached_property
    def _parked_by_sha(self) -> dict[str, list[Row]]:
        by_sha: dict[str, list[Row]] = defaultdict(list)
        for row in self.parked:
            by_sha[str(row.get("payloadSha256"))].append(row)
        return by_sha

    @functools.cached_property
    def _parked_by_entry(self) -> dict[tuple[str, str], list[Row]]:
        by_entry: dict[tuple[str, str], list[Row]] = defaultdict(list)
        for row in self.parked:
            by_entry[(str(row.get("consumer")), str(row.get("entryId")))].append(row)
        return by_entry

    def dropped(self, item: Item) -> bool:
        """No copy reached a consumer: the broker's duplicate detection dropped them all."""
        return (item.logical, item.variant) in self.broker_dropped

    def letters(self, consumer: str, item: Item) -> list[DeadLetter]:
        return self._letters.get((consumer, item.logical, item.variant), [])

    def parked_of(self, item: Item) -> list[Row]:
        """Parked entries of a payment event (any copy): matched by the body's hash."""
        return self._parked_by_sha.get(item.body_sha256, [])

    def parked_entry(self, consumer: str, entry_id: str) -> list[Row]:
        """Parked entries of a consumer under an entry id (a notification's key)."""
        return self._parked_by_entry.get((consumer, entry_id), [])

    def journal_of(self, consumer: str, item: Item) -> list[Row]:
        """The replay tool's journal of a dead-lettered copy it completed (replayed or
        discarded): `deadletter/<entity>/<sequence>` entries in the parked table, by body."""
        return [row for row in self._parked_by_sha.get(item.body_sha256, [])
                if str(row.get("entryId", "")).startswith("deadletter/")
                and str(row.get("consumer")) in (consumer, item.entity.split("/")[-1])]

    def handled(self, consumer: str, item: Item, parked: list[Row]) -> str | None:
        """The reason a not-effected message was handled with (dead-letter or parking), or None."""
        for letter in self.letters(consumer, item):
            if letter.reason:
                return f"dead-lettered: {letter.reason}"
        for row in parked:
            if row.get("reason"):
                return f"parked: {row['reason']}"
        for row in self.journal_of(consumer, item):  # dead-lettered, then discarded or replayed
            if row.get("reason"):
                return f"dead-lettered: {row['reason']}"
        return None

    def refusals(self, consumer: str, item: Item, parked: list[Row]) -> list[str]:
        """Every reason a copy of `item` was dead-lettered or parked with at `consumer`."""
        return ([f"dead-lettered: {letter.reason or '(no reason)'}"
                 for letter in self.letters(consumer, item)]
                + [f"parked: {row.get('reason') or '(no reason)'}" for row in parked])

    def allowed_unknown(self, refusal: str) -> bool:
        """An OutcomeUnknown parking, allowed only when the API ignores Idempotency-Key."""
        return refusal.endswith(f": {OUTCOME_UNKNOWN}") and not self.api_honours_key

    def exhausted_by_faults(self, letter: DeadLetter) -> bool:
        """A copy the broker dead-lettered after every delivery of it drew an injected fault."""
        faulted = self.faulted_deliveries
        if faulted is None or letter.copy is None or letter.reason != "MaxDeliveryCountExceeded":
            return False
        deliveries, with_fault = faulted.get((letter.consumer, letter.logical, letter.variant,
                                              letter.copy), (0, 0))
        return deliveries > 0 and with_fault == deliveries


def gather(items: list[Item], stores: Stores, *, run_id: str, hub: str,
           seen: Evidence | None = None) -> Evidence:
    """The evidence of one run: the workload, its stores, and what the harness saw (`seen`)."""
    return dataclasses.replace(seen or Evidence(), items=items, stores=stores, run_id=run_id,
                               hub=hub)
