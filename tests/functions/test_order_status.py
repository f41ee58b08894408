"""`order_status`: the naturally idempotent path, guarded by versions, no dedup record."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from shared._core.codec import is_record
from shared._core.keys import store_safe_id
from shared._core.telemetry import EVENT_STALE_VERSION, METRIC_MESSAGES, Telemetry
from simulator.host_inputs import RecordingActions, SentMessage, service_bus_message
from tests.functions.conftest import function


def status(order_id: str, version: int, state: str, message_id: str | None = None):
    body = json.dumps({"orderId": order_id, "version": version, "status": state,
                       "carrier": "DHL"}).encode()
    message = service_bus_message(SentMessage(body, message_id=message_id or str(uuid.uuid4())))
    actions = RecordingActions()
    function("order_status")(message=message, message_actions=actions)
    return actions.last


def stored(services, order_id: str) -> dict:
    safe = store_safe_id(order_id)
    return services.stores["order-status"].read_document(safe, safe).body


@pytest.fixture
def reader(services):
    """The messages metric of the order_status consumer, read in memory."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    services.order_status.telemetry = Telemetry(meter_provider=provider)
    yield reader
    provider.shutdown()


def outcomes(reader) -> dict[tuple[str, str | None], int]:
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == METRIC_MESSAGES:
                    for point in metric.data.data_points:
                        assert point.attributes["consumer"] == "order_status"
                        found[(point.attributes["outcome"], point.attributes.get("cause"))] = \
                            point.value
    return found


def test_newer_versions_apply_replays_change_nothing_and_stale_ones_are_rejected(
        services, reader, caplog):
    order_id = f"ORD-{uuid.uuid4().hex[:8]}"
    assert status(order_id, 1, "accepted") == ("complete", None, None)
    assert status(order_id, 2, "paid") == ("complete", None, None)
    before = services.stores["order-status"].read_document(store_safe_id(order_id),
                                                           store_safe_id(order_id))
    assert status(order_id, 2, "paid") == ("complete", None, None)  # duplicate: no write
    with caplog.at_level("INFO"):
        assert status(order_id, 1, "accepted") == ("complete", None, None)  # late, older
    # Reordering is expected, not an action: no record at the app's level, a metric point.
    assert not [r for r in caplog.records if getattr(r, "event", None) == EVENT_STALE_VERSION]
    after = services.stores["order-status"].read_document(store_safe_id(order_id),
                                                          store_safe_id(order_id))
    assert after.etag == before.etag
    assert stored(services, order_id)["status"] == "paid"
    with caplog.at_level("DEBUG", logger="shared"):
        assert asyncio.run(services.order_status.apply({"orderId": order_id, "version": 1,
                                                        "status": "accepted"})) == "stale"
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == EVENT_STALE_VERSION]
    assert (record.order_id, record.incoming_version, record.stored_version) == (order_id, 1, 2)
    assert outcomes(reader) == {("processed", None): 2, ("duplicate", "producer_retry"): 1,
                                ("stale_version", None): 2}


def test_no_dedup_record_is_written(services):
    order_id = f"ORD-{uuid.uuid4().hex[:8]}"
    status(order_id, 1, "accepted")
    assert not is_record(stored(services, order_id))


def test_malformed_status_events_are_dead_lettered(services):
    message = service_bus_message(SentMessage(b'{"orderId": "x", "version": "2"}', message_id="m"))
    actions = RecordingActions()
    function("order_status")(message=message, message_actions=actions)
    assert actions.last[:2] == ("deadletter", "InvalidStatusEvent")
