"""Azurite's queue service, the real worker, and the order_audit app on one backend's store."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.storage.queue import QueueClient, TextBase64EncodePolicy

from demo.queue_run import QueueEndpoints, QueueScenarioConfig, app_settings, outage_store
from functions.services import build_services, real_stores, use_services
from local_stack.queue_host import QueueHostOptions, QueueTriggerHost
from local_stack.worker import WorkerHost, sample_settings
from tests.support.worker_probe import ROOT


@pytest.fixture(scope="session")
def worker() -> WorkerHost:
    return WorkerHost.start(ROOT, sample_settings(ROOT))


@pytest.fixture(scope="session")
def endpoints(stack, queue_service) -> QueueEndpoints:
    return QueueEndpoints(queue_connection_string=queue_service,
                          table_connection_string=stack.table_connection_string,
                          cosmos_endpoint=stack.cosmos_endpoint, cosmos_key=stack.cosmos_key,
                          cosmos_verify=stack.cosmos_verify)


@dataclass
class QueueRig:
    """A fresh queue and its poison queue, the app's services on them, the host to drive them."""

    worker: WorkerHost
    services: Any
    queue: QueueClient  # raw: what the host receives
    poison: QueueClient  # raw
    producer: QueueClient  # base64, as a Functions producer sends
    outage: Any

    @property
    def trail(self):
        return self.services.order_audit

    def send(self, body: dict[str, Any] | str, *, encoded: bool = True) -> str:
        text = body if isinstance(body, str) else json.dumps(body)
        client = self.producer if encoded else self.queue
        return client.send_message(text).id

    def host(self, **options: Any) -> QueueTriggerHost:
        crash = options.pop("crash", None)
        with use_services(self.services):  # the host's invocations run on these services
            return QueueTriggerHost(self.worker, "order_audit", queue=self.queue,
                                    poison=self.poison, crash=crash,
                                    options=QueueHostOptions(**{"receive_visibility": 3.0,
                                                                "visibility_timeout": 1.0,
                                                                "batch_size": 4, **options}))

    def poison_texts(self) -> list[str]:
        from local_stack.queue_host import drain_poison

        return drain_poison(self.poison)


@pytest.fixture
def make_rig(worker, endpoints) -> Iterator[Callable[..., QueueRig]]:
    """`make_rig(backend, *, max_dequeue_count=5, outage_after=0, outage_seconds=0)`."""
    made: list[QueueRig] = []

    def make(backend: str = "table", *, max_dequeue_count: int = 5, outage_after: int = 1,
             outage_seconds: float = 0.0) -> QueueRig:
        name = f"audit-{uuid.uuid4().hex[:10]}"
        settings = app_settings(QueueScenarioConfig(backend=backend,
                                                    max_dequeue_count=max_dequeue_count),
                                endpoints, name)
        real = real_stores(settings)
        outage = outage_store(real("dedup"), after_calls=outage_after, seconds=outage_seconds)
        services = build_services(settings,
                                  stores=lambda role: outage if role == "dedup" else real(role))
        connection = endpoints.queue_connection_string
        rig = QueueRig(worker, services, QueueClient.from_connection_string(connection, name),
                       QueueClient.from_connection_string(connection, f"{name}-poison"),
                       QueueClient.from_connection_string(
                           connection, name, message_encode_policy=TextBase64EncodePolicy()),
                       outage)
        rig.queue.create_queue()
        rig.poison.create_queue()
        made.append(rig)
        return rig

    yield make
    for rig in made:
        with contextlib.suppress(Exception):
            rig.queue.delete_queue()
            rig.poison.delete_queue()
