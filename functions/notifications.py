"""`notify` and `audit`: two subscriptions on one topic, each deduplicated on its own."""

from __future__ import annotations

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

from functions.services import services

bp = func.Blueprint()


@bp.function_name("notify")
@bp.service_bus_topic_trigger(arg_name="message", topic_name="%NOTIFICATIONS_TOPIC_NAME%",
                              subscription_name="%NOTIFY_SUBSCRIPTION_NAME%",
                              connection="ServiceBusConnection", auto_complete_messages=False)
async def notify(message: servicebus.ServiceBusReceivedMessage,
                 message_actions: servicebus.ServiceBusMessageActions) -> None:
    await services().notify.handle(message, message_actions)


@bp.function_name("audit")
@bp.service_bus_topic_trigger(arg_name="message", topic_name="%NOTIFICATIONS_TOPIC_NAME%",
                              subscription_name="%AUDIT_SUBSCRIPTION_NAME%",
                              connection="ServiceBusConnection", auto_complete_messages=False)
async def audit(message: servicebus.ServiceBusReceivedMessage,
                message_actions: servicebus.ServiceBusMessageActions) -> None:
    await services().audit.handle(message, message_actions)
