"""`orders`: Service Bus queue trigger, settled explicitly (see shared/_core/settlement.py)."""

from __future__ import annotations

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from functions.services import services

bp = func.Blueprint()


@bp.function_name("orders")
@bp.service_bus_queue_trigger(arg_name="message", queue_name="%ORDERS_QUEUE_NAME%",
                              connection="ServiceBusConnection", auto_complete_messages=False)
async def orders(message: servicebus.ServiceBusReceivedMessage,
                 message_actions: servicebus.ServiceBusMessageActions) -> None:
    await services().orders.handle(message, message_actions)
