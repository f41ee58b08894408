"""Recording what the worker's ServiceBusMessageActions sent the settlement server."""

from __future__ import annotations

import threading

from local_stack.settlement_server import SettlementCall


class SettlementRecorder:
    """A settlement callback that records every call (thread-safe)."""

    def __init__(self) -> None:
        self.calls: list[SettlementCall] = []
        self._lock = threading.Lock()

    def __call__(self, call: SettlementCall) -> None:
        with self._lock:
            self.calls.append(call)

    @property
    def last(self) -> tuple[str, str | None, str | None]:
        """(action, reason, description) of the last call; "unsettled" if none came."""
        with self._lock:
            if not self.calls:
                return ("unsettled", None, None)
            call = self.calls[-1]
            return call.action, call.reason, call.description
