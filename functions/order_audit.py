"""`order_audit`: Azure Storage queue trigger; the audit trail of accepted orders.

The trigger settles by returning (the host deletes the message) or raising (it comes back
after host.json `visibilityTimeout`); refusals go to `<queue>-poison` as envelopes with
their reason, written by `shared.queues.StorageQueueConsumer` through the trigger's own
connection (`AzureWebJobsStorage`: a connection string locally, the queue endpoint and the
app's identity in Azure, Storage Queue Data Contributor on exactly the two queues).
"""

from __future__ import annotations

import threading
import weakref

import azure.functions as func
from azure.storage.queue import QueueClient, TextBase64EncodePolicy

from domain.order_audit import CONSUMER, OrderAuditTrail
from functions.services import Services, services
from functions.settings import QUEUE_CONNECTION, QUEUE_SERVICE_URI, Settings, SettingsError
from shared import Idempotency
from shared.queues import StorageQueueConsumer
from shared.sdk_transport import sync_transport

bp = func.Blueprint()


@bp.function_name("order_audit")
@bp.queue_trigger(arg_name="message", queue_name="%ORDER_AUDIT_QUEUE_NAME%",
                  connection=QUEUE_CONNECTION)
def order_audit(message: func.QueueMessage) -> None:
    order_audit_trail().handle(message)


def poison_queue(settings: Settings) -> QueueClient:
    """The `<queue>-poison` client on the trigger's connection, with the trigger's message
    encoding (base64, the host's default), so its envelopes read like the host's own."""
    name = f"{settings.order_audit_queue}-poison"
    options = {"message_encode_policy": TextBase64EncodePolicy(), "transport": sync_transport()}
    if settings.queue_connection:
        return QueueClient.from_connection_string(settings.queue_connection, name, **options)
    if settings.queue_service_uri:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential(managed_identity_client_id=settings.azure_client_id)
        return QueueClient(settings.queue_service_uri, name, credential=credential, **options)
    raise SettingsError(f"set {QUEUE_CONNECTION} (local: a connection string) or "
                        f"{QUEUE_SERVICE_URI} (Azure, identity): the order_audit trigger's poison "
                        "queue is reached through that connection")


def build_order_audit(current: Services) -> OrderAuditTrail:
    """The audit consumer on the app's services: their `dedup` store (a partition per
    customer), settings and telemetry; the poison client is made on first use."""
    settings = current.settings
    idempotency = Idempotency(current.stores["dedup"], config=settings.idempotency_config(),
                              telemetry=current.telemetry)
    return OrderAuditTrail(StorageQueueConsumer(
        CONSUMER, idempotency, poison=lambda: poison_queue(settings),
        max_dequeue_count=settings.queue_max_dequeue_count))


# One consumer per Services (the process's, or those a caller installed with use_services),
# built on first use and dropped with them. To fold into Services when its rewrite lands.
_built: dict[int, OrderAuditTrail] = {}
_lock = threading.Lock()


def order_audit_trail(current: Services | None = None) -> OrderAuditTrail:
    """The audit consumer of the running invocation's services."""
    current = current or services()
    key = id(current)
    with _lock:
        found = _built.get(key)
        if found is None:
            found = _built[key] = build_order_audit(current)
            weakref.finalize(current, _built.pop, key, None)
        return found
