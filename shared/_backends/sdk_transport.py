"""HTTP transports for the store SDK clients, without per-request environment lookups.

azure-core's transports default to `use_env_settings=True`, which scans every environment
variable for proxy settings (aiohttp also reads ~/.netrc) on every request: client CPU that
grows with a Functions host's many app settings, for a proxy nobody set. These transports
read proxies from the environment only when a proxy variable is set when they are built.
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
