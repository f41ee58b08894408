"""Test-only access to the process-wide observability switch."""

from __future__ import annotations

from shared._core import observability


def reset() -> None:
    """Forget that export was configured, so a test can configure it again."""
    with observability._lock:
        observability._configured = False


def configured() -> bool:
    """True once export was configured in this process."""
    return observability._configured
