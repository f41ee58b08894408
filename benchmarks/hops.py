"""Hops: how far one message travels through the project's own code before it reaches a store.

    .venv/bin/python -m benchmarks.hops                        # both paths, both backends
    .venv/bin/python -m benchmarks.hops --save hops.json       # also keep the figures
    .venv/bin/python -m benchmarks.hops --before old.json      # print "before -> after"
    .venv/bin/python -m benchmarks.hops --chains               # also each path's deepest chain

What runs: the registered functions themselves (`function_app`'s indexed functions), called
as the worker calls them, on services built as the Functions host builds them
(`functions.services.build_services` from settings: the real sync stores and, for the async
`payments`, the real async stores), reached through `functions.services.use_services`, on
Azurite and the local Cosmos server (started here; `local_stack`). Only the Service Bus
client behind the outbox dispatchers is a stand-in that keeps what it is given: there is no
broker here. Two paths, each on the `cosmos` and the `table` backend:

* **order**: `orders` (Service Bus, sync) is handed a new order, then the same message again
  (delivery count 2): the first commits, the second is a duplicate.
* **batch**: `payments` (Event Hubs, async, one event loop) is handed one partition's batch
  of `--events` CloudEvents over `--accounts` accounts, then the same batch again (a replay
  after a lost checkpoint).

Before either is traced, one order and one batch (on another partition, other accounts) run
untraced on the same services, so client set-up (the Cosmos account read, container
properties, connection pools) is not counted; the traced partition's mark and the traced
accounts are still unknown to the instance, as for a partition it has just taken over.

What is counted (`sys.monitoring`, all threads, while a traced function runs). A *project
function* is a `def`, `async def` or `lambda` in `shared/`, `domain/`, `functions/` or
`function_app.py` (not the SDKs, the harness or tests; generator expressions count as part of
the function they sit in). A *call* is a project function's frame starting: a generator or
coroutine resumed is not a new call. A *store request* is an outermost run of the
azure-core HTTP pipeline (`Pipeline.run`, `AsyncPipeline.run`): one request on the wire to
Cosmos DB or Table Storage (the SDK's own retries inside it included). The *chain* of a store
request is the project frames on the stack when it starts, from the registered function (the
entry) down to the innermost one (where project code hands over to an SDK call); a task that
asyncio starts (`gather`, `create_task`) continues the chain of the frame that created it.
Per path (its two invocations together) and backend:

* Files: project files with at least one function called.
* Functions: distinct project functions called.
* Deepest chain: the most frames on one store request's chain (entry and hand-over included;
  a function on it twice, as a flow driven inside another flow, counts twice).
* On chains: distinct project functions that lie on at least one store request's chain.
* Calls: project function calls in all.
* Requests: store requests in all.

The figures are deterministic for a given tree, apart from a retry that a real conflict or
outage would cause (none is expected on a quiet local stack). `--save` writes them as JSON and
`--before` reads such a file from another tree (e.g. an older commit) to print each figure as
"before -> after".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PROJECT_DIRS = ("shared", "domain", "functions")
PROJECT_FILES = ("function_app.py",)
#: Code objects in project files that are parts of a function, not functions.
NOT_FUNCTIONS = frozenset({"<module>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"})
BACKENDS = ("cosmos", "table")
PATHS = ("order", "batch")
ENTRIES = {"order": "orders", "batch": "payments"}
FIGURES = (("files", "Files"), ("functions", "Functions"),
           ("deepest", "Deepest chain to a store request"),
           ("on_chains", "Functions on store-request chains"),
           ("calls", "Project-frame calls"), ("requests", "Store requests"))


class Function(NamedTuple):
    """A project function: its file (relative to the repository), qualified name, first line."""

    path: str
    name: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.name}"


@dataclass
class Request:
    """One store request: its chain of project functions (entry first) and the SDK callable
    the innermost of them called."""

    chain: tuple[Function, ...]
    sdk_call: str


@dataclass
class Trace:
    """What the tracer saw while active: calls per function, store requests, and per step
    (one traced invocation) its label, calls and requests."""

    calls: Counter[Function] = field(default_factory=Counter[Function])
    requests: list[Request] = field(default_factory=list[Request])
    steps: list[tuple[str, int, int]] = field(default_factory=list[tuple[str, int, int]])


@dataclass(frozen=True)
class Figures:
    files: int
    functions: int
    deepest: int
    on_chains: int
    calls: int
    requests: int


class Tracer:
    """Counts project function calls and the chains of store requests with `sys.monitoring`
    (PY_START only; every other code object is switched off at its first start)."""

    def __init__(self, root: Path = ROOT) -> None:
        from azure.core.pipeline import AsyncPipeline, Pipeline

        self._root = str(root) + os.sep
        self._pipeline = frozenset({Pipeline.run.__code__, AsyncPipeline.run.__code__})
        self._files: dict[str, str | None] = {}  # co_filename -> project path, or None
        self._origins: weakref.WeakKeyDictionary[asyncio.Task[Any], tuple[Function, ...]] = (
            weakref.WeakKeyDictionary())
        self.trace = Trace()
        self._tool: int | None = None

    # -- classification ---------------------------------------------------------------------
    def _project_path(self, code: CodeType) -> str | None:
        filename = code.co_filename
        if filename not in self._files:
            path: str | None = None
            if filename.startswith(self._root):
                relative = filename[len(self._root):].replace(os.sep, "/")
                if relative.split("/", 1)[0] in PROJECT_DIRS or relative in PROJECT_FILES:
                    path = relative
            self._files[filename] = path
        return self._files[filename]

    def _function(self, code: CodeType) -> Function | None:
        path = self._project_path(code)
        if path is None or code.co_name in NOT_FUNCTIONS:
            return None
        return Function(path, code.co_qualname, code.co_firstlineno)

    # -- chains ---------------------------------------------------------------------------------
    def _chain(self, frame: FrameType | None) -> tuple[tuple[Function, ...], FrameType | None]:
        """The chain ending at `frame` (entry first), with the origin of the running task, and
        the frame the innermost project function called (None when `frame` is one)."""
        inner: list[Function] = []
        called: FrameType | None = None
        outside: list[FrameType] = []  # the frames below the innermost project function
        while frame is not None:
            code = frame.f_code
            if self._project_path(code) is None:
                if not inner:
                    outside.append(frame)
            elif (function := self._function(code)) is not None:
                if not inner:
                    # what it called, seen through azure-core's tracing decorators
                    called = next((f for f in reversed(outside) if not f.f_globals.get(
                        "__name__", "").startswith("azure.core.tracing")), None)
                inner.append(function)
            frame = frame.f_back
        inner.reverse()
        return self._task_origin() + tuple(inner), called

    def _task_origin(self) -> tuple[Function, ...]:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no event loop runs in this thread
            return ()
        return self._origins.get(task, ()) if task is not None else ()

    def link_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have each task `loop` starts continue the chain of the frame that created it."""

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            task = asyncio.Task(coro, loop=loop, **kwargs)
            self._origins[task] = self._chain(sys._getframe(1))[0]
            return task

        loop.set_task_factory(factory)

    # -- monitoring -----------------------------------------------------------------------------
    def _started(self, code: CodeType, offset: int) -> Any:
        if code in self._pipeline:
            frame = sys._getframe(1)
            caller = frame.f_back
            while caller is not None:  # a pipeline run inside another is part of that request
                if caller.f_code in self._pipeline:
                    return None
                caller = caller.f_back
            chain, called = self._chain(frame)
            self.trace.requests.append(Request(chain, _describe(called or frame)))
            return None
        function = self._function(code)
        if function is None:
            return sys.monitoring.DISABLE
        self.trace.calls[function] += 1
        return None

    @contextlib.contextmanager
    def active(self, label: str) -> Iterator[None]:
        """Trace what runs inside the block (one invocation, recorded as a step)."""
        monitoring = sys.monitoring
        tool = next(t for t in (monitoring.PROFILER_ID, 3, 4, 5) if monitoring.get_tool(t) is None)
        monitoring.use_tool_id(tool, "benchmarks.hops")
        calls, requests = self.trace.calls.total(), len(self.trace.requests)
        monitoring.register_callback(tool, monitoring.events.PY_START, self._started)
        monitoring.set_events(tool, monitoring.events.PY_START)
        try:
            yield
        finally:
            monitoring.set_events(tool, 0)
            monitoring.register_callback(tool, monitoring.events.PY_START, None)
            monitoring.free_tool_id(tool)
            monitoring.restart_events()  # what this tool switched off, on again for the next
            self.trace.steps.append((label, self.trace.calls.total() - calls,
                                     len(self.trace.requests) - requests))


def _describe(frame: FrameType) -> str:
    module = frame.f_globals.get("__name__", "?")
    return f"{module}:{frame.f_code.co_qualname}"


def figures(trace: Trace, entry: str) -> Figures:
    """The figures of a path's trace; every store request's chain must begin at `entry`
    (`path:name` of the registered function), or a hop was lost and the figures would lie."""
    for request in trace.requests:
        if not request.chain or str(request.chain[0]) != entry:
            head = str(request.chain[0]) if request.chain else "nothing"
            raise RuntimeError(f"a store request's chain begins at {head}, not {entry} "
                               f"(a thread or task the tracer does not link?)")
    on_chains = {function for request in trace.requests for function in request.chain}
    return Figures(files=len({function.path for function in trace.calls}),
                   functions=len(trace.calls),
                   deepest=max((len(r.chain) for r in trace.requests), default=0),
                   on_chains=len(on_chains), calls=trace.calls.total(),
                   requests=len(trace.requests))


def deepest(trace: Trace) -> Request | None:
    return max(trace.requests, key=lambda r: len(r.chain), default=None)


# -- the paths ----------------------------------------------------------------------------------
class _RecordingSender:
    """A Service Bus sender's surface (sends, close, `with`), keeping what it is given."""

    def __init__(self, sent: list[Any]) -> None:
        self._sent = sent

    def __enter__(self) -> _RecordingSender:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def send_messages(self, messages: list[Any]) -> None:
        self._sent.extend(messages)

    def close(self) -> None:
        pass


class RecordingServiceBusClient:
    """The azure-servicebus client surface the sync dispatcher uses, keeping what it sends."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def get_topic_sender(self, topic_name: str) -> Any:
        return _RecordingSender(self.sent)

    def get_queue_sender(self, queue_name: str) -> Any:
        return _RecordingSender(self.sent)

    def close(self) -> None:
        pass


class _AsyncRecordingSender:
    """The same for `azure.servicebus.aio` (sends, close and `async with` awaited)."""

    def __init__(self, sent: list[Any]) -> None:
        self._sent = sent

    async def __aenter__(self) -> _AsyncRecordingSender:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def send_messages(self, messages: list[Any]) -> None:
        self._sent.extend(messages)

    async def close(self) -> None:
        pass


class AsyncRecordingServiceBusClient:
    """The azure-servicebus aio client surface the async dispatcher uses (sends and closes
    awaited), keeping what it sends."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def get_topic_sender(self, topic_name: str) -> Any:
        return _AsyncRecordingSender(self.sent)

    def get_queue_sender(self, queue_name: str) -> Any:
        return _AsyncRecordingSender(self.sent)

    async def close(self) -> None:
        pass


_LETTERS = str.maketrans("0123456789abcdef", "ghijklmnopqrstuv")


def unique() -> str:
    """A fresh name of letters only: a random hex id inside a payload can look like a number
    ("7e-1") to the request hash's float check, and the path would vary from run to run."""
    return uuid.uuid4().hex[:10].translate(_LETTERS)


def app_settings() -> dict[str, str]:
    """The committed sample settings (what `function_app` validates on import)."""
    sample = json.loads((ROOT / "local.settings.sample.json").read_text())
    return {name: value for name, value in sample["Values"].items() if value}


def settings_env(endpoints: dict[str, str], backend: str) -> dict[str, str]:
    """App settings for `backend` on the local stack (`LocalStack.environment()`), with a hub
    name of its own so marks never meet another run's."""
    return {**app_settings(), **endpoints, "DEDUP_BACKEND": backend,
            "COSMOS_DATABASE": "hops", "PAYMENTS_HUB_NAME": f"hops-{unique()}"}


def build(env: dict[str, str], *, clock: Callable[[], float] = time.time,
          sent: AsyncRecordingServiceBusClient | None = None) -> Any:
    """The services as the host builds them from settings, on `clock`; the dispatchers'
    Service Bus clients are the recording stand-ins (`sent`: the async one, given)."""
    from functions.services import build_services
    from functions.settings import Settings
    from shared._backends import dispatch, dispatch_aio

    settings = Settings.from_env(env)
    topics = [settings.notifications_topic]
    return build_services(
        settings,
        dispatcher=dispatch.ServiceBusDispatcher.from_client(RecordingServiceBusClient(),
                                                             topics=topics),
        async_dispatcher=dispatch_aio.ServiceBusDispatcher.from_client(
            sent or AsyncRecordingServiceBusClient(), topics=topics), clock=clock)


def installed(services: Any) -> contextlib.AbstractContextManager[Any]:
    """The functions invoked inside run on `services`."""
    from functions.services import use_services

    return use_services(services)


def user_function(name: str) -> Callable[..., Any]:
    """The registered function `name`, as the worker indexes it."""
    from simulator.host_inputs import indexed_functions

    for function in indexed_functions():
        if function.get_function_name() == name:
            return function.get_user_function()
    raise KeyError(name)


def _entry(path: str) -> str:
    return f"functions/{ENTRIES[path]}.py:{ENTRIES[path]}"


def order_message(order_id: str, delivery_count: int, *, correlation_id: str = "hops") -> Any:
    """A two-line order as the worker hands it to `orders` (its own converter builds it)."""
    from simulator.host_inputs import SentMessage, service_bus_message

    body = {"orderId": order_id, "customerId": "C-1", "currency": "EUR",
            "lines": [{"sku": f"SKU-{n}", "quantity": 2, "unitPrice": 9.5} for n in range(2)]}
    return service_bus_message(SentMessage(json.dumps(body).encode(), message_id=order_id,
                                           correlation_id=correlation_id),
                               delivery_count=delivery_count)


def trace_order(services: Any, tracer: Tracer) -> None:
    """A warm-up order untraced, then a new order and its duplicate traced, on one event loop
    (the function is `async def`; its async clients keep to the loop of their first request)."""
    from simulator.host_inputs import RecordingActions

    orders = user_function("orders")

    async def deliver(order_id: str, delivery_count: int, *, traced: bool = True) -> None:
        message = order_message(order_id, delivery_count)
        actions = RecordingActions()
        with tracer.active(f"order, delivery {delivery_count}") if traced else contextlib.nullcontext():
            await orders(message=message, message_actions=actions)
        action = actions.last[0]
        if action != "complete":
            raise RuntimeError(f"order {order_id} delivery {delivery_count} was settled {actions.last}")

    with installed(services), asyncio.Runner() as runner:
        tracer.link_tasks(runner.get_loop())
        runner.run(deliver(f"ORD-warm-{unique()}", 1, traced=False))
        order_id = f"ORD-{unique()}"
        runner.run(deliver(order_id, 1))
        runner.run(deliver(order_id, 2))
        runner.run(services.aclose())


def trace_batch(services: Any, tracer: Tracer, *, events: int, accounts: int) -> None:
    """A warm-up batch untraced (another partition), then a batch and its replay traced, all
    on one event loop (the async clients keep to the loop of their first request)."""
    from simulator.host_inputs import SentEvent, event_hub_batch

    payments = user_function("payments")
    run = unique()

    def batch(partition: str) -> list[Any]:
        names = [f"acct-{partition}-{n}" for n in range(accounts)]
        sent = [SentEvent(json.dumps({
            "specversion": "1.0", "id": f"{partition}-{n}", "source": "/hops", "type": "payment.credit",
            "data": {"accountId": names[n % accounts], "amountCents": 100 + n}}).encode(), n + 1)
            for n in range(events)]
        return event_hub_batch(sent, partition_id=partition)

    async def invoke(partition: str, label: str | None) -> None:
        with tracer.active(label) if label else contextlib.nullcontext():
            await payments(events=batch(partition))

    with installed(services), asyncio.Runner() as runner:
        tracer.link_tasks(runner.get_loop())
        runner.run(invoke(f"warm{run}", None))
        runner.run(invoke(run, "batch"))
        runner.run(invoke(run, "replay"))
        runner.run(services.aclose())


def measure(endpoints: dict[str, str], *, backends: tuple[str, ...] = BACKENDS,
            paths: tuple[str, ...] = PATHS, events: int = 10, accounts: int = 3
            ) -> dict[tuple[str, str], Trace]:
    """The trace of each (path, backend); `endpoints` are `LocalStack.environment()`'s."""
    for name, value in app_settings().items():  # `function_app` validates these on import
        os.environ.setdefault(name, value)
    traces: dict[tuple[str, str], Trace] = {}
    for backend in backends:
        for path in paths:
            services = build(settings_env(endpoints, backend))
            tracer = Tracer()
            if path == "order":
                trace_order(services, tracer)
            else:
                trace_batch(services, tracer, events=events, accounts=accounts)
            traces[path, backend] = tracer.trace
    return traces


# -- the report ---------------------------------------------------------------------------------
def markdown(after: dict[str, Figures], before: dict[str, Figures] | None = None) -> str:
    """One row per "path/backend"; each cell "before -> after" when `before` has the row."""
    lines = ["| Path | Backend | " + " | ".join(title for _, title in FIGURES) + " |",
             "|---|---|" + "---:|" * len(FIGURES)]
    for row, figs in after.items():
        path, backend = row.split("/")
        old = (before or {}).get(row)
        cells = [f"{getattr(old, name)} -> {getattr(figs, name)}" if old else str(getattr(figs, name))
                 for name, _ in FIGURES]
        lines.append(f"| {path} | {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(traces: dict[tuple[str, str], Trace]) -> str:
    """Per path and backend: calls and requests by step, the files, and the deepest chain."""
    out: list[str] = []
    for (path, backend), trace in traces.items():
        steps = "; ".join(f"{label}: {calls} calls, {requests} requests"
                          for label, calls, requests in trace.steps)
        out.append(f"\n{path}/{backend}: {steps}")
        out.append("  files: " + ", ".join(sorted({function.path for function in trace.calls})))
        request = deepest(trace)
        if request is not None:
            out.extend(f"  {n:2}. {function}" for n, function in enumerate(request.chain, 1))
            out.append(f"      -> {request.sdk_call}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKENDS, action="append",
                        help="a backend (repeatable; default both)")
    parser.add_argument("--path", choices=PATHS, action="append",
                        help="a path (repeatable; default both)")
    parser.add_argument("--events", type=int, default=10, help="events in the batch (10)")
    parser.add_argument("--accounts", type=int, default=3, help="accounts they post to (3)")
    parser.add_argument("--save", type=Path, help="write the figures as JSON here")
    parser.add_argument("--before", type=Path, help="figures saved from another tree, shown first")
    parser.add_argument("--chains", action="store_true", help="print each deepest chain")
    args = parser.parse_args(argv)

    import urllib3

    from local_stack import LocalStack

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    with LocalStack() as stack:
        traces = measure(stack.environment(), backends=tuple(args.backend or BACKENDS),
                         paths=tuple(args.path or PATHS), events=args.events,
                         accounts=args.accounts)
    after = {f"{path}/{backend}": figures(trace, _entry(path))
             for (path, backend), trace in traces.items()}
    before = None
    if args.before:
        before = {row: Figures(**values) for row, values in json.loads(args.before.read_text()).items()}
    print(markdown(after, before))
    if args.chains:
        print(details(traces))
    if args.save:
        args.save.write_text(json.dumps({row: asdict(figs) for row, figs in after.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
