"""A local gRPC server standing in for the Functions host's Service Bus settlement service.

In Azure, `ServiceBusMessageActions` (package
azurefunctions-extensions-bindings-servicebus) settles a message by calling the
host over gRPC: the `Settlement` service, whose generated contract the
extension ships (`azurefunctions.extensions.bindings.protos`). The client
finds the host from the worker process's command line (`--host`, `--port`,
`--functions-grpc-max-message-length`, read once per process by
`ServiceBusMessageActions.get_instance()`); `local_stack.worker` puts this
server's address there.

Every call is handed to one callback as a `SettlementCall` (lock token,
action, dead-letter reason and description). The callback settles the
delivery wherever it lives (the simulator's broker) or records it (tests). If
the callback raises, the call fails with FAILED_PRECONDITION and the error's
text, as when the host cannot settle (for example, the lock was lost); the
extension then raises `SettlementError` in the function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from azurefunctions.extensions.bindings.protos import settlement_pb2_grpc
from google.protobuf import empty_pb2

ACTIONS = ("complete", "abandon", "deadletter", "defer", "renew_lock")


@dataclass(frozen=True)
class SettlementCall:
    """One settlement request as the host received it."""

    action: str  # one of ACTIONS
    lock_token: str
    reason: str | None = None  # deadletter only
    description: str | None = None  # deadletter only
    properties_to_modify: bytes = b""


SettleCallback = Callable[[SettlementCall], None]


def _optional(request: Any, field: str) -> str | None:
    """A google.protobuf.StringValue field: None when the client left it unset."""
    return getattr(request, field).value if request.HasField(field) else None


class _Servicer(settlement_pb2_grpc.SettlementServicer):
    def __init__(self, callback: SettleCallback) -> None:
        self.callback = callback

    def _handle(self, call: SettlementCall, context: grpc.ServicerContext) -> empty_pb2.Empty:
        try:
            self.callback(call)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # any failure (even a simulated crash) is the answer
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{type(error).__name__}: {error}")
        return empty_pb2.Empty()

    def Complete(self, request: Any, context: grpc.ServicerContext) -> empty_pb2.Empty:
        return self._handle(SettlementCall("complete", request.locktoken), context)

    def Abandon(self, request: Any, context: grpc.ServicerContext) -> empty_pb2.Empty:
        return self._handle(SettlementCall("abandon", request.locktoken,
                                           properties_to_modify=request.propertiesToModify), context)

    def Deadletter(self, request: Any, context: grpc.ServicerContext) -> empty_pb2.Empty:
        return self._handle(SettlementCall(
            "deadletter", request.locktoken, _optional(request, "deadletterReason"),
            _optional(request, "deadletterErrorDescription"), request.propertiesToModify), context)

    def Defer(self, request: Any, context: grpc.ServicerContext) -> empty_pb2.Empty:
        return self._handle(SettlementCall("defer", request.locktoken,
                                           properties_to_modify=request.propertiesToModify), context)

    def RenewMessageLock(self, request: Any, context: grpc.ServicerContext) -> empty_pb2.Empty:
        return self._handle(SettlementCall("renew_lock", request.locktoken), context)


class SettlementServer:
    """The settlement service on a loopback port.

        with SettlementServer(calls.append) as server:
            ...  # clients settle against server.address
    """

    def __init__(self, callback: SettleCallback, *, host: str = "127.0.0.1", port: int = 0,
                 max_workers: int = 16) -> None:
        self.host = host
        self._requested_port = port
        self._callback = callback
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> SettlementServer:
        with self._lock:
            if self._server is not None:
                return self
            server = grpc.server(ThreadPoolExecutor(max_workers=self._max_workers,
                                                    thread_name_prefix="settlement"))
            settlement_pb2_grpc.add_SettlementServicer_to_server(_Servicer(self._callback), server)
            self.port = server.add_insecure_port(f"{self.host}:{self._requested_port}")
            if self.port == 0:
                raise OSError(f"cannot listen on {self.host}:{self._requested_port}")
            server.start()
            self._server = server
            return self

    def stop(self, grace: float | None = 1.0) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop(grace).wait()
                self._server = None

    def __enter__(self) -> SettlementServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
