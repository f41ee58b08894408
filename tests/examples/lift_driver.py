"""Run one lifted example app in the real Python worker, step by step; print what each did (JSON).

    python lift_driver.py <app folder> <config JSON>

Run in a fresh process whose import path holds the app folder and the worker driver
(`local_stack`) only, so the app's modules come from the app folder or not at all. The
config gives the app settings, the relay to put in front of the store (the settings point
the app at it: stopping it is a network outage the app meets) and the steps. The outbox's
Service Bus client is a recorder here (no broker runs on these machines): everything else is
the example's own code on the real worker, the real servers and the real SDKs.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

from local_stack.host_data import SentEvent, SentMessage
from local_stack.relay import Relay
from local_stack.settlement_server import SettlementCall
from local_stack.worker import WorkerHost

SENT: list[dict[str, Any]] = []


class _Sender:
    def __init__(self, destination: str) -> None:
        self.destination = destination

    async def send_messages(self, messages: Any) -> None:
        for message in messages if isinstance(messages, list) else [messages]:
            SENT.append({"destination": self.destination, "message_id": str(message.message_id),
                         "body": json.loads(b"".join(message.body))})

    async def close(self) -> None:
        pass


class RecordingServiceBusClient:
    """Stands where `azure.servicebus.aio.ServiceBusClient` is: keeps what is sent."""

    @classmethod
    def from_connection_string(cls, conn_str: str, **options: Any) -> RecordingServiceBusClient:
        return cls()

    def __init__(self, *args: Any, **options: Any) -> None:
        pass

    def get_queue_sender(self, queue_name: str) -> _Sender:
        return _Sender(queue_name)

    def get_topic_sender(self, topic_name: str) -> _Sender:
        return _Sender(topic_name)

    async def close(self) -> None:
        pass


def main() -> None:
    app_dir, config = sys.argv[1], json.loads(sys.argv[2])
    import azure.servicebus.aio

    azure.servicebus.aio.ServiceBusClient = RecordingServiceBusClient  # the outbox's broker
    relay = Relay(config["target_port"], delay_ms=0, handshake=False, process=False,
                  listen_port=config["relay_port"]).start()
    host = WorkerHost.start(app_dir, config["settings"])
    steps: list[dict[str, Any]] = []
    for step in config["steps"]:
        steps.append({"name": step["name"], **run(host, relay, step)})
    origins = {name: getattr(module, "__file__", None) for name, module in sys.modules.items()
               if name.split(".")[0] in ("shared", "function_app")}
    print(json.dumps({"steps": steps, "sent": SENT, "origins": origins,
                      "functions": sorted(host.metadata())}), flush=True)
    relay.stop()


def run(host: WorkerHost, relay: Relay, step: dict[str, Any]) -> dict[str, Any]:
    kind = step["do"]
    if kind == "outage":
        relay.stop()
        return {}
    if kind == "recover":
        relay.start()
        return {}
    if kind == "service_bus":
        calls: list[SettlementCall] = []
        message = SentMessage(step["body"].encode(), message_id=step.get("message_id"))
        result = host.invoke_service_bus(step["function"], message, lock_token=uuid.uuid4(),
                                         delivery_count=step.get("delivery_count", 1),
                                         settle=calls.append)
        return {"ok": result.ok, "error": result.exception,
                "settled": [[c.action, c.reason] for c in calls]}
    if kind == "event_hub":
        events = [SentEvent(body.encode(), sequence) for sequence, body in step["events"]]
        result = host.invoke_event_hub_batch(step["function"], events, partition_id=step["partition"],
                                             retry_count=step.get("retry_count", 0),
                                             max_retry_count=-1)
        return {"ok": result.ok, "error": result.exception}
    if kind == "http":
        result = host.invoke_http(step["function"], headers=step["headers"],
                                  body=step["body"].encode())
        http = result.http
        return {"ok": result.ok, "status": http.status, "json": http.json() if http.body else None,
                "headers": {k.lower(): v for k, v in http.headers.items()}}
    raise ValueError(f"unknown step {kind!r}")


if __name__ == "__main__":
    main()
