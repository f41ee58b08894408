"""`order_audit`: Azure Storage queue trigger; the audit trail of accepted orders.

The trigger settles by returning (the host deletes the message) or raising (it comes back
after host.json `visibilityTimeout`); refusals go to `<queue>-poison` as envelopes with
their reason, written by `shared._triggers.queues.StorageQueueConsumer` through the trigger's own
connection (`AzureWebJobsStorage`: a connection string locally, the queue endpoint and the
app's identity in Azure, Storage Queue Data Contributor on exactly the two queues).
"""

from __future__ import annotations

import azure.functions as func

from functions.services import services
from functions.settings import QUEUE_CONNECTION

bp = func.Blueprint()


@bp.function_name("order_audit")
@bp.queue_trigger(arg_name="message", queue_name="%ORDER_AUDIT_QUEUE_NAME%",
                  connection=QUEUE_CONNECTION)
def order_audit(message: func.QueueMessage) -> None:
    services().order_audit.handle(message)
