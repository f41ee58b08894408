"""The workload every variant runs: the same messages, in the same order, from one seed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Message:
    """One delivery: a Service Bus message or an Event Hubs event."""

    message_id: str
    body: dict[str, Any]
    delivery_count: int = 1
    sequence_number: int | None = None  # Event Hubs only
    partition_id: str | None = None


@dataclass(frozen=True)
class Sizes:
    messages: int = 200  # new messages (throughput and latency are measured on these)
    duplicates: int = 200  # redeliveries of already processed messages
    batch_size: int = 50  # events per Event Hubs batch
    batches: int = 4  # batches processed, then replayed
    concurrent: int = 30  # messages delivered as `copies` simultaneous copies
    copies: int = 2
    rounds: int = 20  # the new-message phase is interleaved across variants in this many rounds
    warmup: int = 10


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
