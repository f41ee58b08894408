"""`./dev demo`'s workload options: the quick default, `--full`, and explicit counts (no servers;
what the scenarios do with them is the chaos tests' to prove)."""

from __future__ import annotations

import pytest

from demo.__main__ import WORKLOADS, parse_args, split_workload
from demo.worker import scenario_config


def test_the_default_is_the_quick_workload_split_across_both_backends(capsys):
    args = parse_args([])
    assert (args.messages, args.events, args.full) == (6_000, 6_000, False)
    assert split_workload(args) == ["table", "cosmos"]
    assert (args.messages, args.events) == (3_000, 3_000)  # each backend's share
    assert "6,000 Service Bus messages and 6,000 Event Hubs events in all" in capsys.readouterr().out
    config = scenario_config(args, "cosmos")
    assert (config.messages, config.events) == (3_000, 3_000)
    # Faults, duplicates and outages stay on in the quick run
    assert config.fault_rate > 0 and config.duplicate_rate > 0 and config.outages is None


def test_full_keeps_the_long_run():
    args = parse_args(["--full"])
    assert (args.messages, args.events) == (20_000, 20_000)
    split_workload(args)
    assert (args.messages, args.events) == (10_000, 10_000)


@pytest.mark.parametrize("size", [[], ["--full"]])
def test_explicit_counts_win_over_either_size(size):
    args = parse_args([*size, "--messages", "300", "--events", "40"])
    assert (args.messages, args.events) == (300, 40)


def test_every_size_names_the_same_inputs():
    """A new kind of input (another trigger's messages) is added to every size at once."""
    assert WORKLOADS["quick"].keys() == WORKLOADS["full"].keys()
    assert all(WORKLOADS["quick"][k] < WORKLOADS["full"][k] for k in WORKLOADS["quick"])
    for name in WORKLOADS["quick"]:
        assert getattr(parse_args([]), name) == WORKLOADS["quick"][name]
