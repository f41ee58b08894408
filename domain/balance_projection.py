"""`BalanceChanged` from the balance-changes queue: a per-account view, the second hop.

`payments` sends one `BalanceChanged` per account per transaction through its
outbox (the account's full resulting state and a version that only grows).
This consumer keeps a view of each account, `{accountId, balanceCents,
version}`, with the library's atomic path: the message's marker (keyed by its
MessageId, which the outbox derives deterministically) and the view write
commit in one transaction, so each message's effect counts exactly once and a
re-sent copy is a duplicate.

The view is guarded by the version: messages of one account can arrive out of
order (competing consumers on one queue, a batch retried while a later one
went through), so a version older than the view's is recorded on its marker
as `stale` and does not overwrite; the same version again is `unchanged`.
A message that cannot be read is dead-lettered with its reason on its first
delivery.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from shared import (
    MAX_SAFE_INTEGER,
    Decision,
    InvalidPayloadError,
    MessageView,
    aio,
    exact_integer,
    parse_json_object,
    store_safe_id,
)

CONSUMER = "balance_projection"
BALANCE_CHANGED = "BalanceChanged"
VIEW_DOCUMENT = "view"
MAX_MESSAGE_BYTES = 256 * 1024  # a Standard-tier Service Bus message
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BalanceChanged:
    account_id: str
    balance_cents: int
    version: int
    event_ids: tuple[str, ...]

    def content(self) -> dict[str, Any]:
        """What identifies the message's content; hashed to detect a reused MessageId."""
        return {"accountId": self.account_id, "balanceCents": self.balance_cents,
                "version": self.version, "eventIds": list(self.event_ids)}

    @property
    def partition(self) -> str:
        """The view's partition (as text; stored escaped): one per account, its markers there."""
        return f"balance-view|{self.account_id}"


def parse_balance_changed(message: MessageView) -> BalanceChanged:
    """The message's state change; InvalidPayloadError says what is wrong with it."""
    data = parse_json_object(message.body, max_bytes=MAX_MESSAGE_BYTES)
    reason = "InvalidBalanceChanged"
    if data.get("type", BALANCE_CHANGED) != BALANCE_CHANGED:
        raise InvalidPayloadError(reason, f"type must be {BALANCE_CHANGED!r}")
    account = data.get("accountId")
    if not isinstance(account, str) or not account:
        raise InvalidPayloadError(reason, "accountId must be a non-empty string")
    balance = data.get("balanceCents")
    if not isinstance(balance, int) or isinstance(balance, bool) or abs(balance) > MAX_SAFE_INTEGER:
        raise InvalidPayloadError(reason, f"balanceCents must be an integer within +-{MAX_SAFE_INTEGER}")
    version = exact_integer(data.get("version"), "version", reason=reason)
    event_ids = data.get("eventIds", [])
    if not isinstance(event_ids, list) or not all(isinstance(e, str) for e in event_ids):
        raise InvalidPayloadError(reason, "eventIds must be a list of strings")
    return BalanceChanged(account, balance, version, tuple(event_ids))


def view_partition(account_id: str) -> str:
    """The view's partition as stored: one per account (its markers live there too)."""
    return store_safe_id(f"balance-view|{account_id}")


class BalanceProjection:
    """Applies each BalanceChanged once to its account's view, newer versions only."""

    def __init__(self, consumer: aio.ServiceBusConsumer) -> None:
        self.consumer = consumer

    async def handle(self, message: Any, actions: Any = None) -> Decision:
        return await self.consumer.run_atomic(
            message, actions, apply_change, parse=parse_balance_changed,
            content=BalanceChanged.content, partition=lambda change: change.partition)


async def apply_change(tx: aio.Transaction, change: BalanceChanged) -> dict[str, Any]:
    """Write the view when the change is newer than it; say what happened (the marker's result)."""
    current = await tx.read(VIEW_DOCUMENT)
    stored = int(current.body.get("version", 0)) if current is not None else 0
    body = {"accountId": change.account_id, "balanceCents": change.balance_cents,
            "version": change.version, "kind": "balance-view"}
    if current is None:
        tx.create(VIEW_DOCUMENT, body)
        verdict = "applied"
    elif change.version > stored:
        tx.replace(VIEW_DOCUMENT, body, etag=current.etag)
        verdict = "applied"
    elif change.version == stored:
        verdict = "unchanged"
    else:  # arrived after a newer one: recorded, never written over the newer state
        verdict = "stale"
        logger.info("%s: version %d of %s is older than the view's %d", CONSUMER, change.version,
                    change.account_id, stored)
    return {"verdict": verdict, "version": change.version, "viewVersion": max(stored, change.version)}


def read_view(store: Any, account_id: str) -> dict[str, Any] | None:
    """The account's view as a (sync) document store holds it (None: no message applied yet)."""
    document = store.read_document(view_partition(account_id), VIEW_DOCUMENT)
    return None if document is None else dict(document.body)
