"""The workloads every variant runs: the same deliveries, in the same order, from one seed.

Loopback mode: orders-like Service Bus messages (new, redelivered, raced) and
Event Hubs batches of a ledger entry per event. Latency mode: payment
CloudEvents on one Event Hubs partition over a number of accounts, with the
balances they must produce.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from shared._triggers.eventhubs import EventView

CLOUDEVENTS_JSON = "application/cloudevents+json; charset=utf-8"
SIGNS = {"payment.credit": 1, "payment.debit": -1}


@dataclass(frozen=True)
class Sizes:
    """Loopback mode."""

    messages: int = 200  # new messages (throughput and latency are measured on these)
    duplicates: int = 200  # redeliveries of already processed messages
    batch_size: int = 50  # events per Event Hubs batch
    batches: int = 4  # batches processed, then replayed
    concurrent: int = 30  # messages delivered as `copies` simultaneous copies
    copies: int = 2
    rounds: int = 20  # the new-message phase is interleaved across variants in this many rounds
    warmup: int = 10


@dataclass(frozen=True)
class LatencySizes:
    """Latency mode: one scenario per (RTT, account count)."""

    events: int = 2000
    batch_size: int = 100
    accounts: tuple[int, ...] = (20, 200)
    warmup_events: int = 100
    # Concurrent account groups of the no-dedup limits; None: the app's own bound
    # (PartitionBatchProcessor.max_concurrency)
    concurrency: int | None = None
    probe_reads: int = 30  # point reads per path (direct, relayed) when checking the RTT


# -- loopback ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    """One delivery: a Service Bus message or an Event Hubs event."""

    message_id: str
    body: dict[str, Any]
    delivery_count: int = 1
    sequence_number: int | None = None  # Event Hubs only
    partition_id: str | None = None


@dataclass
class Workload:
    new: list[Message]
    duplicates: list[Message]
    batches: list[list[Message]]
    concurrent: list[Message]
    warmup: list[Message] = field(default_factory=list)


def _order(rng: random.Random, order_id: str) -> dict[str, Any]:
    return {"orderId": order_id, "customer": f"c{rng.randrange(10_000):04d}",
            "amount": rng.randrange(100, 100_000) / 100, "currency": "EUR"}


def build_workload(sizes: Sizes, seed: int) -> Workload:
    rng = random.Random(seed)
    new = [Message(f"order-{seed}-{i:05d}", _order(rng, f"order-{seed}-{i:05d}"))
           for i in range(sizes.messages)]
    picks = [rng.randrange(len(new)) for _ in range(sizes.duplicates)] if new else []
    duplicates = [Message(new[i].message_id, new[i].body, delivery_count=2 + rng.randrange(3))
                  for i in picks]
    batches: list[list[Message]] = []
    sequence = 0
    for b in range(sizes.batches):
        batch = []
        for _ in range(sizes.batch_size):
            sequence += 1
            event_id = f"payment-{seed}-{sequence:06d}"
            batch.append(Message(event_id, {"paymentId": event_id, "batch": b,
                                            "amount": rng.randrange(100, 10_000) / 100},
                                 sequence_number=sequence, partition_id="0"))
        batches.append(batch)
    concurrent = [Message(f"race-{seed}-{i:05d}", _order(rng, f"race-{seed}-{i:05d}"))
                  for i in range(sizes.concurrent)]
    warmup = [Message(f"warm-{seed}-{i:05d}", _order(rng, f"warm-{seed}-{i:05d}"))
              for i in range(sizes.warmup)]
    return Workload(new, duplicates, batches, concurrent, warmup)


# -- latency: payment batches --------------------------------------------------------------------
@dataclass
class PaymentWorkload:
    """Batches of payment events on one partition, and the balances they must produce."""

    accounts: list[str]
    batches: list[list[EventView]]
    warmup: list[EventView]
    expected: dict[str, int]  # account -> balance after every batch once
    amounts: dict[int, tuple[str, int]] = field(default_factory=dict)  # sequence -> (account, cents)

    @property
    def events(self) -> int:
        return sum(len(b) for b in self.batches)

    def accounts_in(self, batch: list[EventView]) -> set[str]:
        return {self.amounts[e.sequence_number][0] for e in batch}

    def batch_delta(self, batch: list[EventView]) -> dict[str, int]:
        delta: dict[str, int] = defaultdict(int)
        for event in batch:
            account, cents = self.amounts[event.sequence_number]
            delta[account] += cents
        return delta


def _event(source: str, sequence: int, event_id: str, account: str, cents: int,
           rng: random.Random) -> EventView:
    kind = "payment.credit" if rng.random() < 0.7 else "payment.debit"
    envelope = {"specversion": "1.0", "id": event_id, "source": source, "type": kind,
                "datacontenttype": "application/json",
                "data": {"accountId": account, "amountCents": cents}}
    return EventView(sequence_number=sequence, body=json.dumps(envelope).encode(),
                        content_type=CLOUDEVENTS_JSON, offset=str(sequence * 512),
                        partition_key=account)


def build_payment_workload(*, events: int, accounts: int, batch_size: int, seed: int,
                           warmup_events: int) -> PaymentWorkload:
    """Seeded: the same events, accounts and amounts for every variant (70% credits)."""
    rng = random.Random(f"latency-{seed}-{accounts}")
    names = [f"acct-{seed}-{n:04d}" for n in range(accounts)]
    source = f"/bench/{seed}/payments"
    workload = PaymentWorkload(names, [], [], dict.fromkeys(names, 0))
    flat: list[EventView] = []
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
