"""The Service Bus path's profile (benchmarks/profile_cpu.py --orders) at a tiny size, on
Azurite: every delivery goes through the registered `orders` function and is completed, and
the profile holds that function and the Table SDK beneath it; the `same-requests` baseline
sends the app's requests byte for byte with no library code, and a seeded difference stops it."""

from __future__ import annotations

import cProfile
import functools
import pstats

import pytest

from benchmarks.profile_cpu import (
    RequestsDiffer,
    check_same_requests,
    compare_orders,
    orders_lines,
    profile_orders,
    report,
)
from benchmarks.raw_orders import RawOrders
from tests.benchmarks.test_same_transactions import library_imports


def test_orders_are_profiled_through_the_registered_function(stack):
    profiler = cProfile.Profile()
    deliveries, cpu = profile_orders(stack.app_settings(), "table", 2, profiler)

    assert deliveries == 4 and cpu > 0  # two new orders, each redelivered
    files = {filename for filename, _line, _name in pstats.Stats(profiler).stats}  # type: ignore[attr-defined]  # pstats keeps its table here; typeshed omits it
    assert any(name.endswith("functions/orders.py") for name in files)
    assert any("azure/data/tables/aio" in name for name in files)  # the async SDK: as deployed
    table = report(pstats.Stats(profiler), deliveries, 5)
    assert "| project shared/ |" in table and "| azure.data.tables |" in table


def test_the_sync_path_runs_the_same_consumer_on_the_sync_sdk(stack):
    profiler = cProfile.Profile()
    deliveries, _ = profile_orders(stack.app_settings(), "table", 2, profiler, path="sync")

    assert deliveries == 4
    files = {filename for filename, _line, _name in pstats.Stats(profiler).stats}  # type: ignore[attr-defined]  # pstats keeps its table here; typeshed omits it
    assert not any(name.endswith("functions/orders.py") for name in files)
    assert any("domain/orders.py" in name for name in files)
    assert not any("azure/data/tables/aio" in name for name in files)


# -- the same-requests baseline: the app's requests, message and settlement, no library --------
def test_the_baseline_imports_no_library_code():
    assert library_imports("raw_orders") == (set(), "[]")


@pytest.mark.parametrize("backend", ["table", "cosmos"])
def test_the_baseline_sends_the_apps_requests_byte_for_byte(stack, backend):
    # a new order (its transaction, the clearing patch) and its redelivery (the read)
    assert check_same_requests(stack.app_settings(), backend) == 3


class _ClearsTheMessageOnly(RawOrders):
    """A seeded difference: the clearing merge leaves the pending-since time (Table)."""

    async def _clear(self, document_id: str, etag: str) -> None:
        from azure.core import MatchConditions
        from azure.data.tables import UpdateMode

        await self._table.update_entity(
            {"o0": "", "PartitionKey": document_id, "RowKey": document_id},
            mode=UpdateMode.MERGE, etag=etag, match_condition=MatchConditions.IfNotModified)


# seeded differences: a marker keyed under another consumer; a clearing merge that misses a field
@pytest.mark.parametrize("seeded", [functools.partial(RawOrders, consumer="orders-v2"),
                                    _ClearsTheMessageOnly])
def test_a_baseline_that_differs_from_the_app_stops_the_profile(stack, seeded):
    with pytest.raises(RequestsDiffer, match="request"):
        check_same_requests(stack.app_settings(), "table", raw_orders=seeded)


def test_the_baseline_path_is_profiled_without_the_library(stack):
    profiler = cProfile.Profile()
    deliveries, cpu = profile_orders(stack.app_settings(), "table", 2, profiler,
                                     path="same-requests")

    assert deliveries == 4 and cpu > 0
    files = {filename for filename, _line, _name in pstats.Stats(profiler).stats}  # type: ignore[attr-defined]  # pstats keeps its table here; typeshed omits it
    assert any(name.endswith("benchmarks/raw_orders.py") for name in files)
    assert not any("/shared/" in name or "/domain/" in name for name in files)
    assert any("azure/data/tables/aio" in name for name in files)


def test_the_comparison_interleaves_both_paths_and_reports_each_round(stack):
    figures = compare_orders(stack.app_settings(), "table", 2, rounds=2)
    assert len(figures) == 2 and all(function > 0 and raw > 0 for function, raw in figures)


def test_the_bound_is_met_only_when_every_round_is_within_it():
    assert orders_lines("cosmos", [(1.1, 1.0), (1.14, 1.0)])[-1].startswith("[met]")
    missed = orders_lines("cosmos", [(1.1, 1.0), (1.2, 1.0)])
    assert missed[-1].startswith("[MISSED]") and "1.10x, 1.20x" in missed[-1]
    assert missed[1] == ("orders / cosmos, round 2: function 1.200 ms, same-requests 1.000 ms "
                         "CPU per delivery: 1.20x")
