"""The benchmark harness at a tiny size, on the session's local servers (and, in latency
mode, behind relays that add round-trip time).

Timing is not asserted (CI machines vary); the store request counts are
deterministic and are: they are the figures the README quotes.
"""

from __future__ import annotations

import json

import pytest
from azure.cosmos import PartitionKey

from benchmarks.counting import RequestCounter, counted_cosmos_client, counted_table_store
from benchmarks.harness import Endpoints, run_benchmark
from benchmarks.hash_cost import measure, payment_contents
from benchmarks.latency import LatencySizes, Probe, RttNotVerifiedError, check_probes, run_latency
from benchmarks.latency_report import app_shape
from benchmarks.latency_report import markdown as latency_markdown
from benchmarks.latency_report import rows as rows_latency
from benchmarks.latency_report import targets as latency_targets
from benchmarks.latency_report import write_outputs as write_latency_outputs
from benchmarks.latency_variants import build_payment_workload
from benchmarks.report import markdown, rows, targets, write_outputs
from benchmarks.variants import VARIANTS
from benchmarks.workload import Sizes

N = 4  # events per batch
SIZES = Sizes(messages=3, duplicates=3, batch_size=N, batches=2, concurrent=2, copies=2,
              rounds=1, warmup=1)

# variant: (requests per new message, per duplicate, per replayed batch)
EXPECTED = {
    "no-dedup": (1, 1, N),
    "naive": (3, 1, N),  # read marker, effect, write marker / read finds it
    "powertools": (3, 2, 2 * N),  # put in-progress, effect, update / 409 + read
    "two-phase": (3, 2, 2 * N),
    "atomic": (1, 2, 2 * N),  # one transaction / 409 + read
    "atomic+cache": (1, 0, 2 * N),  # warm duplicate: none; replay after a restart is cold
    "atomic+hwm": (1, 2, 1),  # replayed, checkpointed batch: one mark read
}


@pytest.fixture(scope="module")
def run(stack):
    endpoints = Endpoints(stack.table_connection_string, stack.cosmos_endpoint, stack.cosmos_key,
                          stack.cosmos_verify)
    return run_benchmark(endpoints, SIZES, seed=7)


def test_every_variant_ran_on_both_backends(run):
    assert {(r.name, r.backend) for r in run.results} == {
        (name, backend) for name in VARIANTS for backend in ("table", "cosmos")}


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_request_counts_are_exact(run, name, backend):
    result = run.result(name, backend)
    new, dup, replay = EXPECTED[name]
    assert result.new_requests == [new] * SIZES.messages
    assert result.dup_requests == [dup] * SIZES.duplicates
    assert result.replay_batch_requests == [replay] * SIZES.batches
    if name == "atomic+hwm":
        # mark read + N commits + mark write (+1 read on the partition's first batch)
        assert result.first_batch_requests[1:] == [N + 2] * (SIZES.batches - 1)
        assert result.first_batch_requests[0] <= N + 3
    else:
        assert result.first_batch_requests == [new * N] * SIZES.batches
    assert result.meta_requests == 0
    assert result.retried_calls == 0


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_dedup_variants_never_apply_an_effect_twice(run, backend):
    for name in ("powertools", "two-phase", "atomic", "atomic+cache", "atomic+hwm"):
        result = run.result(name, backend)
        assert result.concurrent_extra_effects == 0, name
        assert result.replay_extra_effects == 0, name
    baseline = run.result("no-dedup", backend)
    assert baseline.concurrent_extra_effects == SIZES.concurrent * (SIZES.copies - 1)
    assert baseline.replay_extra_effects == SIZES.batches * N


def test_request_targets_hold_and_outputs_are_written(run, tmp_path):
    met = {(t.text, t.backend): t.met for t in targets(run) if "throughput" not in t.text}
    assert met and all(met.values()), met
    assert all(r.throughput > 0 for r in rows(run))
    written = write_outputs(run, tmp_path, with_chart=True)
    text = written["markdown"].read_text()
    assert text == markdown(run)
    assert "| Variant | Backend | Req/new msg |" in text
    if "chart" in written:  # matplotlib is a dev requirement
        assert written["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_counting_is_exact_on_both_sdks(stack, cosmos_database, table_service):
    table_counter = RequestCounter("table")
    store = counted_table_store(stack.table_connection_string, "countcheck", table_counter)
    try:
        assert table_counter.meta() == 1  # create table
        store.client.create_entity({"PartitionKey": "p", "RowKey": "a"})
        store.client.submit_transaction([("create", {"PartitionKey": "p", "RowKey": "b"}),
                                         ("create", {"PartitionKey": "p", "RowKey": "c"})])
        assert table_counter.data("wire") == table_counter.data("call") == 2
    finally:
        table_service.delete_table("countcheck")

    cosmos_counter = RequestCounter("cosmos")
    client = counted_cosmos_client(stack.cosmos_endpoint, stack.cosmos_key, cosmos_counter,
                                   verify=stack.cosmos_verify)
    container = cosmos_database.create_container("countcheck", PartitionKey("/pk"))
    try:
        proxy = client.get_database_client(cosmos_database.id).get_container_client("countcheck")
        proxy.create_item({"id": "a", "pk": "p"})
        proxy.execute_item_batch([("create", ({"id": "b", "pk": "p"},)),
                                  ("create", ({"id": "c", "pk": "p"},))], partition_key="p")
        proxy.read_item("a", "p")
        assert cosmos_counter.data() == 3
    finally:
        client.close()
        cosmos_database.delete_container(container.id)


# -- latency mode (issue 12): relays in front of both servers, tiny sizes ----------------------
LATENCY_SIZES = LatencySizes(events=12, batch_size=6, accounts=(3,), warmup_events=6,
                             concurrency=4, probe_reads=5)
RTT_MS = 2.0


@pytest.fixture(scope="module")
def latency(stack):
    endpoints = Endpoints(stack.table_connection_string, stack.cosmos_endpoint, stack.cosmos_key,
                          stack.cosmos_verify)
    return run_latency(endpoints, LATENCY_SIZES, (RTT_MS,), seed=5)


def test_latency_mode_measured_the_added_rtt_on_both_backends(latency):
    assert sorted((p.backend, p.when) for p in latency.probes) == [
        ("cosmos", "after"), ("cosmos", "before"), ("table", "after"), ("table", "before")]
    for probe in latency.probes:
        assert probe.nominal_ms == RTT_MS
        assert probe.added_ms > 0, probe  # through the relay, not around it


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_latency_mode_request_counts_are_exact(latency, backend):
    workload = build_payment_workload(events=LATENCY_SIZES.events, accounts=3,
                                      batch_size=LATENCY_SIZES.batch_size, seed=5,
                                      warmup_events=LATENCY_SIZES.warmup_events)
    events = [len(b) for b in workload.batches]
    accounts = [len(workload.accounts_in(b)) for b in workload.batches]
    last_events, last_accounts = events[-1], accounts[-1]

    def result(name):
        found = latency.result(RTT_MS, 3, backend, name)
        assert found is not None, name
        assert found.batch_events == events and found.batch_accounts == accounts
        assert found.meta_requests == 0
        assert found.balance_mismatches == 0 and found.balances_checked == 3
        # A request the SDK sent again after a transport failure (a keep-alive connection the
        # server closed) is counted, and reported apart; the shapes below are first attempts.
        assert sum(found.batch_retried) == found.retried_calls
        first = [n - again for n, again in zip(found.batch_requests, found.batch_retried,
                                                strict=True)]
        return found, first

    # mark read + (balance read + marker/balance transaction) per event + mark write
    per_event, first = result("per-event")
    assert first == [2 + 2 * n for n in events]
    assert per_event.replay_requests == 1
    sequential, first = result("no-dedup-seq")  # balance read + write per event; replay: again
    assert first == [2 * n for n in events]
    assert sequential.replay_requests == 2 * last_events
    limit, first = result("no-dedup-grouped")  # one read + one write per account per batch
    assert first == [2 * a for a in accounts]
    assert limit.replay_requests == 2 * last_accounts
    # Remembered etags, no dedup: one balance write per account + the mark write, no reads
    # (accounts are new, so created); after a restart nothing is remembered, so each write of
    # the replay is a create that finds the item (409), a read and the replace: 3 per item.
    remembered, first = result("no-dedup-etags")
    assert first == [a + 1 for a in accounts]
    assert remembered.replay_requests - remembered.replay_retried == 3 * (last_accounts + 1)
    # The app (async, and the sync service): one transaction per account + the mark write, plus
    # a read of the mark on the partition's first batch and of each balance it did not write
    # yet (the instance remembers both); after a restart, a replayed batch reads the mark only.
    seen: set[str] = set()
    grouped = []
    for index, batch in enumerate(workload.batches):
        present = workload.accounts_in(batch)
        grouped.append((index == 0) + len(present - seen) + len(present) + 1)
        seen |= present
    for name in ("app", "app-sync"):
        app, first = result(name)
        assert first == grouped, (name, first)
        assert app.replay_requests - app.replay_retried == 1
    assert app_shape(latency) == "grouped"
    cold, first = result("app-cold")  # nothing remembered: the mark and every balance read
    assert first == [2 + 2 * a for a in accounts]
    assert cold.replay_requests - cold.replay_retried == 1


def test_latency_mode_report_and_outputs(latency, tmp_path):
    assert [r.events for r in rows_latency(latency)] == [LATENCY_SIZES.events] * 14
    written = write_latency_outputs(latency, tmp_path)
    text = written["markdown"].read_text()
    assert text == latency_markdown(latency)
    assert "| Backend | Accounts | RTT ms (measured) |" in text
    assert json.loads(written["json"].read_text())["probes"]
    assert "Request hash CPU per event" in text
    assert json.loads(written["json"].read_text())["hash_cost"]["events"] == LATENCY_SIZES.events
    replay = {(t.text, t.backend): t.met for t in latency_targets(latency) if "replayed" in t.text}
    assert replay and all(replay.values())
    # Issue 20's targets are reported for each backend against the remembered-etags variant.
    etags = [t for t in latency_targets(latency) if "remembered-etags" in t.text]
    assert sorted({t.backend for t in etags}) == ["cosmos", "table"] and len(etags) == 4
    assert "| No dedup, remembered etags, ev/s |" in text


def test_an_rtt_that_did_not_show_up_in_point_reads_stops_the_run():
    check_probes([Probe("cosmos", 5.0, direct_ms=1.2, relayed_ms=4.0, reads=5)])  # 2.8 ms: fine
    with pytest.raises(RttNotVerifiedError, match="endpoint discovery"):
        check_probes([Probe("cosmos", 5.0, direct_ms=1.2, relayed_ms=1.3, reads=5)])


def test_hash_cost_times_both_forms_over_the_workloads_payment_contents():
    contents = payment_contents(events=40, seed=3)
    assert len(contents) == 40 and set(contents[0]) == {"type", "accountId", "amountCents"}
    cost = measure(contents, rounds=3)
    assert (cost.events, cost.rounds) == (40, 3)
    assert 0 < cost.new_us <= cost.new_median_us and 0 < cost.old_us <= cost.old_median_us
    assert f"{cost.new_us:.2f} µs canonical" in cost.note()
    with pytest.raises(ValueError, match="no payloads"):
        measure([])


# -- cost table (issue 20): the formulas the README's figures come from ------------------------
def test_cost_formulas_follow_the_published_figures():
    from benchmarks.cost import RU_WRITE_1KB_DEFAULT, table_entity_bytes, write_ru

    # default policy: the published 1 KB write charge; a point policy can only be cheaper
    assert write_ru(600, properties=15, indexed=None) == (RU_WRITE_1KB_DEFAULT, RU_WRITE_1KB_DEFAULT)
    low, high = write_ru(600, properties=15, indexed=4)
    assert low < high < RU_WRITE_1KB_DEFAULT
    assert write_ru(1536, properties=15, indexed=None)[0] > RU_WRITE_1KB_DEFAULT
    # 4 + 2*1 + 2*1 + (8 + 2*1 + 2*2+4) + (8 + 2*1 + 8)
    assert table_entity_bytes({"PartitionKey": "p", "RowKey": "r", "s": "ab", "f": 1.5}) == 8 + 18 + 18
