"""The services the functions a test invokes run on: set for the test's context
(`functions.services.use_services`) and undone after it, never the process's own."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from functions.services import Services, use_services


@contextlib.contextmanager
def installing() -> Iterator[Callable[[Services], Services]]:
    """Yields `install(services)`: until the block ends, the functions invoked from this
    context (and the tasks and worker threads it starts) run on the services last installed."""
    with contextlib.ExitStack() as stack:
        def install(services: Services) -> Services:
            return stack.enter_context(use_services(services))

        yield install


def carrying_context[T](fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, to be run on other threads (a pool's), each call in a copy of this context:
    a thread starts with an empty one, and would meet the process's services."""
    context = contextvars.copy_context()

    def run(*args: Any, **kwargs: Any) -> T:
        return context.copy().run(fn, *args, **kwargs)

    return run


def records(services: Services, role: str = "notifications") -> Any:
    """A sync Idempotency on the sync store of `role`, configured as the app's consumers are:
    to set up or read the records the (async) functions keep, from a sync test."""
    from shared import Idempotency

    deployed = services.notify.idempotency
    return Idempotency(services.stores[role], config=deployed.config, telemetry=deployed.telemetry,
                       dispatcher=services.dispatcher)
