"""`payments`: CloudEvents batches, grouped commits per account, replay, duplicates, parking,
and transient failures that retry the batch instead of parking valid events."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from azure.core.exceptions import HttpResponseError
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from benchmarks.counting import (
    RequestCounter,
    counted_cosmos_client,
    counted_cosmos_store,
    counted_table_store,
)
from domain.payments import ACCOUNT_DOCUMENT, CONSUMER
from functions.services import Services, build_services
from functions.settings import COSMOS_CONTAINERS, TABLE_FOR
from shared import DedupKey
from shared._core.exceptions import (
    EffectUncertainError,
    InvalidKeyError,
    PoisonMessageError,
    StoreUnavailableError,
    retry_after,
)
from shared._core.keys import store_safe_id
from shared._core.store import (
    Commit,
    CommitGroup,
    IdempotencyStore,
    RecordDispatched,
    WriteDocuments,
    WriteOp,
)
from shared._core.telemetry import EVENT_SEQUENCE_RESET, METRIC_MARK_LAG, METRIC_SEQUENCE_RESET, Telemetry
from shared._flows.batch import MAX_RETRY_AFTER_SECONDS, BatchReport
from shared._triggers.eventhubs import event_views
from simulator.host_inputs import SentEvent, event_hub_batch
from tests.functions.conftest import function, settings_for
from tests.support.doubles import CountingMemoryStore
from tests.support.parking import parked_body
from tests.support.services import installing

SOURCE = "/payments/api"
ALL_BACKENDS = ("memory", "table", "cosmos")


def structured(event_id: str, account: str, cents: int, kind: str = "payment.credit") -> bytes:
    return json.dumps({"specversion": "1.0", "id": event_id, "source": SOURCE, "type": kind,
                       "data": {"accountId": account, "amountCents": cents}}).encode()


def structured_base64(event_id: str, account: str, cents: int, *,
                      content_type: str | None = "application/json", **members: Any) -> bytes:
    """A structured event whose data travels as `data_base64`, as .NET and Java SDKs write
    binary data."""
    data = json.dumps({"accountId": account, "amountCents": cents}).encode()
    return json.dumps({"specversion": "1.0", "id": event_id, "source": SOURCE, "type": "payment.credit",
                       **({"datacontenttype": content_type} if content_type else {}),
                       "data_base64": base64.b64encode(data).decode(), **members}).encode()


def binary(event_id: str, account: str, cents: int, prefix: str = "ce_") -> tuple[bytes, dict]:
    properties = {f"{prefix}specversion": "1.0", f"{prefix}id": event_id, f"{prefix}source": SOURCE,
                  f"{prefix}type": "payment.debit"}
    return json.dumps({"accountId": account, "amountCents": cents}).encode(), properties


def run(events: list[SentEvent], partition: str = "0"):
    function("payments")(events=event_hub_batch(events, partition_id=partition))


def batch(services: Services, events: list[SentEvent], partition: str = "0") -> BatchReport:
    """The batch through the sync processor directly, for its report."""
    return services.payments.process_batch([_view(e, partition) for e in events], partition)


def balance(services, account: str) -> int | None:
    document = services.stores["ledger"].read_document(store_safe_id(account), ACCOUNT_DOCUMENT)
    return None if document is None else document.body["balanceCents"]


def marker_result(services, account: str, event_id: str) -> Any:
    key = DedupKey.from_cloudevent(CONSUMER, SOURCE, event_id)
    record = services.stores["ledger"].get_record(store_safe_id(account), key.encoded)
    return None if record is None else record.result


def parked(services, partition: str, sequence: int) -> dict | None:
    entry_id = f"{services.settings.payments_hub}/{partition}/{sequence}"
    return parked_body(services.parking, "payments", entry_id)


def account_id() -> str:
    return f"acct-{uuid.uuid4().hex[:8]}"


def _view(event: SentEvent, partition: str = "0"):
    return event_views(event_hub_batch([event], partition_id=partition))[0]


# -- services on counted stores, for all three backends ----------------------------------------
class Counted:
    """Services whose stores count their data requests: the benchmark's wire counting on the
    real servers (benchmarks/counting.py), the in-memory store's own tally in memory."""

    def __init__(self, services: Services, count: Callable[[], int]) -> None:
        self.services = services
        self._count = count
        self._start = count()

    def requests(self) -> int:
        """Data requests since the last call (or since the services were built)."""
        now = self._count()
        spent, self._start = now - self._start, now
        return spent


def _store_factory(stack, backend: str, closers: list) -> tuple[Callable[[str], IdempotencyStore],
                                                                Callable[[], int]]:
    suffix = uuid.uuid4().hex[:8]
    built: dict[str, Any] = {}
    if backend == "memory":
        def memory(role: str) -> IdempotencyStore:
            return built.setdefault(TABLE_FOR[role], CountingMemoryStore())

        return memory, lambda: sum(s.requests for s in built.values())
    tables = RequestCounter("table")

    def table(role: str) -> IdempotencyStore:
        name = f"{TABLE_FOR[role]}{suffix}"
        if name not in built:
            built[name] = counted_table_store(stack.table_connection_string, name, tables)
            closers.append(built[name].close)
        return built[name]

    if backend == "table":
        return table, tables.data
    documents = RequestCounter("cosmos")
    client = counted_cosmos_client(stack.cosmos_endpoint, stack.cosmos_key, documents,
                                   verify=stack.cosmos_verify)
    closers.append(client.close)

    def cosmos(role: str) -> IdempotencyStore:
        if role not in COSMOS_CONTAINERS:
            return table(role)  # the parking lot lives in Table Storage, as in the app
        return built.setdefault(role, counted_cosmos_store(
            client, "functions-tests", f"{role}-{suffix}",
            partition_key_path=COSMOS_CONTAINERS[role]))

    return cosmos, lambda: documents.data() + tables.data()


@pytest.fixture
def counted_services(stack, api, clock) -> Iterator[Callable[..., Counted]]:
    """Build counted services for a backend; `sleep` defaults to advancing the test clock."""
    closers: list = []
    with installing() as use:
        def make(backend: str, *, sleep: Callable[[float], None] | None = None,
                 telemetry: Telemetry | None = None, **overrides: str) -> Counted:
            settings = settings_for(stack, "table" if backend == "memory" else backend, **overrides)
            factory, count = _store_factory(stack, backend, closers)
            return Counted(use(build_services(settings, stores=factory, sender=api, clock=clock,
                                              sleep=sleep or clock.advance, telemetry=telemetry)),
                           count)

        yield make
    for close in closers:
        close()


@pytest.fixture(params=ALL_BACKENDS)
def any_backend(request: pytest.FixtureRequest) -> str:
    return request.param


# -- the batch -------------------------------------------------------------------------------
def test_batch_applies_each_event_once(services):
    account = account_id()
    events = [SentEvent(structured(f"e{n}", account, 100), n) for n in range(1, 6)]
    run(events)
    assert balance(services, account) == 500


def test_a_batch_is_one_consumer_span_and_its_summary_joins_it(services, monkeypatch, caplog):
    """Without a span per batch each store call of a batch would be a root trace of its own,
    sampled on its own, and the summary record would join no trace."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from shared._core import observability
    from shared._core.telemetry import EVENT_BATCH

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    monkeypatch.setattr(observability, "tracer", provider.get_tracer("test"))
    current: list[int] = []

    def note_span(record: logging.LogRecord) -> bool:
        if getattr(record, "event", None) == EVENT_BATCH:
            current.append(trace.get_current_span().get_span_context().span_id)
        return True

    logger = logging.getLogger("shared._core.telemetry")
    logger.addFilter(note_span)
    caplog.set_level(logging.INFO, logger="shared")
    try:
        account = account_id()
        run([SentEvent(structured(f"e{n}", account, 100), n) for n in range(3)], partition="2")
    finally:
        logger.removeFilter(note_span)
    (span,) = spans.get_finished_spans()
    assert (span.name, span.kind) == ("payments", trace.SpanKind.CONSUMER)
    assert span.attributes["messaging.destination.partition.id"] == "2"
    assert span.attributes["messaging.batch.message_count"] == 3
    assert current == [span.context.span_id]
    assert balance(services, account) == 300


def test_new_events_cost_one_read_and_one_commit_per_account(counted_services, any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    accounts = [account_id() for _ in range(4)]
    events = [SentEvent(structured(f"n{n}", accounts[n % 4], n), n) for n in range(1, 21)]
    report = batch(services, events)
    assert (report.applied, report.groups, report.watermark) == (20, 4, 20)
    # mark read + (balance read + one transaction) per account + mark write
    assert counted.requests() == 1 + 2 * 4 + 1
    for n in range(1, 21):  # each marker keeps the balance right after its own event
        account = accounts[n % 4]
        expected = sum(m for m in range(1, n + 1) if m % 4 == n % 4)
        assert marker_result(services, account, f"n{n}") == {"balanceCents": expected}
    assert [balance(services, a) for a in accounts] == [
        sum(m for m in range(1, 21) if m % 4 == i) for i in range(4)]


def test_the_next_batch_writes_without_reading_what_the_instance_wrote(counted_services,
                                                                      any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    accounts = [account_id() for _ in range(4)]
    batch(services, [SentEvent(structured(f"a{n}", accounts[n % 4], n), n) for n in range(1, 9)])
    counted.requests()
    events = [SentEvent(structured(f"b{n}", accounts[n % 4], n), n) for n in range(9, 17)]
    report = batch(services, events)
    assert (report.applied, report.watermark) == (8, 16)
    # the mark and the balances this instance wrote are remembered: one transaction per
    # account and the mark write, no read
    assert counted.requests() == 4 + 1
    assert [balance(services, a) for a in accounts] == [
        sum(m for m in range(1, 17) if m % 4 == i) for i in range(4)]


def restarted(services: Services) -> Services:
    """The same stores, none of the process-local state: a host restart."""
    return build_services(services.settings, stores=services.stores.__getitem__,
                          clock=services.payments.ledger.config.clock, sleep=lambda _: None)


def test_replayed_batch_costs_one_request_and_changes_nothing(counted_services, any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    account = account_id()
    events = [SentEvent(structured(f"e{n}", account, 100), n) for n in range(1, 6)]
    batch(services, events)
    counted.requests()
    report = batch(services, events)  # the same batch again, same instance
    assert (report.applied, report.duplicates, report.replay_skipped) == (0, 0, 5)
    assert counted.requests() == 0  # the mark it wrote is remembered
    report = batch(restarted(services), events)  # again after a restart
    assert (report.applied, report.duplicates, report.replay_skipped) == (0, 0, 5)
    assert counted.requests() == 1  # the high-water mark read
    assert balance(services, account) == 500


# -- sequence numbers that restart: a recreated hub, a disaster-recovery failover ------------------
FIRST_HUB = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SECOND_HUB = FIRST_HUB + timedelta(hours=2)  # recreated (or failed over) two hours later


def _timed(prefix: str, account: str, sequences: range, start: datetime) -> list[SentEvent]:
    return [SentEvent(structured(f"{prefix}{n}", account, 100), n,
                      enqueued_time=start + timedelta(milliseconds=10 * k))
            for k, n in enumerate(sequences)]


@pytest.fixture
def meter():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield reader, provider
    provider.shutdown()


def _points(reader: InMemoryMetricReader, name: str) -> list:
    data = reader.get_metrics_data()
    return [point for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics for metric in scope.metrics if metric.name == name
            for point in metric.data.data_points]


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_events_below_the_mark_after_a_sequence_reset_are_all_applied(counted_services, backend,
                                                                      meter, caplog):
    reader, provider = meter
    counted = counted_services(backend, telemetry=Telemetry(meter_provider=provider))
    services = counted.services
    account = account_id()
    report = batch(services, _timed("old", account, range(5000, 5100), FIRST_HUB))
    assert (report.applied, report.watermark) == (100, 5099)
    assert balance(services, account) == 10000
    caplog.set_level(logging.WARNING, logger="shared._core.telemetry")
    report = batch(services, _timed("new", account, range(0, 100), SECOND_HUB))
    assert (report.applied, report.replay_skipped, report.parked) == (100, 0, {})
    assert balance(services, account) == 20000
    assert report.watermark == 99  # moved down to the new sequence
    (point,) = _points(reader, METRIC_SEQUENCE_RESET)
    assert point.value == 1 and dict(point.attributes) == {"consumer": "payments", "partition_id": "0"}
    (record,) = [r for r in caplog.records if r.getMessage().startswith(EVENT_SEQUENCE_RESET)]
    assert record.levelno == logging.WARNING and record.event == EVENT_SEQUENCE_RESET
    # The new incarnation's own replay is absorbed by the moved mark, for one read after a restart.
    counted.requests()
    report = batch(restarted(services), _timed("new", account, range(0, 100), SECOND_HUB))
    assert (report.applied, report.duplicates, report.replay_skipped) == (0, 0, 100)
    assert counted.requests() == 1
    assert balance(services, account) == 20000


def test_a_checkpoint_replay_with_times_still_costs_one_request(counted_services, any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    account = account_id()
    events = _timed("r", account, range(5000, 5010), FIRST_HUB)
    batch(services, events)
    counted.requests()
    report = batch(restarted(services), events)
    assert (report.applied, report.duplicates, report.replay_skipped) == (0, 0, 10)
    assert counted.requests() == 1  # the high-water mark read
    assert balance(services, account) == 1000


def test_a_mark_stored_without_a_time_still_absorbs_replays(counted_services, any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    account = account_id()
    events = _timed("u", account, range(1, 6), FIRST_HUB)
    batch(services, events)
    marks = services.payments.watermark
    stored = marks.read("0")
    body = {"sequenceNumber": 5, "partitionId": "0"}  # as written before times were kept
    services.stores["dedup"].write_documents(stored.document.partition, [
        WriteOp("replace", stored.document.id, body, etag=stored.document.etag)])
    counted.requests()
    report = batch(restarted(services), events)
    assert (report.applied, report.replay_skipped) == (0, 5)
    assert counted.requests() == 1
    report = batch(services, _timed("u", account, range(6, 8), FIRST_HUB + timedelta(seconds=1)))
    assert (report.applied, report.watermark) == (2, 7)
    assert restarted(services).payments.watermark.read("0").enqueued_time is not None


def test_the_mark_lag_is_recorded_when_the_mark_advances(counted_services, meter, clock):
    reader, provider = meter
    counted = counted_services("memory", telemetry=Telemetry(meter_provider=provider))
    events = [SentEvent(structured(f"lag{n}", account_id(), 1), n,
                        enqueued_time=datetime.fromtimestamp(clock() - 30 + n, UTC)) for n in range(3)]
    batch(counted.services, events)
    (point,) = _points(reader, METRIC_MARK_LAG)
    assert dict(point.attributes) == {"consumer": "payments", "partition": "0"}
    assert point.count == 1 and 27.9 < point.sum < 28.1  # now - the newest event's enqueued time


def test_duplicates_inside_a_group_are_judged_and_the_rest_committed(counted_services,
                                                                     any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    account, other = account_id(), account_id()
    batch(services, [SentEvent(structured("d2", account, 20), 1)], partition="early")
    counted.requests()
    events = [SentEvent(structured("d1", account, 10), 1),
              SentEvent(structured("d2", account, 20), 2),  # applied by an earlier batch
              SentEvent(structured("d3", account, 30), 3),
              SentEvent(structured("o1", other, 5), 4),
              SentEvent(structured("d3", account, 30), 5)]  # a second copy in the same group
    report = batch(services, events)
    # mark read + other's balance read + a commit per account + mark write (the account's
    # balance is remembered from the early batch); the duplicate: its record read + a commit
    assert counted.requests() == 1 + 1 + 2 + 1 + 2
    assert (report.applied, report.duplicates, report.parked) == (3, 2, {})
    assert balance(services, account) == 60 and balance(services, other) == 5
    assert marker_result(services, account, "d2") == {"balanceCents": 20}  # from the first time
    assert marker_result(services, account, "d3") == {"balanceCents": 60}


def test_reused_key_inside_a_group_is_parked_and_the_rest_applied(counted_services, any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    account = account_id()
    batch(services, [SentEvent(structured("k1", account, 100), 1)], partition="early")
    counted.requests()
    events = [SentEvent(structured("k0", account, 1), 1),
              SentEvent(structured("k1", account, 999), 2),  # applied before with 100
              SentEvent(structured("k2", account, 2), 3),
              SentEvent(structured("k2", account, 777), 4)]  # reused within the batch
    report = batch(services, events)
    # the mark, the failed commit (the balance is remembered from the early batch), k1's
    # record, the commit; two parked entries (each a read of its id, then the write); the mark
    assert counted.requests() == 1 + 1 + 1 + 1 + 2 * 2 + 1
    assert (report.applied, report.parked) == (2, {"IdempotencyKeyConflict": 2})
    assert balance(services, account) == 103
    assert parked(services, "0", 2)["reason"] == "IdempotencyKeyConflict"
    assert parked(services, "0", 4)["reason"] == "IdempotencyKeyConflict"
    assert parked(services, "0", 3) is None
    assert services.payments.watermark.read("0").sequence_number == 4


def test_more_than_a_transaction_for_one_account_is_split_in_order(counted_services, any_backend):
    counted = counted_services(any_backend)
    services = counted.services
    account = account_id()
    events = [SentEvent(structured(f"s{n}", account, n), n) for n in range(1, 151)]
    report = batch(services, events)
    # the mark, then a read and 99 markers + the balance, then 51 + the balance (as the first
    # transaction wrote it: no read), then the mark
    assert counted.requests() == 1 + 2 + 1 + 1
    assert report.applied == 150
    assert balance(services, account) == sum(range(1, 151))
    assert marker_result(services, account, "s99") == {"balanceCents": sum(range(1, 100))}
    assert marker_result(services, account, "s100") == {"balanceCents": sum(range(1, 101))}


def test_groups_run_concurrently_up_to_the_configured_limit(counted_services, any_backend):
    counted = counted_services(any_backend, sleep=lambda _: None, PAYMENTS_MAX_CONCURRENCY="3")
    services = counted.services
    ledger = services.stores["ledger"]
    real_perform = ledger.perform
    lock = threading.Lock()
    running, peak = [0], [0]

    def slow_commit(step):
        if not isinstance(step, (Commit, CommitGroup)):
            return real_perform(step)
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.05)  # long enough for every free worker to be in here at once
            return real_perform(step)
        finally:
            with lock:
                running[0] -= 1

    ledger.perform = slow_commit
    accounts = [account_id() for _ in range(10)]
    report = batch(services, [SentEvent(structured(f"c{n}", a, 1), n)
                              for n, a in enumerate(accounts, start=1)])
    assert report.applied == 10 and report.groups == 10
    assert peak[0] == 3
    assert all(balance(services, a) == 1 for a in accounts)


def test_partially_processed_batch_replayed_applies_only_the_rest(services):
    account = account_id()
    events = [SentEvent(structured(f"e{n}", account, 10 ** n), n) for n in range(1, 5)]
    for event in events[:2]:  # the host crashed after two effects, before the mark moved
        services.payments.apply(services.payments.parse(_view(event), "0"))
    report = batch(services, events)
    assert (report.applied, report.duplicates) == (2, 2)
    assert balance(services, account) == 10 + 100 + 1000 + 10000


def test_producer_duplicate_at_a_new_sequence_number_is_absorbed_by_the_event_key(services):
    account = account_id()
    run([SentEvent(structured("same", account, 700), 1)])
    run([SentEvent(structured("same", account, 700), 2), SentEvent(structured("next", account, 1), 3)])
    assert balance(services, account) == 701


def test_binary_mode_events_with_either_attribute_prefix(services):
    account = account_id()
    run([SentEvent(structured("c1", account, 1000), 1)])
    body, props = binary("d1", account, 300)
    body2, props2 = binary("d2", account, 200, prefix="cloudEvents:")
    run([SentEvent(body, 2, props), SentEvent(body2, 3, props2)])
    assert balance(services, account) == 500


def test_a_payment_carried_as_data_base64_is_applied_once(services):
    """Structured events with `data_base64` (JSON content type) are payments like any other;
    the same event re-sent with `data` by another producer runtime is a duplicate."""
    account = account_id()
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured_base64("b64-1", account, 250), 1),
         SentEvent(structured_base64("b64-2", account, 50, content_type="text/json; charset=utf-8"), 2)],
        partition)
    assert balance(services, account) == 300
    run([SentEvent(structured("b64-1", account, 250), 3)], partition)  # a copy written with data
    assert balance(services, account) == 300
    assert marker_result(services, account, "b64-1") == {"balanceCents": 250}


def test_binary_mode_binary_data_is_parked_as_not_a_payment_and_the_rest_applied(services):
    account = account_id()
    partition = uuid.uuid4().hex[:6]
    _, properties = binary("raw-1", account, 1)
    run([SentEvent(structured("ok1", account, 5), 1),
         SentEvent(b"\x00\x01 raw bytes", 2, properties, content_type="application/octet-stream"),
         SentEvent(structured("ok2", account, 7), 3)], partition)
    assert balance(services, account) == 12
    assert parked(services, partition, 2)["reason"] == "InvalidPayment"


@pytest.mark.parametrize(("body", "properties", "reason"), [
    (b"{broken", None, "MalformedJson"),
    (structured_base64("both", "a", 1, data={"accountId": "a", "amountCents": 1}), None,
     "MalformedCloudEvent"),
    (structured_base64("bad64", "a", 1, data_base64="eyJhY2NvdW50SWQiOiJh?"), None,
     "MalformedCloudEvent"),
    (structured_base64("bin64", "a", 1, content_type="application/octet-stream"), None,
     "InvalidPayment"),
    (structured_base64("json64", "a", 1, data_base64=base64.b64encode(b"{broken").decode()), None,
     "MalformedJson"),
    (json.dumps({"specversion": "1.0", "source": SOURCE, "type": "payment.credit",
                 "data": {"accountId": "a", "amountCents": 1}}).encode(), None,
     "MissingCloudEventAttributes"),
    (json.dumps({"specversion": "1.0", "id": "x", "source": SOURCE, "type": "payment.refund",
                 "data": {"accountId": "a", "amountCents": 1}}).encode(), None, "UnknownEventType"),
    (json.dumps({"specversion": "1.0", "id": "x2", "source": SOURCE, "type": "payment.credit",
                 "data": {"accountId": "a", "amountCents": "12"}}).encode(), None, "InvalidPayment"),
    (b"x" * (1024 * 1024 + 1), None, "PayloadTooLarge"),
])
def test_bad_event_is_parked_with_its_reason_and_the_rest_is_applied(services, body, properties,
                                                                     reason):
    account = account_id()
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("ok1", account, 5), 1), SentEvent(body, 2, properties),
         SentEvent(structured("ok2", account, 7), 3)], partition)
    assert balance(services, account) == 12
    entry = parked(services, partition, 2)
    assert entry["reason"] == reason
    assert entry["payloadBytes"] == len(body)
    assert services.payments.watermark.read(partition).sequence_number == 3


def test_reused_event_id_with_other_content_is_parked_as_a_conflict(services):
    account = account_id()
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("dup", account, 100), 1)], partition)
    run([SentEvent(structured("dup", account, 999), 2)], partition)
    assert balance(services, account) == 100
    assert parked(services, partition, 2)["reason"] == "IdempotencyKeyConflict"


@pytest.mark.parametrize("backend", ["table"])
def test_missing_key_falls_back_to_partition_and_sequence_when_opted_in(services_for, backend):
    services = services_for(backend, PAYMENTS_MISSING_KEY_POLICY="sequence")
    account = account_id()
    keyless = json.dumps({"type": "payment.credit",
                          "data": {"accountId": account, "amountCents": 40}}).encode()
    run([SentEvent(keyless, 1)], "7")
    # A replay of the same partition+sequence is absorbed, even past the mark:
    payment = services.payments.parse(_view(SentEvent(keyless, 1), "7"), "7")
    assert services.payments.apply(payment).status.value == "duplicate"
    # ...but a producer retry arrives at a new sequence number and is applied again (documented).
    run([SentEvent(keyless, 2)], "7")
    assert balance(services, account) == 80


def test_parking_failure_raises_so_the_host_retries_the_batch(services, monkeypatch):
    parking_store = services.payments_async.parking.store
    real_perform = parking_store.perform

    async def down(step):
        if isinstance(step, WriteDocuments):
            raise StoreUnavailableError("parking store down")
        return await real_perform(step)

    # the function's path: the parking lot's store refuses the entry
    monkeypatch.setattr(parking_store, "perform", down)
    partition = uuid.uuid4().hex[:6]
    with pytest.raises(StoreUnavailableError):
        run([SentEvent(b"{broken", 1)], partition)
    assert services.payments.watermark.read(partition) is None


def test_an_unexpected_error_parks_the_event_instead_of_stalling_the_partition(services,
                                                                               monkeypatch):
    account, cursed = account_id(), account_id()
    real_post = services.payments_async.build  # the function's path

    async def buggy(tx, payments):
        if payments[0].account_id == cursed:
            raise KeyError("bug")
        return await real_post(tx, payments)

    monkeypatch.setattr(services.payments_async, "build", buggy)
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("u1", cursed, 1), 1), SentEvent(structured("u2", account, 4), 2),
         SentEvent(structured("u3", cursed, 2), 3)], partition)
    assert balance(services, account) == 4 and balance(services, cursed) is None
    assert parked(services, partition, 1)["reason"] == "UnexpectedError"
    assert parked(services, partition, 3)["reason"] == "UnexpectedError"
    assert services.payments.watermark.read(partition).sequence_number == 3


# -- transient is not poison ----------------------------------------------------------------
class Outage:
    """Makes every store call of some stores fail fast (503) for a stretch of the test clock,
    starting at the Nth transaction; the first failing transaction lands before it fails (a
    timeout after the write), as the worst case of a real outage."""

    def __init__(self, clock, *, seconds: float, after_commits: int) -> None:
        self.clock = clock
        self.seconds = seconds
        self.after_commits = after_commits
        self.commits = 0
        self.until: float | None = None
        self.failed = 0
        self.lock = threading.Lock()

    def down(self) -> bool:
        return self.until is not None and self.clock() < self.until

    def wrap(self, store: IdempotencyStore) -> None:
        """Every step the drivers hand `store` (its `perform`), but clearing an outbox."""
        call = store.perform

        def perform(step: Any) -> Any:
            if isinstance(step, RecordDispatched):
                return call(step)
            if isinstance(step, (Commit, CommitGroup)):
                with self.lock:
                    self.commits += 1
                    starts = self.until is None and self.commits > self.after_commits
                    if starts:
                        self.until = self.clock() + self.seconds
                if starts:
                    call(step)  # the write lands; its answer is lost
                    self._fail()
            if self.down():
                self._fail()
            return call(step)

        store.perform = perform  # the outage, on this store only

    def _fail(self) -> None:
        self.failed += 1
        raise StoreUnavailableError("simulated outage (503)", status_code=503)


def host_retries(invoke: Callable[[], None], clock, *, limit: int = 20) -> int:
    """Run a batch as the `payments` retry policy does (exponential, 5 s .. 5 min) until it
    succeeds; return how many attempts failed."""
    interval, failures = 5.0, 0
    while True:
        try:
            invoke()
            return failures
        except StoreUnavailableError:
            failures += 1
            assert failures < limit, "the batch never succeeded"
            clock.advance(interval)
            interval = min(interval * 2, 300.0)


def test_a_20_s_store_outage_parks_nothing_and_the_retried_batch_applies_every_event_once(
        counted_services, any_backend, clock):
    services = counted_services(any_backend).services
    outage = Outage(clock, seconds=20, after_commits=2)
    for role in ("ledger", "dedup"):  # the whole backend; the parking lot stays up to prove nothing parks
        outage.wrap(services.stores[role])
    accounts = [account_id() for _ in range(6)]
    events = [SentEvent(structured(f"t{n}", accounts[n % 6], n), n) for n in range(1, 61)]
    partition = uuid.uuid4().hex[:6]
    failed_attempts = host_retries(lambda: run(events, partition), clock)
    assert failed_attempts >= 2 and outage.failed > 0  # the outage outlasted several retries
    assert all(parked(services, partition, n) is None for n in range(1, 61))
    for i, account in enumerate(accounts):  # every event applied exactly once
        assert balance(services, account) == sum(n for n in range(1, 61) if n % 6 == i)
    assert all(marker_result(services, accounts[n % 6], f"t{n}") is not None for n in range(1, 61))
    assert services.payments.watermark.read(partition).sequence_number == 60


def test_the_mark_stays_until_every_group_committed(counted_services, any_backend):
    services = counted_services(any_backend).services
    ok, failing = account_id(), account_id()
    ledger = services.stores["ledger"]
    real_perform, down = ledger.perform, [True]

    def perform(step):
        markers = (step.marker,) if isinstance(step, Commit) else \
            step.markers if isinstance(step, CommitGroup) else ()
        if down[0] and any(m.partition_key == store_safe_id(failing) for m in markers):
            raise StoreUnavailableError("throttled", status_code=429)
        return real_perform(step)

    ledger.perform = perform
    events = [SentEvent(structured("m1", ok, 1), 1), SentEvent(structured("m2", failing, 2), 2),
              SentEvent(structured("m3", ok, 3), 3)]
    with pytest.raises(StoreUnavailableError):
        batch(services, events)
    assert balance(services, ok) == 4 and balance(services, failing) is None
    assert services.payments.watermark.read("0") is None  # not past the failed group
    assert parked(services, "0", 2) is None
    down[0] = False  # the host's retry, after the throttling
    report = batch(services, events)
    assert (report.applied, report.duplicates, report.watermark) == (1, 2, 3)
    assert (balance(services, ok), balance(services, failing)) == (4, 2)


class _Response:
    """The part of an HTTP response azure-core's HttpResponseError reads."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.reason = "Too Many Requests"
        self.headers = headers

    def text(self) -> str:
        return ""


def throttled(headers: dict[str, str]) -> StoreUnavailableError:
    error = HttpResponseError(response=cast(Any, _Response(429, headers)))
    return StoreUnavailableError("Cosmos DB answered 429", status_code=429, error=error)


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"Retry-After": "7"}, 7.0), ({"x-ms-retry-after-ms": "1500"}, 1.5),
    ({"retry-after-ms": "250"}, 0.25), ({"Content-Type": "text/plain"}, None),
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0)])
def test_retry_after_is_read_from_the_sdk_error(headers, seconds):
    assert retry_after(throttled(headers)) == seconds


@pytest.mark.parametrize(("header", "slept"), [("3", 3.0), ("3600", MAX_RETRY_AFTER_SECONDS)])
def test_throttling_honours_retry_after_before_the_batch_raises(counted_services, header, slept):
    sleeps: list[float] = []
    services = counted_services("memory", sleep=sleeps.append).services

    def throttle(*_args, **_kwargs):
        raise throttled({"Retry-After": header})

    services.stores["ledger"].commit = throttle
    with pytest.raises(StoreUnavailableError):
        batch(services, [SentEvent(structured("r1", account_id(), 1), 1)])
    attempts = services.settings.payments_max_attempts
    assert sleeps == [slept] * attempts  # between the tries, then once before raising
    assert parked(services, "0", 1) is None


def test_a_balance_beyond_what_the_stores_hold_exactly_parks_the_event_never_rounds(services):
    """Amounts are bounded (10^15 cents); a balance is kept within +-(2^53 - 1), which a Cosmos
    number holds exactly: the event that would cross it is parked with a reason, the rest apply."""
    account, partition = account_id(), uuid.uuid4().hex[:6]
    big = 10**15
    events = [SentEvent(structured(f"big-{n}-{account}", account, big), n + 1) for n in range(10)]
    events.append(SentEvent(structured(f"small-{account}", account, 7), 11))
    run(events, partition)
    assert balance(services, account) == 9 * big + 7  # the tenth would pass 2^53 - 1
    parked = parked_body(services.parking, CONSUMER, f"{services.settings.payments_hub}/{partition}/10")
    assert parked["reason"] == "BalanceOutOfRange"


def test_a_parked_event_of_a_recreated_hub_does_not_replace_the_old_ones_entry(counted_services,
                                                                              backend):
    """Sequence numbers restart with a new hub: parked entries stay one per event."""
    services = counted_services(backend).services
    account = account_id()
    old = [*_timed("a", account, range(0, 5), FIRST_HUB)]
    old[3] = SentEvent(b"{broken old", 3, enqueued_time=old[3].enqueued_time)
    assert batch(services, old).parked == {"MalformedJson": 1}
    new = [*_timed("b", account, range(0, 5), SECOND_HUB)]
    new[3] = SentEvent(b"{broken new", 3, enqueued_time=new[3].enqueued_time)
    assert batch(services, new).parked == {"MalformedJson": 1}
    hub = services.settings.payments_hub
    renamed = f"{hub}/0/3@{new[3].enqueued_time.isoformat()}"
    assert parked(services, "0", 3)["payload"] == "{broken old"  # the first keeps its id
    assert parked_body(services.parking, "payments", renamed)["payload"] == "{broken new"
    # The same event parked again (a host retry) replaces its own entry, no third one.
    batch(restarted(services), new)
    assert parked_body(services.parking, "payments", renamed)["payload"] == "{broken new"
    assert parked(services, "0", 3)["payload"] == "{broken old"


@pytest.mark.parametrize(("raised", "reason"), [
    (PoisonMessageError("AccountClosed", "the account was closed"), "AccountClosed"),
    (EffectUncertainError("the ledger did not answer"), "OutcomeUnknown"),
    (InvalidKeyError("no such key"), "InvalidKey"),
])
def test_a_refusal_from_the_build_parks_with_the_rule_s_reason(services, monkeypatch, raised,
                                                               reason):
    """The one settlement rule (docs/concepts.md#one-settlement-rule): what Service Bus
    dead-letters with a reason, the batch parks with the same reason."""
    account, cursed = account_id(), account_id()
    real_post = services.payments_async.build

    async def refusing(tx, payments):
        if payments[0].account_id == cursed:
            raise raised
        return await real_post(tx, payments)

    monkeypatch.setattr(services.payments_async, "build", refusing)
    partition = uuid.uuid4().hex[:6]
    run([SentEvent(structured("r1", cursed, 1), 1), SentEvent(structured("r2", account, 4), 2)],
        partition)
    assert balance(services, account) == 4 and balance(services, cursed) is None
    assert parked(services, partition, 1)["reason"] == reason
    assert services.payments.watermark.read(partition).sequence_number == 2
