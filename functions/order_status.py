"""`order_status`: Service Bus queue trigger for full-state, versioned status events."""

from __future__ import annotations

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from functions.services import services

bp = func.Blueprint()


@bp.function_name("order_status")
@bp.service_bus_queue_trigger(arg_name="message", queue_name="%ORDER_STATUS_QUEUE_NAME%",
                              connection="ServiceBusConnection", auto_complete_messages=False)
async def order_status(message: servicebus.ServiceBusReceivedMessage,
                       message_actions: servicebus.ServiceBusMessageActions) -> None:
    await services().order_status.handle(message, message_actions)
