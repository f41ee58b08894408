"""The cost table's measured inputs, on the local servers: each path's store requests per
message are the exact counts the cost table (benchmarks/RESULTS.md) states, and every row carries
each column."""

from __future__ import annotations

import pytest

from benchmarks.cost import HEADERS, _measure, markdown, money_rows, telemetry_bytes

# path: (requests, reads) per message, on either backend
REQUESTS = {
    "orders": (2.0, 0.0),  # the commit with OrderAccepted; the dispatch recorded
    "duplicate (order)": (2.0, 1.0),  # the commit fails 409; the order read
    "notifications (two-phase)": (2.0, 0.0),  # create in progress; replace completed
    "payments (per event; batches of 100, 20 accounts)": (0.21, 0.0),  # 20 commits + 1 mark
    "HTTP (Idempotency-Key)": (5.0, 1.0),  # two-phase key around the ledger's posting
}


@pytest.mark.parametrize("backend", ["cosmos", "table"])
def test_each_path_costs_its_stated_requests(stack, backend):
    figures = _measure(backend, stack, 4, None)
    assert {f.path: (round(f.requests, 3), round(f.reads, 3)) for f in figures} == REQUESTS
    assert all(f.cpu_ms > 0 and f.marker_properties > 0 for f in figures)
    assert all(f.marker_bytes > 0 for f in figures if not f.path.startswith("duplicate"))
    rows = money_rows(figures)
    assert all(len(row) == len(HEADERS) for row in rows)
    assert [row[9] for row in rows] == [f"{telemetry_bytes(f.path) / 1000:.3f}" for f in figures]
    assert markdown(figures).count("\n") == len(figures) + 1


def test_telemetry_per_message_is_the_sampled_trace_plus_the_metric_share():
    assert telemetry_bytes("orders") == pytest.approx(4354 * 0.001 + 0.9)
    assert telemetry_bytes("payments (per event)") == pytest.approx((950 + 27_000 * 0.001) / 100 + 0.9)
