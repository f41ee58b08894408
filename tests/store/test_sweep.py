"""The bounded maintenance sweep on Azurite: one page in memory, a time budget, a resumed scan.

Table Storage filters a query by reading every row, so the sweep of a large
table must stop at its budget and resume next run; it must never hold more
than a page, delete as pages come, and read the table once per run for both
the purge and the stale-claim sweep.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError

from shared import DedupKey, Idempotency, IdempotencyConfig, request_hash
from shared._backends import TableIdempotencyStore
from shared._backends import table as table_module
from shared._backends.table import SWEEP_CURSOR
from shared._flows.parking import ParkingLot
from shared._triggers.maintenance import Maintenance

TTL = timedelta(days=7)
LEASE = timedelta(minutes=1)
PAGE = 10


class ScanLog:
    """What the store asked of the table: rows handed over by queries, rows deleted, scans
    started (queries without a continuation), and the continuations it resumed from."""

    def __init__(self) -> None:
        self.read = 0
        self.deleted = 0
        self.held: list[int] = []  # rows read but not yet deleted, at each delete request
        self.scans = 0
        self.resumed_from: list[Any] = []
        self.refuse_continuation = False
        self.on_page: Any = None

    def deleting(self, count: int) -> None:
        self.held.append(self.read - self.deleted)
        self.deleted += count


class _Pages:
    def __init__(self, pages: Any, log: ScanLog) -> None:
        self.pages, self.log = pages, log

    def __iter__(self) -> _Pages:
        return self

    def __next__(self) -> Iterator[Any]:
        page = next(self.pages)
        if self.log.on_page is not None:
            self.log.on_page()
        return self._count(page)

    def _count(self, page: Any) -> Iterator[Any]:
        for entity in page:
            self.log.read += 1
            yield entity

    @property
    def continuation_token(self) -> Any:
        return self.pages.continuation_token


class _Query:
    def __init__(self, paged: Any, log: ScanLog) -> None:
        self.paged, self.log = paged, log

    def __iter__(self) -> Iterator[Any]:
        self.log.scans += 1
        for entity in self.paged:
            self.log.read += 1
            yield entity

    def by_page(self, continuation_token: Any = None) -> _Pages:
        if continuation_token is None:
            self.log.scans += 1
        else:
            self.log.resumed_from.append(continuation_token)
            if self.log.refuse_continuation:
                self.log.refuse_continuation = False  # the stored one; the service's next are fine
                error = HttpResponseError("InvalidInput: the continuation token is not valid")
                error.status_code = 400
                raise error
        return _Pages(self.paged.by_page(continuation_token=continuation_token), self.log)


@pytest.fixture
def table_store(make_store) -> TableIdempotencyStore:
    return make_store("table")


@pytest.fixture
def log(table_store, monkeypatch) -> ScanLog:
    """Counts what `table_store` reads and deletes, whatever path it takes."""
    log = ScanLog()
    client = table_store.client
    query, delete = client.query_entities, client.delete_entity
    submit = table_module.submit_transaction
    monkeypatch.setattr(client, "query_entities", lambda *a, **k: _Query(query(*a, **k), log))

    def counted_delete(*args: Any, **kwargs: Any) -> Any:
        if args and args[0] != SWEEP_CURSOR[0]:
            log.deleting(1)
        return delete(*args, **kwargs)

    def counted_submit(client: Any, operations: Any, *args: Any, **kwargs: Any) -> Any:
        operations = list(operations)
        log.deleting(sum(op[0] == "delete" for op in operations))
        return submit(client, operations, *args, **kwargs)

    monkeypatch.setattr(client, "delete_entity", counted_delete)
    monkeypatch.setattr(table_module, "submit_transaction", counted_submit)
    return log


@pytest.fixture
def idem(table_store, clock) -> Idempotency:
    return Idempotency(table_store, config=IdempotencyConfig(ttl=TTL, lease=LEASE, clock=clock))


def _completed(idem: Idempotency, count: int, prefix: str = "done", **atomic: Any) -> None:
    for n in range(count):
        if atomic:
            idem.run_atomic(DedupKey("c", f"{prefix}-{n:03}"), request_hash("x"), lambda tx: None,
                            **atomic)
        else:
            idem.run(DedupKey("c", f"{prefix}-{n:03}"), request_hash("x"), lambda: "ok")


def _claimed(idem: Idempotency, count: int, prefix: str = "stuck") -> list[str]:
    return [idem.claim(DedupKey("c", f"{prefix}-{n:03}"), request_hash("x"))[1].id
            for n in range(count)]


class Timer:
    """A monotonic timer the test moves: each page the store reads costs one second."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_purge_holds_at_most_one_page_and_deletes_as_pages_come(idem, table_store, log, clock):
    _completed(idem, 60)  # one partition per record (the two-phase layout)
    _completed(idem, 40, "acct", partition="acct-1")  # one partition: transactions of <= PAGE
    clock.advance(TTL.total_seconds() + 1)
    table_store.sweep_page_size = PAGE
    assert table_store.purge_expired(clock()) == 100
    assert log.read == 100 and log.deleted == 100
    assert max(log.held) <= PAGE, f"held {max(log.held)} rows before deleting them"
    assert list(table_store.iter_records()) == []


def test_maintenance_reads_the_table_once_and_parks_what_it_parked_before(
        idem, table_store, log, clock, make_store):
    """One scan serves the purge and the stale-claim sweep; what it parks and closes is what
    the two-query sweep parked: every claim past its lease and the window, nothing live."""
    table_store.sweep_page_size = PAGE
    _completed(idem, 25, "old")
    clock.advance(TTL.total_seconds() / 2)
    stuck = _claimed(idem, 12)
    clock.advance(TTL.total_seconds() / 2 + 1)  # old ones expire; the claims are long stale
    _completed(idem, 30, "live")
    _claimed(idem, 5, "busy")  # leases still running: not stale
    parking = ParkingLot(make_store("table"), clock=clock)
    maintenance = Maintenance({"dedup": table_store}, parking, grace_seconds=600, clock=clock)

    report = maintenance.run()

    assert (report.purged, report.parked) == ({"dedup": 25}, 12)
    assert log.scans == 1, "the purge and the stale sweep read the table once"
    assert log.read == 25 + 12  # the service filters: only expired rows and stale claims
    for record_id in stuck:
        closed = table_store.get_record(record_id, record_id)
        assert closed.state.value == "completed" and closed.result == {"parked": "StaleInProgress"}
    assert {r.key.key for r in table_store.iter_records()} >= {f"live-{n:03}" for n in range(30)}
    assert [r.key.key for r in table_store.iter_records(in_progress_before=clock())] == []


def test_two_roles_on_one_table_are_swept_once(idem, table_store, log, clock, make_store):
    _completed(idem, 3)
    clock.advance(TTL.total_seconds() + 1)
    twin = TableIdempotencyStore.from_table_client(table_store.client)
    maintenance = Maintenance({"dedup": table_store, "notifications": twin},
                              ParkingLot(make_store("memory"), clock=clock), grace_seconds=0,
                              clock=clock)
    report = maintenance.run()
    assert report.purged == {"dedup": 3} and log.scans == 1


def test_the_budget_stops_a_run_and_the_next_run_resumes_where_it_stopped(
        idem, table_store, log, clock):
    """Stale claims the handler leaves in place stay in the filter: which rows a run sees
    shows where it started."""
    ids = sorted(_claimed(idem, 100))
    clock.advance(TTL.total_seconds() / 2)
    timer = Timer()

    def spend_a_second() -> None:
        timer.now += 1

    log.on_page = spend_a_second

    def run() -> tuple[list[str], Any]:
        seen: list[str] = []
        report = table_store.sweep(clock(), stale_before=clock(), on_stale=lambda r: seen.append(r.id),
                                   budget_seconds=3.5, timer=timer, page_size=PAGE)
        return seen, report

    first, report = run()
    assert (len(first), report.pages, report.complete) == (40, 4, False)
    assert table_store.client.get_entity(*SWEEP_CURSOR)["version"] == 1  # persisted
    second, report = run()
    assert log.resumed_from, "the second run resumed from the stored continuation"
    assert (len(second), report.complete) == (40, False)
    assert not set(first) & set(second)
    third, report = run()
    assert (len(third), report.complete) == (20, True)
    assert sorted(first + second + third) == ids  # every row once over the three runs
    assert table_store.get_record(*SWEEP_CURSOR) is None
    fourth, _ = run()
    assert fourth == first  # a finished scan starts again from the beginning


@pytest.mark.parametrize("cursor", [
    {"version": 99, "nextPartitionKey": "c|stuck-050", "nextRowKey": "c|stuck-050"},
    {"version": 1, "nextPartitionKey": 7},
], ids=["another version", "malformed"])
def test_an_unreadable_cursor_restarts_the_scan_from_the_beginning(idem, table_store, clock, cursor):
    ids = _claimed(idem, 30)
    clock.advance(TTL.total_seconds() / 2)
    table_store.client.upsert_entity({"PartitionKey": SWEEP_CURSOR[0], "RowKey": SWEEP_CURSOR[1],
                                      **cursor})
    seen: list[str] = []
    report = table_store.sweep(clock(), stale_before=clock(), on_stale=lambda r: seen.append(r.id),
                               page_size=PAGE)
    assert report.restarted and report.complete
    assert sorted(seen) == sorted(ids)


def test_a_continuation_the_service_refuses_restarts_the_scan(idem, table_store, log, clock):
    ids = _claimed(idem, 30)
    clock.advance(TTL.total_seconds() / 2)
    timer = Timer()
    log.on_page = lambda: setattr(timer, "now", timer.now + 1)
    seen: list[str] = []

    def run(budget: float) -> Any:
        return table_store.sweep(clock(), stale_before=clock(), on_stale=lambda r: seen.append(r.id),
                                 budget_seconds=budget, timer=timer, page_size=PAGE)

    assert not run(0.5).complete and len(seen) == PAGE
    log.refuse_continuation = True
    seen.clear()
    report = run(100)
    assert log.resumed_from and report.restarted and report.complete
    assert sorted(seen) == sorted(ids)


def test_a_failed_stale_handler_keeps_the_page_for_the_next_run(idem, table_store, clock):
    """The continuation is saved after a page is done: a run that fails mid-page leaves the
    page for the next run, which starts there (not at the beginning)."""
    ids = sorted(_claimed(idem, 25))
    clock.advance(TTL.total_seconds() / 2)
    seen: list[str] = []

    def fail_on_the_third_page(record: Any) -> None:
        seen.append(record.id)
        if len(seen) == 2 * PAGE + 1:
            raise ConnectionError("parking lot down")

    with pytest.raises(ConnectionError):
        table_store.sweep(clock(), stale_before=clock(), on_stale=fail_on_the_third_page,
                          page_size=PAGE)
    retried: list[str] = []
    table_store.sweep(clock(), stale_before=clock(), on_stale=lambda r: retried.append(r.id),
                      page_size=PAGE)
    assert seen == ids[:2 * PAGE + 1] and retried == ids[2 * PAGE:]
