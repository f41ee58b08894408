"""The Service Bus path's profile (benchmarks/profile_cpu.py --orders) at a tiny size, on
Azurite: every delivery goes through the registered `orders` function and is completed, and
the profile holds that function and the Table SDK beneath it."""

from __future__ import annotations

import cProfile
import pstats

from benchmarks.profile_cpu import profile_orders, report


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
