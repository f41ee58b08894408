"""`balance_projection`: Service Bus queue trigger for the BalanceChanged messages `payments`
publishes through its outbox; settled explicitly (see shared/_core/settlement.py)."""

from __future__ import annotations

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from functions.services import services

bp = func.Blueprint()


@bp.function_name("balance_projection")
@bp.service_bus_queue_trigger(arg_name="message", queue_name="%BALANCE_CHANGES_QUEUE%",
                              connection="ServiceBusConnection", auto_complete_messages=False)
async def balance_projection(message: servicebus.ServiceBusReceivedMessage,
                             message_actions: servicebus.ServiceBusMessageActions) -> None:
    await services().balance_projection.handle(message, message_actions)
