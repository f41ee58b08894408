"""Storage Queue poison queues: read the envelopes, resubmit the originals, delete after.

A queue consumer (`shared._triggers.queues.StorageQueueConsumer`) writes what it refuses to
`<queue>-poison` as a JSON envelope (reason, detail, the original id and body); the host
copies a message it could not hand to the function there as it was (no reason, no id).
This module reads both, holding what it read invisible while the tool acts on it (a
queue has no lock of its own: the visibility timeout is one), and brings one back:

1. the resubmission (`shared._triggers.queue_messages.resubmission`: the original id and body) is sent
   to the consumer's queue, base64-encoded as the trigger reads it;
2. only then is the envelope deleted from the poison queue, with the pop receipt of
   the read that holds it.

A failure at 1 leaves the envelope where it was; a failure at 2 leaves a resubmitted
message and its envelope, and a second replay of that envelope is absorbed by the
consumer's dedup (the same original id and body).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from shared._triggers.queue_messages import read_envelope

#: How long a read for `list` or `show` hides the envelopes it read (then they are released).
LIST_HOLD_SECONDS = 30
#: How long a replay holds what it read: longer than one item's resubmission takes.
REPLAY_HOLD_SECONDS = 300


class PoisonQueueError(RuntimeError):
    """A poison or main queue could not be read or written; the message names which and why.
    Nothing was deleted."""


class NotInPoisonQueueError(LookupError):
    """The envelope is no longer in the poison queue (replayed, discarded, or held by another
    run); nothing was sent."""


class EnvelopeLeftError(RuntimeError):
    """The resubmission is on the main queue but the envelope could not be deleted: a second
    replay of it is absorbed by the consumer's dedup; discard it with a note."""

    def __init__(self, message_id: str, cause: Exception) -> None:
        super().__init__(f"resubmitted as message {message_id}, but the envelope could not be "
                         f"deleted ({cause})")
        self.message_id = message_id


@dataclass(frozen=True)
class QueueRef:
    """A queue consumer and the Storage queue its trigger reads."""

    consumer: str
    queue: str

    @property
    def poison(self) -> str:
        return f"{self.queue}-poison"


@dataclass(frozen=True)
class PoisonedMessage:
    """One message in a poison queue: an envelope the consumer wrote, or the host's copy."""

    queue: QueueRef
    id: str  # the poison queue's own message id
    content: str  # as stored
    inserted_at: float | None  # epoch seconds
    envelope: Mapping[str, Any] | None  # None: not an envelope (`problem` says why)
    problem: str | None = None

    @property
    def text(self) -> str | None:
        """The message's text, base64-decoded (the trigger's encoding); None when it is not
        base64 text (the trigger could not read it either)."""
        return _decoded(self.content)

    @property
    def reason(self) -> str:
        return str(self.envelope["reason"]) if self.envelope is not None else "NotAnEnvelope"

    @property
    def detail(self) -> str:
        if self.envelope is None:
            return str(self.problem)
        return str(self.envelope.get("detail") or "")

    @property
    def message_id(self) -> str | None:
        """The original message's id (the envelope's `messageId`)."""
        value = self.envelope.get("messageId") if self.envelope is not None else None
        return str(value) if value else None

    @property
    def poisoned_at(self) -> float | None:
        value = self.envelope.get("poisonedAt") if self.envelope is not None else None
        with contextlib.suppress(TypeError, ValueError):
            return datetime.fromisoformat(str(value)).timestamp()
        return self.inserted_at


def _decoded(content: str) -> str | None:
    try:
        return base64.b64decode(content, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def poisoned(queue: QueueRef, message_id: str, content: str,
             inserted_at: float | None) -> PoisonedMessage:
    """One stored message, read: its envelope, or why it is not one."""
    text = _decoded(content)
    if text is None:
        return PoisonedMessage(queue, message_id, content, inserted_at, None,
                               "not base64 text: the host's copy of a message the trigger "
                               "could not decode (never run)")
    try:
        envelope = read_envelope(text)
    except ValueError as error:
        return PoisonedMessage(queue, message_id, content, inserted_at, None,
                               f"not an envelope the consumer wrote ({error}): the host's copy "
                               "of a message, without its id or a reason")
    return PoisonedMessage(queue, message_id, content, inserted_at, envelope)


class PoisonSource(Protocol):
    """What the replay tool needs of the poison queues (tests pass an in-memory one)."""

    queues: Sequence[QueueRef]

    def read(self, queue: QueueRef, *, hold: int) -> list[PoisonedMessage]: ...

    def resubmit(self, message: PoisonedMessage, text: str) -> str: ...

    def delete(self, message: PoisonedMessage) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class StoragePoisonQueues:
    """The poison queues on Azure Storage or Azurite (`azure.storage.queue`).

    `client(name)` gives a `QueueClient` for a queue of the account, without an encode
    policy: the tool encodes and decodes itself, so the host's copies are read and resent
    byte for byte.
    """

    def __init__(self, queues: Sequence[QueueRef], client: Callable[[str], Any]) -> None:
        self.queues: Sequence[QueueRef] = list(queues)
        self._client = client
        self._clients: dict[str, Any] = {}
        self._held: dict[tuple[str, str], Any] = {}  # (poison queue, id) -> the read message

    @classmethod
    def connect(cls, queues: Sequence[QueueRef], *, connection_string: str | None = None,
                account_url: str | None = None, credential: Any = None) -> StoragePoisonQueues:
        """On a connection string (Azurite) or the account's queue endpoint with a credential
        (Azure: Storage Queue Data Contributor on the queues)."""
        from azure.storage.queue import QueueClient

        if connection_string:
            return cls(queues, lambda name: QueueClient.from_connection_string(
                connection_string, name))
        if not account_url:
            raise ValueError("give a connection string or the account's queue endpoint")
        return cls(queues, lambda name: QueueClient(account_url, name, credential=credential))

    def _queue(self, name: str) -> Any:
        if name not in self._clients:
            self._clients[name] = self._client(name)
        return self._clients[name]

    def read(self, queue: QueueRef, *, hold: int = LIST_HOLD_SECONDS) -> list[PoisonedMessage]:
        """Every envelope in the queue's poison queue, each held invisible for `hold`
        seconds (or until `release`): a queue can only be read whole by receiving."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        client = self._queue(queue.poison)
        try:
            for message in client.receive_messages(messages_per_page=32, visibility_timeout=hold):
                self._held[(queue.poison, str(message.id))] = message
        except ResourceNotFoundError as error:
            raise PoisonQueueError(f"queue {queue.poison!r} does not exist in this account: "
                                   f"check the {queue.consumer} trigger's queue name and the "
                                   "account (nothing read, nothing deleted)") from error
        except AzureError as error:
            raise PoisonQueueError(f"cannot read {queue.poison!r}: {error}") from error
        return sorted((poisoned(queue, str(m.id), str(m.content or ""),
                                m.inserted_on.timestamp() if m.inserted_on else None)
                       for (name, _), m in self._held.items() if name == queue.poison),
                      key=lambda p: (p.inserted_at or 0.0, p.id))

    def _holding(self, message: PoisonedMessage) -> Any:
        held = self._held.get((message.queue.poison, message.id))
        if held is None:
            self.read(message.queue, hold=REPLAY_HOLD_SECONDS)
            held = self._held.get((message.queue.poison, message.id))
        if held is None:
            raise NotInPoisonQueueError(f"message {message.id} is no longer in "
                                        f"{message.queue.poison} (replayed or discarded by "
                                        "someone else, or held by another run)")
        return held

    def resubmit(self, message: PoisonedMessage, text: str) -> str:
        """Send `text` to the consumer's queue (base64, as the trigger reads it), then delete
        the envelope; the new message's id. Deleted only once the send succeeded."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        held = self._holding(message)
        content = base64.b64encode(text.encode("utf-8")).decode("ascii")
        try:
            sent = self._queue(message.queue.queue).send_message(content)
        except ResourceNotFoundError as error:
            raise PoisonQueueError(f"queue {message.queue.queue!r} does not exist: nothing sent, "
                                   "the envelope stays") from error
        except AzureError as error:
            raise PoisonQueueError(f"cannot send to {message.queue.queue!r}: {error}; the "
                                   "envelope stays") from error
        try:
            self._delete(message, held)
        except (AzureError, NotInPoisonQueueError) as error:
            raise EnvelopeLeftError(str(sent.id), error) from error
        return str(sent.id)

    def delete(self, message: PoisonedMessage) -> None:
        """Remove an envelope (a discard, or one already resubmitted)."""
        from azure.core.exceptions import AzureError

        try:
            self._delete(message, self._holding(message))
        except AzureError as error:
            raise PoisonQueueError(f"cannot delete {message.id} from {message.queue.poison}: "
                                   f"{error}") from error

    def _delete(self, message: PoisonedMessage, held: Any) -> None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            self._queue(message.queue.poison).delete_message(held.id, held.pop_receipt)
        except ResourceNotFoundError as error:
            raise NotInPoisonQueueError(f"message {message.id} left {message.queue.poison} "
                                        "meanwhile") from error
        finally:
            self._held.pop((message.queue.poison, message.id), None)

    def release(self) -> None:
        """Make every envelope still held visible again (a failed update leaves it to its
        hold running out)."""
        from azure.core.exceptions import AzureError

        held, self._held = self._held, {}
        for (name, _), message in held.items():
            with contextlib.suppress(AzureError):
                self._queue(name).update_message(message.id, message.pop_receipt,
                                                 visibility_timeout=0)

    def close(self) -> None:
        self.release()
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                client.close()
