"""The Functions host's queue listener for one Storage queue trigger, on a real queue service.

What the host does for a queue-triggered function (the Storage Queues extension's
`QueueListener` and `QueueProcessor`), done here with the real `azure-storage-queue`
client against a real queue (Azurite's queue service in the tests and the demo), and
the function invoked through the real Python worker (`WorkerHost.invoke_queue`):

* receive up to `batch_size` messages, each made invisible for `receive_visibility`
  (the host: 10 minutes), renewed at half of it while the function runs;
* a message whose dequeue count is above `max_dequeue_count` goes to `<queue>-poison`
  without running (a message the host crashed on that many times);
* decode the text as host.json `messageEncoding` says (`base64`, the default): a message
  that is not base64 goes to the poison queue at once, without running;
* success: delete it (a pop receipt mismatch or a vanished message is ignored: someone
  else has it);
* failure: on the delivery whose dequeue count reached `max_dequeue_count`, copy the
  original text to `<queue>-poison` and delete it; before that, make it visible again
  after `visibility_timeout` (host.json `visibilityTimeout`, default 0 s).

Nothing here decides what happens to a message but the queue itself: redeliveries are
the queue service's (same id, dequeue count + 1), after its real visibility timeouts.

Harness hooks, to provoke what a real deployment meets: `crash(message)` says the host
dies after the function returned normally (its effect committed) and before the delete
(no delete, no release, no more renewals: the queue redelivers the message when its
visibility runs out), and
`delete_first=True` is a seeded bug (the message deleted on receipt, before the function
commits, as a receive-and-delete consumer would) that the checks must catch.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueMessage

from local_stack.host_data import ReceivedQueueMessage
from local_stack.worker import WorkerHost

logger = logging.getLogger(__name__)

HOST_RECEIVE_VISIBILITY = 600.0  # the host keeps a message it runs invisible for 10 minutes


@dataclass(frozen=True)
class QueueHostOptions:
    """host.json `extensions.queues`, and the host's own receive visibility."""

    max_dequeue_count: int = 5
    visibility_timeout: float = 0.0  # a failed message is visible again after this
    receive_visibility: float = HOST_RECEIVE_VISIBILITY
    batch_size: int = 16
    message_encoding: str = "base64"  # or "none"
    poll_interval: float = 0.1  # between receives that found nothing


@dataclass
class Delivery:
    """One message as one receive handed it out, and what became of it."""

    message_id: str
    dequeue_count: int
    outcome: str = ""  # deleted, released, poisoned-*, crashed-before-delete, worker-lost
    exception: str | None = None
    received_at: float = field(default_factory=time.monotonic)


@dataclass
class QueueHostStats:
    """What the host did, counted as it happened (thread-safe through `count`)."""

    counts: Counter[str] = field(default_factory=Counter)
    deliveries: list[Delivery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def record(self, delivery: Delivery) -> None:
        with self._lock:
            self.deliveries.append(delivery)
            self.counts[f"outcome:{delivery.outcome}"] += 1

    @property
    def received(self) -> int:
        """Deliveries: every message a receive handed out."""
        return self.counts["received"]

    @property
    def redeliveries(self) -> int:
        """Deliveries the queue made again: received with a dequeue count above 1."""
        return self.counts["redelivered"]


class QueueTriggerHost:
    """Receives from `queue` and runs `function` in `worker` for each message, as the host.

        host = QueueTriggerHost(worker, "order_audit", queue=raw_client, poison=raw_poison)
        host.run_until_drained(timeout=60)

    `queue` and `poison` are clients without message encode/decode policies: this host
    decodes (and copies poison messages) as the host does. `instances` competing hosts
    poll the same queue, each running its batch concurrently. `context` (a
    `contextvars.Context`, default: the caller's) is what each invocation runs in, so what
    the caller set for the functions (`use_services`) reaches them through the worker.
    """

    def __init__(self, worker: WorkerHost, function: str, *, queue: QueueClient,
                 poison: QueueClient, options: QueueHostOptions | None = None,
                 instances: int = 1, crash: Callable[[ReceivedQueueMessage], bool] | None = None,
                 delete_first: bool = False, context: contextvars.Context | None = None) -> None:
        self.worker = worker
        self.function = function
        self.queue = queue
        self.poison = poison
        self.options = options or QueueHostOptions()
        self.instances = instances
        self.crash = crash
        self.delete_first = delete_first
        self.context = context or contextvars.copy_context()
        self.stats = QueueHostStats()
        self._busy = 0
        self._busy_lock = threading.Lock()

    # -- the listener ----------------------------------------------------------------------
    def run_until_drained(self, *, timeout: float, settle: float = 0.5) -> QueueHostStats:
        """Poll with `instances` hosts until the queue holds no message (visible or not) and
        nothing is running for `settle` seconds; TimeoutError after `timeout`."""
        stop = threading.Event()
        threads = [threading.Thread(target=self.context.copy().run, args=(self._listen, stop),
                                    name=f"queue-host-{n}", daemon=True)
                   for n in range(self.instances)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.function}: {self.remaining()} message(s) still on "
                                       f"{self.queue.queue_name} after {timeout:.0f} s")
                idle = self.remaining() == 0 and self._idle()
                if idle and quiet_since is None:
                    quiet_since = time.monotonic()
                elif not idle:
                    quiet_since = None
                if quiet_since is not None and time.monotonic() - quiet_since >= settle:
                    return self.stats
                time.sleep(0.2)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)

    def remaining(self) -> int:
        """Messages on the queue, visible or not (the queue service's approximate count)."""
        return int(self.queue.get_queue_properties().approximate_message_count or 0)

    def _idle(self) -> bool:
        with self._busy_lock:
            return self._busy == 0

    def _listen(self, stop: threading.Event) -> None:
        with ThreadPoolExecutor(max_workers=self.options.batch_size,
                                thread_name_prefix=f"{self.function}-invocation") as pool:
            while not stop.is_set():
                try:
                    batch = list(self.queue.receive_messages(
                        messages_per_page=self.options.batch_size,
                        visibility_timeout=_seconds(self.options.receive_visibility),
                        max_messages=self.options.batch_size))
                except HttpResponseError as error:
                    logger.warning("receive failed: %s", error)
                    batch = []
                if not batch:
                    stop.wait(self.options.poll_interval)
                    continue
                with self._busy_lock:
                    self._busy += len(batch)
                futures = [pool.submit(contextvars.copy_context().run, self._process, message)
                           for message in batch]
                for future in futures:
                    future.result()

    # -- one message -----------------------------------------------------------------------
    def _process(self, message: QueueMessage) -> None:
        try:
            self._handle(message)
        except Exception:  # the host logs and goes on; the queue redelivers what it kept
            logger.exception("queue host: %s failed", message.id)
        finally:
            with self._busy_lock:
                self._busy -= 1

    def _handle(self, message: QueueMessage) -> None:
        stats, options = self.stats, self.options
        stats.count("received")
        if message.dequeue_count and message.dequeue_count > 1:
            stats.count("redelivered")
        delivery = Delivery(message.id, int(message.dequeue_count or 1))
        if delivery.dequeue_count > options.max_dequeue_count:
            delivery.outcome = "poisoned-unrun"  # the host crashed on it that many times
            self._move_to_poison(message, message.pop_receipt)
            return stats.record(delivery)
        body = self._decode(str(message.content or ""))
        if body is None:
            delivery.outcome = "poisoned-undecodable"
            self._move_to_poison(message, message.pop_receipt)
            return stats.record(delivery)
        received = ReceivedQueueMessage(
            message_id=message.id, body=body, dequeue_count=delivery.dequeue_count,
            pop_receipt=str(message.pop_receipt), insertion_time=message.inserted_on,
            expiration_time=message.expires_on, next_visible_time=message.next_visible_on)
        if self.delete_first:  # the seeded bug: acknowledged before the function committed
            self._delete(message.id, message.pop_receipt)
        renewal = _Renewal(self.queue, message, options.receive_visibility)
        try:
            result = self.worker.invoke_queue(self.function, received)
        except Exception as error:  # no answer: the worker died; the host releases nothing
            renewal.stop()
            delivery.outcome, delivery.exception = "worker-lost", str(error)
            return stats.record(delivery)
        pop_receipt = renewal.stop()
        stats.count("invocations")
        if result.ok and self.crash is not None and self.crash(received):
            stats.count("crashed")
            delivery.outcome = "crashed-before-delete"  # the queue brings it back later
            return stats.record(delivery)
        if result.ok:
            delivery.outcome = "deleted"
            self._delete(message.id, pop_receipt)
        elif delivery.dequeue_count >= options.max_dequeue_count:
            delivery.outcome, delivery.exception = "poisoned-by-host", result.exception
            self._move_to_poison(message, pop_receipt)
        else:
            delivery.outcome, delivery.exception = "released", result.exception
            self._release(message.id, pop_receipt)
        stats.record(delivery)
        return None

    def _decode(self, text: str) -> bytes | None:
        if self.options.message_encoding == "none":
            return text.encode("utf-8")
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            return None

    def _delete(self, message_id: str, pop_receipt: str | None) -> None:
        try:
            self.queue.delete_message(message_id, pop_receipt)
            self.stats.count("deleted")
        except ResourceNotFoundError:
            self.stats.count("delete-not-found")
        except HttpResponseError as error:
            if error.status_code != 400:  # 400 PopReceiptMismatch: someone else has it now
                raise
            self.stats.count("delete-pop-receipt-mismatch")

    def _release(self, message_id: str, pop_receipt: str | None) -> None:
        try:
            self.queue.update_message(message_id, pop_receipt,
                                      visibility_timeout=_seconds(self.options.visibility_timeout))
            self.stats.count("released")
        except ResourceNotFoundError:
            self.stats.count("release-not-found")
        except HttpResponseError as error:
            if error.status_code != 400:
                raise
            self.stats.count("release-pop-receipt-mismatch")

    def _move_to_poison(self, message: QueueMessage, pop_receipt: str | None) -> None:
        """The original text to `<queue>-poison` (a new message), then the original deleted."""
        self.poison.send_message(message.content)
        self.stats.count("poisoned-by-host")
        self._delete(message.id, pop_receipt)


class _Renewal:
    """Keeps a running message invisible, as the host does: an update at half the receive
    visibility, each giving a new pop receipt (the one the delete then needs)."""

    def __init__(self, queue: QueueClient, message: QueueMessage, visibility: float) -> None:
        self._queue = queue
        self._id = message.id
        self._pop_receipt: str | None = message.pop_receipt
        self._visibility = visibility
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"renew-{message.id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._visibility / 2):
            try:
                updated: Any = self._queue.update_message(
                    self._id, self._pop_receipt, visibility_timeout=_seconds(self._visibility))
                self._pop_receipt = updated.pop_receipt
            except HttpResponseError as error:  # lost it (deleted, or someone else has it)
                logger.info("renewal of %s stopped: %s", self._id, error)
                return

    def stop(self) -> str | None:
        self._done.set()
        self._thread.join()
        return self._pop_receipt


def _seconds(value: float) -> int:
    return max(0, round(value))


def drain_poison(poison: QueueClient, *, max_messages: int = 10_000) -> list[str]:
    """Every message on a poison queue, read and deleted (their texts, as stored)."""
    texts: list[str] = []
    while len(texts) < max_messages:
        batch = list(poison.receive_messages(messages_per_page=32, max_messages=32,
                                             visibility_timeout=30))
        if not batch:
            return texts
        for message in batch:
            texts.append(str(message.content))
            poison.delete_message(message.id, message.pop_receipt)
    return texts
