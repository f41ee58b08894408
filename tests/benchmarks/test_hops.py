"""The hops tracer (benchmarks/hops.py) on the async Event Hubs path at a tiny size, on
Azurite: the figures are there, and every store request's chain runs from the registered
function (through the tasks the batch gathers) to a Table SDK call."""

from __future__ import annotations

from dataclasses import asdict

from benchmarks.hops import deepest, figures, measure


def test_the_batch_path_reaches_the_table_sdk_from_its_entry(stack):
    trace = measure(stack.app_settings(), backends=("table",), paths=("batch",), events=3,
                    accounts=2)["batch", "table"]

    # figures() refuses a store request whose chain does not begin at the entry
    result = figures(trace, "functions/payments.py:payments")
    assert all(value > 0 for value in asdict(result).values()), result
    assert result.files <= result.functions <= result.calls
    assert result.on_chains <= result.functions  # (a chain may pass a function twice: nested flows)
    # one mark read, a read and a commit per account, the mark moved; the replay reads nothing
    # (the instance remembers the mark it moved)
    assert [(label, requests) for label, _, requests in trace.steps] == [("batch", 6),
                                                                          ("replay", 0)]

    request = deepest(trace)
    assert request is not None and len(request.chain) == result.deepest
    assert str(request.chain[0]) == "functions/payments.py:payments"
    assert request.chain[-1].path.startswith("shared/_backends/")
    assert request.sdk_call.startswith("azure.data.tables"), request.sdk_call
    # a gathered account group's chain continues through the task that ran it
    assert any(len({f.path for f in r.chain}) > 2 and "domain/payments.py" in
               {f.path for f in r.chain} for r in trace.requests)
