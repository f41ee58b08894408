"""Cosmos DB indexing policies for containers used by point operations.

Point reads and writes need no index; only the sweeps and listing tools filter on properties.
Cosmos's default policy indexes every property, so each write pays index RUs for fields nobody
queries: a container excludes `/*` and includes exactly the paths its queries use. The dicts
are the SDK's `indexing_policy` shape, also Bicep's `indexingPolicy` (a test holds infra to it).
"""
from __future__ import annotations

from typing import Any

from shared._core.codec import EXPIRES, LEASE, STATE, VERSION
from shared._core.outbox import PENDING_SINCE

# What `CosmosIdempotencyStore.iter_records` (version, state, lease, expiry) and `iter_pending`
# (the pending time, present only while a marker carries outgoing messages) filter on.
RECORD_QUERY_PATHS = tuple(f"/{name}/?" for name in (VERSION, STATE, LEASE, EXPIRES, PENDING_SINCE))


def point_indexing_policy(*paths: str) -> dict[str, Any]:
    """A consistent policy that indexes only `paths` (scalar paths such as `/a/?`); not `none`,
    since the sweep's queries must keep working and see current results."""
    for path in paths:
        if not path.startswith("/") or not path.endswith("/?"):
            raise ValueError(f"indexed path {path!r} must look like /property/?")
    return {
        "indexingMode": "consistent",
        "automatic": True,
        "includedPaths": [{"path": path} for path in dict.fromkeys(paths)],
        "excludedPaths": [{"path": "/*"}],
    }


def record_indexing_policy(partition_key_path: str, *extra_paths: str) -> dict[str, Any]:
    """The policy of a container of idempotency records: the sweep's fields and the partition
    key property (listing a partition by `c[@field] = @pk` runs across partitions)."""
    return point_indexing_policy(*RECORD_QUERY_PATHS, f"{partition_key_path.rstrip('/')}/?", *extra_paths)
