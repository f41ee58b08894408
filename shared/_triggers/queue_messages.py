"""What a Storage Queue delivers and what its poison queue holds: the message as the consumer
reads it (`QueueMessageView`), the poison envelope the consumer writes (`poison_envelope`), and
the resubmission that brings an envelope back as the original (`resubmission`). One home for the
format `shared._triggers.queues` writes and `python -m replay` reads.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from shared._core.exceptions import PoisonMessageError
from shared._core.keys import DedupKey
from shared._core.payload import parse_json_object
from shared._core.settlement import MAX_DESCRIPTION_CHARS

#: A queue message holds at most 64 KiB; with the trigger's base64 encoding that is 48 KiB of
#: text. The envelope stays within it whichever encoding the poison client uses.
MAX_POISON_TEXT_BYTES = 48 * 1024
#: Poison envelopes never expire (`time_to_live=-1`): a person decides what becomes of them.
NEVER_EXPIRES = -1
REASON_LAST_DELIVERY = "MaxDequeueCountReached"
REASON_POISON_UNAVAILABLE = "PoisonQueueUnavailable"


class PoisonQueue(Protocol):
    """`azure.storage.queue.QueueClient` (or its `aio` twin, for the async consumer). Build it
    with the trigger's message encoding (the default `base64`:
    `message_encode_policy=TextBase64EncodePolicy()`), so envelopes read like the host's own."""

    def send_message(self, content: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class QueueMessageView:
    """A Storage Queue message as the consumer sees it. The id is the same on every
    redelivery, `dequeue_count` rises by one with each, `pop_receipt` changes with each."""

    message_id: str | None
    body: bytes
    dequeue_count: int = 1
    insertion_time: datetime.datetime | None = None
    expiration_time: datetime.datetime | None = None
    next_visible_time: datetime.datetime | None = None
    pop_receipt: str | None = None
    replayed: bool = False  # a resubmission from the poison queue, as the original

    @classmethod
    def of(cls, message: Any) -> QueueMessageView:
        """From `azure.functions.QueueMessage`, `azure.storage.queue.QueueMessage` or a view; a
        resubmission from the poison queue reads as the original (its id and body)."""
        if isinstance(message, QueueMessageView):
            return message
        return _unwrapped(cls._read(message))

    @classmethod
    def _read(cls, message: Any) -> QueueMessageView:
        if hasattr(message, "get_body"):  # azure.functions.QueueMessage
            body, inserted, expires, visible = (message.get_body(), message.insertion_time,
                                                message.expiration_time, message.time_next_visible)
        elif hasattr(message, "content"):  # azure.storage.queue.QueueMessage
            body, inserted, expires, visible = (message.content, message.inserted_on,
                                                message.expires_on, message.next_visible_on)
        else:
            raise TypeError(f"not a queue message: {type(message).__name__}")
        return cls(message_id=_text_or_none(message.id), body=_bytes(body),
                   dequeue_count=_count(message.dequeue_count), insertion_time=inserted,
                   expiration_time=expires, next_visible_time=visible,
                   pop_receipt=_text_or_none(message.pop_receipt))

    def context(self, key: DedupKey | None = None) -> dict[str, Any]:
        """What the logs and metrics say about this delivery (`delivery_count` tells a
        redelivery from a producer's retry in the duplicate metric)."""
        return {"message_id": self.message_id, "delivery_count": self.dequeue_count,
                **({"dedup_key": key.key} if key is not None else {}),
                **({"replayed": True} if self.replayed else {})}


#: The first member of a message that brings a poison envelope back to its queue.
REPLAY_FIELD = "replayOf"
_REPLAY_PREFIX = b'{"' + REPLAY_FIELD.encode() + b'":'
MAX_RESUBMISSION_BYTES = 2 * MAX_POISON_TEXT_BYTES  # bounds the decoder reading one


def resubmission(envelope: Mapping[str, Any], *, by: str,
                 now: datetime.datetime | None = None) -> str:
    """The message that brings a poison envelope back to the consumer's queue: the original
    id and body under `replayOf`, read as the original, so its dedup absorbs it if the original
    had committed. ValueError, naming what is missing, when the envelope cannot bring the
    original back (a body cut to fit, no id)."""
    if envelope.get("bodyTruncated"):
        raise ValueError(f"the body was cut to fit the poison queue ({envelope.get('bodyBytes')} "
                         f"bytes, sha256 {envelope.get('bodySha256')}): re-send the original "
                         "from its source")
    message_id = envelope.get("messageId")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("the envelope has no messageId: the original cannot be recognised")
    body = envelope.get("body")
    field = "body"
    if not isinstance(body, str):
        body, field = envelope.get("bodyBase64"), "bodyBase64"
        try:
            base64.b64decode(str(body), validate=True)
        except ValueError as error:
            raise ValueError("the envelope holds no body (body or bodyBase64)") from error
    return _json({REPLAY_FIELD: {
        "messageId": message_id, "dedupKey": envelope.get("dedupKey"),
        "reason": envelope.get("reason"), "poisonedAt": envelope.get("poisonedAt"),
        "replayedBy": by,
        "replayedAt": (now or datetime.datetime.now(datetime.UTC)).isoformat()}, field: body})


def _unwrapped(view: QueueMessageView) -> QueueMessageView:
    """The original message a resubmission carries, or `view` when it is not one (a body
    that only looks like one is left to the parse, which refuses it with its reason)."""
    if not view.body.startswith(_REPLAY_PREFIX):
        return view
    try:
        data = parse_json_object(view.body, max_bytes=MAX_RESUBMISSION_BYTES)
        original = data[REPLAY_FIELD]
        message_id = original["messageId"]
        if not isinstance(message_id, str) or not message_id:
            return view
        text = data.get("body")
        body = (text.encode("utf-8") if isinstance(text, str)
                else base64.b64decode(str(data["bodyBase64"]), validate=True))
    except (PoisonMessageError, KeyError, TypeError, ValueError, UnicodeEncodeError):
        return view
    return dataclasses.replace(view, message_id=message_id, body=body, replayed=True)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _count(value: Any) -> int:
    return int(value) if value else 1


def _bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray)):
        return bytes(cast(bytes, body))
    return str(body).encode("utf-8")


def poison_envelope(view: QueueMessageView, *, consumer: str, reason: str, detail: str,
                    key: DedupKey | None = None, now: datetime.datetime | None = None) -> str:
    """The poison queue message for `view`: JSON with the reason, the detail, the original
    id, dequeue count, insertion time, dedup key and body (text when it is UTF-8, else base64).
    A body too large for one queue message is cut, and the envelope says so (`bodyTruncated`,
    `bodyBytes`, `bodySha256`)."""
    envelope: dict[str, Any] = {
        "reason": reason,
        "detail": detail[:MAX_DESCRIPTION_CHARS],
        "consumer": consumer,
        "messageId": view.message_id,
        "dequeueCount": view.dequeue_count,
        "insertionTime": view.insertion_time.isoformat() if view.insertion_time else None,
        "dedupKey": key.key if key is not None else None,
        "poisonedAt": (now or datetime.datetime.now(datetime.UTC)).isoformat(),
    }
    try:
        envelope["body"] = view.body.decode("utf-8")
    except UnicodeDecodeError:
        envelope["bodyBase64"] = base64.b64encode(view.body).decode("ascii")
    text = _json(envelope)
    if len(text.encode("utf-8")) <= MAX_POISON_TEXT_BYTES:
        return text
    field = "body" if "body" in envelope else "bodyBase64"
    whole = str(envelope.pop(field))
    envelope.update(bodyTruncated=True, bodyBytes=len(view.body),
                    bodySha256=hashlib.sha256(view.body).hexdigest())
    low, high = 0, len(whole)  # the longest prefix that fits, escaping included
    while low < high:
        middle = (low + high + 1) // 2
        if len(_json({**envelope, field: whole[:middle]}).encode("utf-8")) <= MAX_POISON_TEXT_BYTES:
            low = middle
        else:
            high = middle - 1
    envelope[field] = whole[:low]
    return _json(envelope)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def read_envelope(text: str | bytes) -> Mapping[str, Any]:
    """A poison envelope as the consumer wrote it; ValueError when it is not one."""
    data = parse_json_object(text, max_bytes=MAX_RESUBMISSION_BYTES)  # InvalidPayloadError: a ValueError
    if not isinstance(data.get("reason"), str) or "messageId" not in data:
        raise ValueError("not a poison envelope (no reason or messageId)")
    return data


__all__ = ["MAX_POISON_TEXT_BYTES", "NEVER_EXPIRES", "REASON_LAST_DELIVERY",
           "REASON_POISON_UNAVAILABLE", "REPLAY_FIELD", "PoisonQueue", "QueueMessageView",
           "poison_envelope", "read_envelope", "resubmission"]
