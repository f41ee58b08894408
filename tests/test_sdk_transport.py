"""Store clients skip the per-request proxy lookup unless a proxy is configured."""

from __future__ import annotations

import pytest

from shared._backends.sdk_transport import async_transport, proxy_configured, sync_transport


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, False), ({"PATH": "/bin", "NO_PROXY": "localhost"}, False), ({"HTTPS_PROXY": ""}, False),
    ({"HTTPS_PROXY": "http://proxy:3128"}, True), ({"http_proxy": "http://p"}, True),
    ({"ALL_PROXY": "socks5://p"}, True)])
def test_a_proxy_counts_only_when_a_proxy_variable_is_set(environ, expected):
    assert proxy_configured(environ) is expected


def test_transports_follow_the_environment(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert async_transport()._use_env_settings is False
    assert sync_transport()._use_env_settings is False
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert async_transport()._use_env_settings is True  # a configured proxy keeps working
    assert sync_transport()._use_env_settings is True
    assert async_transport(use_env_settings=False)._use_env_settings is False  # caller's choice wins
