"""One retry budget: under a sustained 429 storm a payments batch raises for the host's retry
within the bound `RetryBudget.unit_seconds` states, on both backends, sync and async.

The app's own wiring builds the SDK clients (`real_stores`, `RealAsyncStores`); their transport
sends every request to a relay that answers 429 with a Retry-After while the storm lasts (real
HTTP through the SDKs' retry policies, real sleeps). Small budget values keep it to seconds; the
production values give the bound docs/stores.md states through the same formula.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from azure.core.pipeline.transport import AioHttpTransport, RequestsTransport

from functions.services import RETRY_BUDGET, RealAsyncStores, build_services, real_stores
from shared._backends.retry import RetryBudget
from shared._core.exceptions import StoreUnavailableError
from shared._flows.batch import MAX_RETRY_AFTER_SECONDS
from simulator.host_inputs import SentEvent
from tests.functions.conftest import settings_for
from tests.functions.test_payments import _view, account_id, structured
from tests.support.parking import parked_body

STORM_RETRY_AFTER = 1.0  # what the relay asks for: more than the app's cap below
SMALL = RetryBudget(sdk_retries=2, sdk_wait=0.2)
MAX_RETRY_AFTER = 0.2
ATTEMPTS = 3
SLACK = 1.0  # the round trips of the storm's requests and the test's own overhead


class Storm:
    """A relay answering every request with 429 + Retry-After, and the switch that routes the
    SDKs' requests to it."""

    def __init__(self) -> None:
        self.on = False
        self.requests = 0
        storm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                storm.requests += 1
                body = json.dumps({"code": "TooManyRequests", "message": "storm"}).encode()
                self.send_response(429)
                self.send_header("Retry-After", str(int(STORM_RETRY_AFTER)))
                self.send_header("x-ms-retry-after-ms", str(int(STORM_RETRY_AFTER * 1000)))
                self.send_header("x-ms-substatus", "3200")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_MERGE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.netloc = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, request: Any) -> None:
        if self.on:
            parts = urlsplit(request.url)
            request.url = urlunsplit(("http", self.netloc, parts.path, parts.query, ""))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class StormTransport(RequestsTransport):
    def __init__(self, storm: Storm, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.storm = storm

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.storm.route(request)
        return super().send(request, **kwargs)


class AsyncStormTransport(AioHttpTransport):
    def __init__(self, storm: Storm, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.storm = storm

    async def send(self, request: Any, **kwargs: Any) -> Any:
        self.storm.route(request)
        return await super().send(request, **kwargs)


@pytest.fixture
def storm() -> Iterator[Storm]:
    relay = Storm()
    yield relay
    relay.close()


def _events(n: int, account: str) -> list:
    return [_view(SentEvent(structured(f"s{uuid.uuid4().hex[:6]}", account, 1), n + k))
            for k in range(2)]


def _storm_requests(backend: str) -> int:
    """Requests the storm gets: one transaction per try of the one account group, each retried
    by Cosmos's SDK; Table Storage's SDK retries no error status."""
    return ATTEMPTS * (SMALL.sdk_retries + 1 if backend == "cosmos" else 1)


def test_the_production_bound_is_well_inside_the_function_timeout_and_the_lock(stack):
    settings = settings_for(stack, "table")
    bound = RETRY_BUDGET.unit_seconds(attempts=settings.payments_max_attempts,
                                      max_retry_after=MAX_RETRY_AFTER_SECONDS)
    assert bound == 3 * (2 * 1.0 + 5.0) == 21.0
    assert bound < settings.window.lock_duration.total_seconds() / 2
    assert bound < 600 / 10  # host.json functionTimeout 00:10:00
    assert RETRY_BUDGET.request_seconds <= settings.window.lock_duration.total_seconds() / 10


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_a_sync_batch_under_a_429_storm_raises_within_the_bound(stack, storm, backend):
    settings = settings_for(stack, backend, PAYMENTS_MAX_ATTEMPTS=str(ATTEMPTS))
    services = build_services(settings, stores=real_stores(settings, budget=SMALL,
                                                           transport=StormTransport(storm)))
    payments = services.payments
    payments.max_retry_after = MAX_RETRY_AFTER
    account = account_id()
    payments.process_batch(_events(1, account), "0")  # the mark and the balance, remembered
    storm.on = True
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as raised:
        payments.process_batch(_events(3, account), "0")
    elapsed = time.monotonic() - started
    storm.on = False
    assert raised.value.status_code == 429
    bound = SMALL.unit_seconds(attempts=ATTEMPTS, max_retry_after=MAX_RETRY_AFTER)
    assert elapsed <= bound + SLACK, f"{elapsed:.2f} s > {bound:.2f} s"
    assert storm.requests == _storm_requests(backend)
    assert parked_body(services.parking, "payments", f"{settings.payments_hub}/0/3") is None


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_an_async_batch_under_a_429_storm_raises_within_the_bound(stack, storm, backend):
    settings = settings_for(stack, backend, PAYMENTS_MAX_ATTEMPTS=str(ATTEMPTS))
    factory = RealAsyncStores(settings, budget=SMALL, transport=AsyncStormTransport(storm))
    services = build_services(settings, stores=real_stores(settings), async_stores=factory)
    payments = services.payments_async
    payments.max_retry_after = MAX_RETRY_AFTER
    account = account_id()

    async def run() -> tuple[float, StoreUnavailableError]:
        try:
            await payments.process_batch(_events(1, account), "0")
            storm.on = True
            started = time.monotonic()
            try:
                await payments.process_batch(_events(3, account), "0")
            except StoreUnavailableError as error:
                return time.monotonic() - started, error
            raise AssertionError("the batch did not raise under the storm")
        finally:
            storm.on = False
            await services.aclose()

    elapsed, error = asyncio.run(run())
    assert error.status_code == 429
    bound = SMALL.unit_seconds(attempts=ATTEMPTS, max_retry_after=MAX_RETRY_AFTER)
    assert elapsed <= bound + SLACK, f"{elapsed:.2f} s > {bound:.2f} s"
    assert storm.requests == _storm_requests(backend)


def test_the_budget_refuses_what_the_sdks_would_misread():
    with pytest.raises(ValueError, match="sdk_retries"):
        RetryBudget(sdk_retries=0)
    with pytest.raises(ValueError, match="sdk_wait"):
        RetryBudget(sdk_wait=0)
    assert SMALL.cosmos_options()["retry_fixed_interval"] == 200
    assert RETRY_BUDGET.table_options()["retry_status"] == 0
