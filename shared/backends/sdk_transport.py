"""HTTP transports for the store SDK clients, without per-request environment lookups.

azure-core's transports default to `use_env_settings=True`: aiohttp then runs (per
request, on a thread of the executor) a scan of every environment variable for proxy
settings and a read of ~/.netrc, and requests scans the environment for proxies and
no_proxy rules. On a Functions host, with its hundreds of app settings in the
environment, that is client CPU on every store request for a proxy nobody set, and it
grows with the number of variables (figures: benchmarks/RESULTS.md).

So a transport reads proxies from the environment only when a proxy variable is set
when it is built; otherwise it skips the lookup. Public client option only
(`transport=`); everything else in the SDK's pipeline is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def proxy_configured(environ: Mapping[str, str] | None = None) -> bool:
    """True when any proxy variable (any case) is set and not empty."""
    env = os.environ if environ is None else environ
    return any(env.get(name) or env.get(name.upper()) for name in PROXY_VARIABLES)


def async_transport(**kwargs: Any) -> Any:
    """An aiohttp transport for one async client (each client owns and closes its own)."""
    from azure.core.pipeline.transport import AioHttpTransport

    kwargs.setdefault("use_env_settings", proxy_configured())
    return AioHttpTransport(**kwargs)


def sync_transport(**kwargs: Any) -> Any:
    """A requests transport for one sync client."""
    from azure.core.pipeline.transport import RequestsTransport

    kwargs.setdefault("use_env_settings", proxy_configured())
    return RequestsTransport(**kwargs)
