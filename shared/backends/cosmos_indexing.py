"""Cosmos DB indexing policies for containers that are used by point operations.

Markers, balances and business documents are read and written by id and partition
key, which needs no index at all; only the maintenance sweep (stale claims, expired
markers) and listing tools filter on properties. Cosmos's default policy indexes every
property of every item, so each write pays index RUs for fields nobody queries. A
container therefore excludes `/*` and includes exactly the paths its queries use.

The policy dicts are the REST / SDK shape (`create_container(indexing_policy=...)`),
which is also the ARM / Bicep `indexingPolicy` shape; infra templates are held to
them by a contract test.
"""
from __future__ import annotations

from typing import Any

from shared.core.codec import EXPIRES, LEASE, STATE, VERSION
from shared.core.outbox import PENDING_SINCE

# What `CosmosIdempotencyStore.iter_records` filters on (IS_DEFINED(c.iV): a marker; c.iS and
# c.iL: in progress, lease expiry; c.iX: expiry; shared.core.codec): the sweep's fields; and
# what `iter_pending` filters on (c.oT, present only while a marker carries outgoing messages,
# so the outbox sweep reads the index entries of pending markers only).
RECORD_QUERY_PATHS = tuple(f"/{name}/?" for name in (VERSION, STATE, LEASE, EXPIRES, PENDING_SINCE))


def point_indexing_policy(*paths: str) -> dict[str, Any]:
    """A consistent policy that indexes only `paths` (scalar paths such as `/a/?`).

    Why consistent and not `none`: queries on an unindexed container are refused
    or scan; the sweep must keep working, and consistent mode keeps its results
    current with the writes.
    """
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
    """The policy of a container that holds idempotency records (and documents beside them).

    Indexes the sweep's fields and the partition key property: listing one partition
    with a parameterised query (`c[@field] = @pk`) cannot be routed by the SDK, so it
    runs across partitions and filters on that property.
    """
    return point_indexing_policy(*RECORD_QUERY_PATHS, f"{partition_key_path.rstrip('/')}/?", *extra_paths)
