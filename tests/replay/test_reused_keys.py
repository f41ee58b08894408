"""`python -m replay reused-keys`: one dedup key recorded in two partitions, found on each backend.

A payments marker lives in its account's partition (the transaction that posts the payment
holds it), so a producer that reuses a CloudEvent source + id for a payment to another account
gets both payments applied: the two markers never meet. The check reads every record once and
reports such keys, with what reading them cost.
"""

from __future__ import annotations

import json

from replay.__main__ import parse_args, run
from replay.stores import scan_reused_keys
from shared._core.keys import store_safe_id


def command(tool, capsys, *argv: str) -> tuple[int, str]:
    code = run(tool, parse_args(list(argv)))
    return code, capsys.readouterr().out


def test_a_payment_id_reused_for_another_account_is_applied_twice_and_found(
        make_world, backend, capsys):
    w = make_world(backend)
    first = w.payment(1, amount=100, account=0)
    reused = w.payment(1, amount=250, account=1)  # the same source + id, another account
    assert reused.key == first.key
    w.process_payments([first, w.payment(2, amount=5, account=0)])
    w.process_payments([reused])
    assert (w.balance(0), w.balance(1)) == (105, 250)  # both applied: no conflict is possible
    tool = w.tool("simulator")

    code, out = command(tool, capsys, "reused-keys")
    assert code == 1
    accounts = [store_safe_id(w.account(0)), store_safe_id(w.account(1))]
    [line] = [line for line in out.splitlines() if "in 2 partitions" in line]
    assert line.lstrip().startswith("payments key ")
    assert accounts[0] in line and accounts[1] in line
    assert out.rstrip().endswith("1 key(s) recorded in more than one partition")
    cost = ("Cosmos DB container", "cross-partition query", " RU") if backend == "cosmos" else (
        "Table Storage table", "full table scan", "request(s) of up to 1,000 entities")
    assert any(line.startswith(cost[0]) and cost[1] in line and cost[2] in line
               for line in out.splitlines())

    code, out = command(tool, capsys, "reused-keys", "--json", "--consumer", "payments")
    assert code == 1
    scans = json.loads(out)
    [found] = [r for scan in scans for r in scan["reused"]]
    assert found["consumer"] == "payments"
    assert [p["partition"] for p in found["partitions"]] == accounts  # in the order written
    code, out = command(tool, capsys, "reused-keys", "--consumer", "orders")
    assert code == 0 and "0 key(s) recorded in more than one partition" in out


def test_the_scan_states_its_cost(make_world, backend):
    """Cosmos: a cross-partition query, charged in request units (summed from the service's
    x-ms-request-charge headers); Table: a full scan, one request per page of 1,000."""
    w = make_world(backend)
    w.process_payments([w.payment(n, amount=1, account=n % 3) for n in range(12)])
    scan = scan_reused_keys(w.services.stores["ledger"])
    assert scan.reused == []
    assert scan.records >= 12  # every payment's marker (and whatever else the ledger records)
    assert scan.requests >= 1
    if backend == "cosmos":
        assert scan.request_units is not None and scan.request_units > 0
        assert "cross-partition query" in scan.cost and "RU" in scan.cost
    else:
        assert scan.request_units is None
        assert scan.requests == 1  # 12 records: one page
        assert "full table scan" in scan.cost


def test_a_world_without_reuse_exits_0(make_world, backend, capsys):
    w = make_world(backend)
    w.process_payments([w.payment(1, amount=10, account=0), w.payment(2, amount=10, account=1)])
    w.send(w.order(1))
    w.drain()
    code, out = command(w.tool("simulator"), capsys, "reused-keys")
    assert code == 0
    assert "0 key(s) recorded in more than one partition" in out
