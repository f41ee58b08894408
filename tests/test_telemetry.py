"""Metric points for every dedup outcome and log records for what a person acts on, from real
flows on the local servers.

Metrics are read with the OpenTelemetry SDK's InMemoryMetricReader on a meter
provider of the test's own (the global provider is left alone); logs with
caplog. Per-message outcomes (processed, duplicate) are DEBUG records: the
tests that check their fields capture DEBUG, the tests of the app's default
(INFO) check that they are not written at all. Event names are the ones the
Bicep alerts query.
"""

# Log records carry their `extra` fields as attributes the LogRecord type does not declare.
# pyright: reportAttributeAccessIssue=false
from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from shared import Idempotency, IdempotencyConfig, OutcomeStatus
from shared._core import telemetry as telemetry_module
from shared._core.keys import DedupKey, request_hash
from shared._core.telemetry import (
    EVENT_BATCH,
    EVENT_CONFLICT,
    EVENT_DUPLICATE,
    EVENT_IN_PROGRESS,
    EVENT_OUTCOME,
    EVENT_PARKED,
    EVENT_REPLAY_SKIPPED,
    METRIC_MESSAGES,
    METRIC_PARKED,
    METRIC_REPLAY_SKIPPED,
    METRIC_STORE_LATENCY,
    Telemetry,
)
from shared._flows.cache import CompletedKeyCache
from shared._flows.parking import ParkingLot
from shared._flows.watermark import PartitionWatermark
from shared.testing import InMemoryIdempotencyStore
from tests.support.parking import parked_body

OUTCOME_FIELDS = ("event", "dedup_key", "consumer", "message_id", "correlation_id", "outcome",
                  "attempt", "request_hash")
# What a record does not carry: the metrics hold latencies, backend and source; the exporter
# writes the record's trace context itself; the encoded key is derived from the key.
NOT_ON_RECORDS = ("dedup_key_encoded", "store_latency_ms", "handler_latency_ms", "backend",
                  "source", "trace_id", "span_id")


def test_event_names_are_stable():
    # Infra alerts query these names; renaming them silences the alerts.
    assert (EVENT_CONFLICT, EVENT_PARKED, EVENT_DUPLICATE) == (
        "IdempotencyKeyConflict", "EventParked", "DuplicateDetected")


@pytest.fixture
def reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    reader.provider = provider
    yield reader
    provider.shutdown()


@pytest.fixture
def telemetry(reader) -> Telemetry:
    return Telemetry(meter_provider=reader.provider)


@pytest.fixture
def logs(caplog):
    """Every record, DEBUG included (the per-message ones, for their fields)."""
    caplog.set_level(logging.DEBUG, logger="shared")
    return caplog


@pytest.fixture
def app_logs(caplog):
    """What the app lets through: its loggers at INFO (function_app.py)."""
    caplog.set_level(logging.INFO, logger="shared")
    return caplog


def library_records(caplog, level: int = logging.INFO) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("shared") and r.levelno >= level]


def metric_points(reader: InMemoryMetricReader, name: str) -> list:
    data = reader.get_metrics_data()
    points = []
    for resource in (data.resource_metrics if data else []):
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points


def counts(reader: InMemoryMetricReader, name: str = METRIC_MESSAGES) -> dict[frozenset, int]:
    return {frozenset(p.attributes.items()): p.value for p in metric_points(reader, name)}


def attrs(**values) -> frozenset:
    return frozenset(values.items())


def last(caplog, event: str) -> logging.LogRecord:
    records = [r for r in caplog.records if getattr(r, "event", None) == event]
    assert records, f"no {event} log record"
    return records[-1]


def check_outcome_record(record: logging.LogRecord, *, event: str, level: int, key: DedupKey,
                         outcome: str, message_id: str, correlation_id: str) -> None:
    for name in OUTCOME_FIELDS:
        assert hasattr(record, name), f"log record has no {name}"
    for name in NOT_ON_RECORDS:
        assert not hasattr(record, name), f"log record carries {name}"
    assert record.levelno == level
    assert record.getMessage().startswith(event)  # alerts match the message text too
    assert record.event == event
    assert record.dedup_key == key.key
    assert record.consumer == key.consumer
    assert record.outcome == outcome
    assert record.message_id == message_id
    assert record.correlation_id == correlation_id


def order(n: int, **changes) -> tuple[DedupKey, str, dict]:
    body = {"orderId": f"order-{n}", "amount": 25, **changes}
    return DedupKey.from_message_id("orders", f"order-{n}"), request_hash(body), body


def build(tx):
    tx.create("line-1", {"sku": "A", "qty": 1})
    return {"ok": True}


def test_processed_duplicates_and_conflict(store, telemetry, reader, logs):
    idem = Idempotency(store, telemetry=telemetry)
    key, digest, _ = order(1)
    ctx = {"message_id": "order-1", "correlation_id": "corr-1"}

    assert idem.run_atomic(key, digest, build,
                           context={**ctx, "delivery_count": 1}).status is OutcomeStatus.PROCESSED
    record = last(logs, EVENT_OUTCOME)
    check_outcome_record(record, event=EVENT_OUTCOME, level=logging.DEBUG, key=key,
                         outcome="processed", **ctx)
    assert record.attempt == 1 and record.delivery_count == 1
    assert not hasattr(record, "duplicate_cause")  # empty fields are left out

    # redelivered by the broker (lock lost / abandoned): delivery count 2
    assert idem.run_atomic(key, digest, build,
                           context={**ctx, "delivery_count": 2}).status is OutcomeStatus.DUPLICATE
    record = last(logs, EVENT_DUPLICATE)
    check_outcome_record(record, event=EVENT_DUPLICATE, level=logging.DEBUG, key=key,
                         outcome="duplicate", **ctx)
    assert record.duplicate_cause == "redelivery"
    assert record.request_hash == digest
    assert not hasattr(record, "stored_hash")  # the same as the request's: nothing to tell

    # a second copy on its first delivery: the producer sent it again
    idem.run_atomic(key, digest, build, context={**ctx, "delivery_count": 1})
    assert last(logs, EVENT_DUPLICATE).duplicate_cause == "producer_retry"
    # an explicit cause wins (Event Hubs replay has no delivery count)
    idem.run_atomic(key, digest, build, context={**ctx, "cause": "replay"})
    assert last(logs, EVENT_DUPLICATE).duplicate_cause == "replay"

    # same key, different content: error-level conflict event
    _, other_digest, _ = order(1, amount=26)
    assert idem.run_atomic(key, other_digest, build, context=ctx).status is OutcomeStatus.CONFLICT
    record = last(logs, EVENT_CONFLICT)
    check_outcome_record(record, event=EVENT_CONFLICT, level=logging.ERROR, key=key,
                         outcome="conflict", **ctx)
    assert record.stored_hash == digest and record.request_hash == other_digest

    base = {"consumer": "orders", "backend": store.name, "source": "store"}
    assert counts(reader) == {
        attrs(**base, outcome="processed"): 1,
        attrs(**base, outcome="duplicate", cause="redelivery"): 1,
        attrs(**base, outcome="duplicate", cause="producer_retry"): 1,
        attrs(**base, outcome="duplicate", cause="replay"): 1,
        attrs(**base, outcome="conflict"): 1,
    }
    latency = metric_points(reader, METRIC_STORE_LATENCY)
    assert sum(p.count for p in latency) == 5
    assert all(p.attributes["backend"] == store.name for p in latency)


def test_in_progress_taken_over_and_stale(store, telemetry, reader, logs, clock):
    config = IdempotencyConfig(ttl=timedelta(hours=1), lease=timedelta(seconds=30), clock=clock)
    idem = Idempotency(store, config=config, telemetry=telemetry)
    key, digest, _ = DedupKey.from_message_id("notify", "n-1"), "sha256:n1", None
    ctx = {"message_id": "n-1", "correlation_id": "corr-n"}
    idem.claim(key, digest)  # another consumer holds it

    assert idem.run(key, digest, lambda: "x", context=ctx).status is OutcomeStatus.IN_PROGRESS
    check_outcome_record(last(logs, EVENT_IN_PROGRESS), event=EVENT_IN_PROGRESS,
                         level=logging.DEBUG, key=key, outcome="in_progress", **ctx)

    clock.advance(31)  # its lease ran out
    assert (idem.run(key, digest, lambda: "x", takeover_stale=False, context=ctx).status
            is OutcomeStatus.STALE)
    check_outcome_record(last(logs, EVENT_IN_PROGRESS), event=EVENT_IN_PROGRESS,
                         level=logging.WARNING, key=key, outcome="stale", **ctx)

    outcome = idem.run(key, digest, lambda: "sent", context=ctx)
    assert outcome.status is OutcomeStatus.TAKEN_OVER
    record = [r for r in logs.records if getattr(r, "outcome", None) == "taken_over"][-1]
    check_outcome_record(record, event=EVENT_OUTCOME, level=logging.INFO, key=key,
                         outcome="taken_over", **ctx)
    assert record.attempt == 2

    base = {"consumer": "notify", "backend": store.name, "source": "store"}
    assert counts(reader) == {attrs(**base, outcome="in_progress"): 1,
                              attrs(**base, outcome="stale"): 1,
                              attrs(**base, outcome="taken_over"): 1}


def test_duplicate_answered_by_the_cache(store, telemetry, reader, logs):
    idem = Idempotency(store, telemetry=telemetry, cache=CompletedKeyCache(10))
    key, digest, _ = order(2)
    idem.run_atomic(key, digest, build, context={"message_id": "order-2", "correlation_id": "c2"})
    idem.run_atomic(key, digest, build, context={"message_id": "order-2", "correlation_id": "c2",
                                                   "delivery_count": 3})
    record = last(logs, EVENT_DUPLICATE)
    check_outcome_record(record, event=EVENT_DUPLICATE, level=logging.DEBUG, key=key,
                         outcome="duplicate", message_id="order-2", correlation_id="c2")
    assert counts(reader)[attrs(consumer="orders", backend=store.name, source="cache",
                                outcome="duplicate", cause="redelivery")] == 1


def test_parked_is_an_error_event_and_a_message_outcome(store, telemetry, reader, logs):
    lot = ParkingLot(store, telemetry=telemetry)
    lot.park(consumer="payments", entry_id="0:42", reason="PaymentRejected", payload=b'{"x":1}',
             context={"message_id": "evt-42", "correlation_id": "corr-42", "partition_id": "0"})
    record = last(logs, EVENT_PARKED)
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith(EVENT_PARKED)
    assert (record.consumer, record.reason) == ("payments", "PaymentRejected")
    assert (record.message_id, record.correlation_id) == ("evt-42", "corr-42")
    assert parked_body(lot, "payments", "0:42")["reason"] == "PaymentRejected"
    assert counts(reader) == {attrs(consumer="payments", outcome="parked",
                                    reason="PaymentRejected"): 1}
    assert counts(reader, METRIC_PARKED) == {attrs(consumer="payments", reason="PaymentRejected"): 1}


def test_replay_skipped_events_are_counted(store, telemetry, reader, logs):
    mark = PartitionWatermark(store, consumer="payments", event_hub="payments",
                              consumer_group="$Default")
    mark.advance("3", 10)
    current = mark.read("3")
    replayed = range(6, 13)
    skipped = [s for s in replayed if s <= current.sequence_number]
    telemetry.replay_skipped(len(skipped), consumer="payments", partition_id="3")
    record = last(logs, EVENT_REPLAY_SKIPPED)
    assert record.levelno == logging.DEBUG  # the batch summary carries the count at INFO
    assert (record.count, record.partition_id, record.consumer) == (5, "3", "payments")
    assert counts(reader, METRIC_REPLAY_SKIPPED) == {attrs(consumer="payments", partition_id="3"): 5}


@pytest.fixture
def exported(caplog):
    """The envelopes the real Azure Monitor log exporter makes of the app's records (INFO and
    up, as the app lets them through), through the distro's logging handler."""
    import json

    from azure.monitor.opentelemetry.exporter.export.logs._exporter import _convert_log_to_envelope
    from opentelemetry.instrumentation.logging.handler import LoggingHandler
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    handler = LoggingHandler(logger_provider=provider)
    shared_logger = logging.getLogger("shared")
    shared_logger.addHandler(handler)
    caplog.set_level(logging.INFO, logger="shared")

    def envelopes() -> list[dict]:
        return [json.loads(json.dumps(_convert_log_to_envelope(r).as_dict()))
                for r in memory.get_finished_logs()]

    try:
        yield envelopes
    finally:
        shared_logger.removeHandler(handler)
        provider.shutdown()


def test_records_join_their_trace_through_the_envelope_not_their_fields(store, telemetry,
                                                                        exported):
    """The exporter writes a record's trace context as operation_Id / operation_ParentId; the
    record repeats none of it as fields."""
    tracer = TracerProvider().get_tracer("test")
    idem = Idempotency(store, telemetry=telemetry)
    key, digest, _ = order(3)
    idem.run_atomic(key, digest, build)
    _, other_digest, _ = order(3, amount=4)
    with tracer.start_as_current_span("consume") as span:
        idem.run_atomic(key, other_digest, build)  # a conflict: an ERROR record
    (envelope,) = exported()
    context = span.get_span_context()
    assert envelope["tags"]["ai.operation.id"] == format(context.trace_id, "032x")
    assert envelope["tags"]["ai.operation.parentId"] == format(context.span_id, "016x")
    properties = envelope["data"]["baseData"]["properties"]
    assert properties["event"] == EVENT_CONFLICT
    assert not set(NOT_ON_RECORDS) & set(properties), properties


def test_context_names_that_clash_with_log_record_attributes_are_kept(telemetry, logs):
    from shared._core.records import Outcome

    key = DedupKey("orders", "o-9")
    outcome = Outcome(OutcomeStatus.PROCESSED, key, "sha256:x")
    telemetry.outcome(outcome, latency=0.001, backend="table", context={"name": "clash", "module": "m"})
    record = last(logs, EVENT_OUTCOME)
    assert record.ctx_name == "clash" and record.ctx_module == "m"


# --- Telemetry that scales: metrics per message, log records per action -----------------------
def test_at_the_apps_level_per_message_outcomes_are_metrics_only(store, telemetry, reader, app_logs):
    idem = Idempotency(store, telemetry=telemetry)
    key, digest, _ = order(4)
    ctx = {"message_id": "order-4", "correlation_id": "c4"}
    idem.run_atomic(key, digest, build, context={**ctx, "delivery_count": 1})
    idem.run_atomic(key, digest, build, context={**ctx, "delivery_count": 2})
    assert library_records(app_logs) == []
    base = {"consumer": "orders", "backend": store.name, "source": "store"}
    assert counts(reader) == {attrs(**base, outcome="processed"): 1,
                              attrs(**base, outcome="duplicate", cause="redelivery"): 1}
    # What a person acts on is still a record: a conflict.
    _, other_digest, _ = order(4, amount=99)
    idem.run_atomic(key, other_digest, build, context=ctx)
    (record,) = library_records(app_logs)
    assert (record.event, record.levelno, record.dedup_key) == (EVENT_CONFLICT, logging.ERROR, key.key)


def test_log_duplicates_raises_duplicates_to_info(store, reader, app_logs):
    telemetry = Telemetry(meter_provider=reader.provider, log_duplicates=True)
    idem = Idempotency(store, telemetry=telemetry)
    key, digest, _ = order(5)
    idem.run_atomic(key, digest, build, context={"message_id": "order-5", "delivery_count": 1})
    idem.run_atomic(key, digest, build, context={"message_id": "order-5", "delivery_count": 3})
    (record,) = library_records(app_logs)  # the duplicate; the processed message stays DEBUG
    assert (record.event, record.levelno, record.duplicate_cause) == (
        EVENT_DUPLICATE, logging.INFO, "redelivery")
    assert record.dedup_key == key.key and record.message_id == "order-5"


def test_log_records_are_o_of_actions_not_o_of_messages(telemetry, reader, app_logs, monkeypatch):
    """1,000 processed messages, 30 duplicates and 3 conflicts: 3 records at the app's level,
    and the 1,033 outcomes aggregated into 3 metric series."""
    built = []
    real_safe_extra = telemetry_module._safe_extra
    monkeypatch.setattr(telemetry_module, "_safe_extra",
                        lambda fields: built.append(fields) or real_safe_extra(fields))
    idem = Idempotency(InMemoryIdempotencyStore(), telemetry=telemetry)
    for n in range(1000):
        key = DedupKey.from_message_id("orders", f"m-{n}")
        idem.run(key, f"sha256:{n}", lambda: "ok", context={"message_id": f"m-{n}", "delivery_count": 1})
    assert library_records(app_logs, logging.DEBUG) == []
    assert built == [], "log fields were built for records nobody writes"
    for n in range(30):
        key = DedupKey.from_message_id("orders", f"m-{n}")
        idem.run(key, f"sha256:{n}", lambda: "ok", context={"delivery_count": 2})
    for n in range(3):
        key = DedupKey.from_message_id("orders", f"m-{n}")
        idem.run(key, "sha256:other", lambda: "ok")
    records = library_records(app_logs, logging.DEBUG)
    assert [r.event for r in records] == [EVENT_CONFLICT] * 3
    base = {"consumer": "orders", "backend": "memory", "source": "store"}
    assert counts(reader) == {attrs(**base, outcome="processed"): 1000,
                              attrs(**base, outcome="duplicate", cause="redelivery"): 30,
                              attrs(**base, outcome="conflict"): 3}
    latency = metric_points(reader, METRIC_STORE_LATENCY)
    assert len(latency) == 3 and sum(p.count for p in latency) == 1033


def test_one_summary_record_per_batch(telemetry, app_logs):
    telemetry.batch(consumer="payments", partition_id="2",
                    counts={"processed": 95, "duplicate": 3, "replay_skipped": 1, "parked": 1},
                    first_sequence=100, last_sequence=199, duration=0.0421,
                    context={"parked_reasons": {"PaymentRejected": 1}})
    (record,) = library_records(app_logs)
    assert record.levelno == logging.INFO and record.getMessage().startswith(EVENT_BATCH)
    assert record.getMessage().endswith("events=100")
    assert (record.event, record.consumer, record.partition_id) == (EVENT_BATCH, "payments", "2")
    assert (record.processed, record.duplicate, record.replay_skipped, record.parked) == (95, 3, 1, 1)
    assert (record.first_sequence, record.last_sequence) == (100, 199)
    assert record.duration_ms == 42 and record.parked_reasons == {"PaymentRejected": 1}


def test_a_batch_summary_carries_only_its_non_zero_counts(telemetry, app_logs):
    telemetry.batch(consumer="payments", partition_id="0",
                    counts={"processed": 5, "duplicate": 0, "replay_skipped": 0, "parked": 0},
                    first_sequence=0, last_sequence=4, duration=0.5)
    (record,) = library_records(app_logs)
    assert record.processed == 5
    for empty in ("duplicate", "replay_skipped", "parked", "parked_reasons", "events"):
        assert not hasattr(record, empty), empty


# Bytes of each exported record as the exporter builds it (within about 20 bytes of what it
# sends): its tags and envelope are about 700 of them; these bounds hold the records' own fields
# to what a person reads. Measured: this summary 932, this conflict 1,162; the same records
# before their fields were cut, 1,043 and 1,407.
SUMMARY_BYTES = 940
CONFLICT_BYTES = 1170


def test_exported_records_stay_small(store, telemetry, exported):
    import json

    telemetry.batch(consumer="payments", partition_id="1",
                    counts={"processed": 34, "duplicate": 0, "replay_skipped": 0, "parked": 0},
                    first_sequence=0, last_sequence=33, duration=0.6762)
    idem = Idempotency(store, telemetry=telemetry)
    key = DedupKey("payments", '["/sim/tba339e/payments/0","pay-0000912"]')
    idem.run_atomic(key, "6" * 43, build,
                    context={"partition_id": "3", "sequence_number": 266})
    idem.run_atomic(key, "4" * 43, build,
                    context={"partition_id": "3", "sequence_number": 266})
    summary, conflict = exported()
    sizes = {"summary": len(json.dumps(summary)), "conflict": len(json.dumps(conflict))}
    assert sizes["summary"] <= SUMMARY_BYTES and sizes["conflict"] <= CONFLICT_BYTES, sizes
