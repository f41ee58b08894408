"""Drive the real Python worker (`azure-functions-runtime`) in-process, the way the host does.

In Azure, the Functions host talks to the Python worker over gRPC; for Python
3.13+ a thin proxy worker receives the host's messages and awaits the
library's handlers in `azure_functions_runtime.handle_event`, passing each
one an object with `.request` (the `StreamingMessage`) and `.properties`
(`{"protos": <generated message module>, "host": <host address>}`). This
module plays host and proxy: it sends worker init (which indexes the app),
functions metadata, one function load per function, then invocation
requests whose inputs are shaped as the host sends them (`local_stack.host_data`).
So indexing, annotation checks, binding conversion (including the Service Bus
SDK-type binding) and the `ServiceBusMessageActions` injection are the
worker's own code, not a model of it.

The worker keeps its state in module globals (one app per process), so
`WorkerHost.start()` returns one host per process. Its coroutines run on one
dedicated asyncio loop thread; any number of caller threads may invoke at
once (`asyncio.run_coroutine_threadsafe`), and the worker runs each sync
function on its own thread pool, as in Azure. The message contract is the
project's own subset (`local_stack/function_rpc.proto`), generated with
grpcio-tools into `.cache/function-rpc/` once per process.

Service Bus settlement goes over gRPC to `local_stack.settlement_server`,
whose address is put on the process's command line as the host would
(`--host`, `--port`, `--functions-grpc-max-message-length`); calls are routed
by lock token (`WorkerHost.settlements`).

An invocation runs in the context of the thread that called `invoke`: the
worker awaits an `async def` function in a task that copies it, and this
driver gives the worker a pool that runs each sync function in a copy of it,
as `asyncio.to_thread` does. So what a caller sets for the functions it
invokes (`functions.services.use_services`) reaches them on either path. In
Azure the host is another process and sets nothing there, so the functions
meet an empty context, as they do here when the caller sets none.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import importlib.util
import json
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from local_stack.host_data import (
    MODEL_BINDING_CONTENT_TYPE,
    MODEL_BINDING_VERSION,
    SERVICE_BUS_SOURCE,
    ReceivedQueueMessage,
    SentEvent,
    SentMessage,
    event_batch_metadata,
    json_text,
    queue_metadata,
    queue_text,
    service_bus_content,
    service_bus_metadata,
    system_metadata,
    timer_info,
)
from local_stack.settlement_server import SettleCallback, SettlementCall, SettlementServer

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path(__file__).resolve().parent / "function_rpc.proto"
CACHE = ROOT / ".cache" / "function-rpc"
HOST_VERSION = "4.1040.0"  # reported to the worker in WorkerInitRequest (informational)
GRPC_MAX_MESSAGE_LENGTH = 2_147_483_647  # the host's default
LOCAL_HOST_URL = "http://localhost:7071"
DEFAULT_TIMEOUT = 600.0  # host.json functionTimeout


class WorkerError(RuntimeError):
    """The worker answered a request with a failure, or the driver cannot run it."""


# -- the message contract ----------------------------------------------------------------
_protos: ModuleType | None = None
_protos_lock = threading.Lock()


def protos() -> ModuleType:
    """The generated message module (generated into the cache if missing; loaded once)."""
    global _protos
    with _protos_lock:
        if _protos is None:
            _protos = _load_protos()
        return _protos


def _load_protos() -> ModuleType:
    import google.protobuf
    import grpc_tools
    from grpc_tools import protoc

    source = PROTO.read_bytes()
    key = hashlib.sha256(source + grpc_tools.__file__.encode() + google.protobuf.__version__.encode())
    target = CACHE / key.hexdigest()[:16]
    module_file = target / "function_rpc_pb2.py"
    if not module_file.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = CACHE / f"staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        include = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
        code = protoc.main(["protoc", f"-I{PROTO.parent}", f"-I{include}",
                            f"--python_out={staging}", str(PROTO)])
        if code != 0:
            raise WorkerError(f"protoc failed ({code}) on {PROTO}")
        target.mkdir(exist_ok=True)
        os.replace(staging / "function_rpc_pb2.py", module_file)  # atomic: racing processes agree
        staging.rmdir()
    name = "local_stack._function_rpc_pb2"
    spec = importlib.util.spec_from_file_location(name, module_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def sample_settings(app_dir: str | Path) -> dict[str, str]:
    """The app settings of `local.settings.sample.json` (what `func start` would load)."""
    values = json.loads((Path(app_dir) / "local.settings.sample.json").read_text("utf-8"))["Values"]
    return {str(k): str(v) for k, v in values.items()}


# -- what the worker reports ---------------------------------------------------------------
@dataclass(frozen=True)
class Status:
    """A StatusResult: success, or the exception the worker reported."""

    status: str  # Success, Failure, Cancelled
    message: str | None = None
    stack_trace: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "Success"


@dataclass(frozen=True)
class RetryOptions:
    """The retry policy the worker reports in a function's metadata (seconds)."""

    strategy: str  # exponential_backoff | fixed_delay
    max_retry_count: int
    minimum_interval: float | None = None
    maximum_interval: float | None = None
    delay_interval: float | None = None

    def interval(self, attempt: int) -> float:
        """The host's wait before retry `attempt` (1-based)."""
        if self.strategy == "fixed_delay":
            return self.delay_interval or 0.0
        low, high = self.minimum_interval or 0.0, self.maximum_interval or float("inf")
        return min(high, low * 2 ** (attempt - 1))


@dataclass(frozen=True)
class Binding:
    """BindingInfo of one binding: type, direction (in/out/inout), data type."""

    type: str
    direction: str
    data_type: str


@dataclass(frozen=True)
class FunctionMetadata:
    """One function as the worker indexed it (RpcFunctionMetadata)."""

    name: str
    function_id: str
    directory: str
    script_file: str
    entry_point: str
    language: str
    raw_bindings: tuple[dict[str, Any], ...]
    bindings: dict[str, Binding]
    retry: RetryOptions | None
    properties: dict[str, str]

    @property
    def trigger(self) -> dict[str, Any]:
        """The raw trigger binding (type ends with `Trigger`)."""
        return next(b for b in self.raw_bindings if str(b.get("type", "")).endswith("Trigger"))


@dataclass(frozen=True)
class HttpResult:
    """The HTTP response a function returned."""

    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class InvocationResult:
    """An InvocationResponse, decoded."""

    function: str
    invocation_id: str
    result: Status
    return_value: Any = None
    output: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def exception(self) -> str | None:
        return self.result.message

    @property
    def http(self) -> HttpResult:
        if not isinstance(self.return_value, HttpResult):
            raise WorkerError(f"{self.function}: no HTTP response ({self.result})")
        return self.return_value


def _status(pb: Any) -> Status:
    name = type(pb).Status.Name(pb.status)
    if pb.HasField("exception"):
        return Status(name, pb.exception.message or None, pb.exception.stack_trace or None)
    return Status(name)


def _seconds(duration: Any) -> float:
    return duration.seconds + duration.nanos / 1e9


def _retry(pb: Any) -> RetryOptions | None:
    if not pb.HasField("retry_options"):
        return None
    options = pb.retry_options
    return RetryOptions(
        strategy=type(options).RetryStrategy.Name(options.retry_strategy),
        max_retry_count=options.max_retry_count,
        minimum_interval=_seconds(options.minimum_interval)
        if options.HasField("minimum_interval") else None,
        maximum_interval=_seconds(options.maximum_interval)
        if options.HasField("maximum_interval") else None,
        delay_interval=_seconds(options.delay_interval) if options.HasField("delay_interval") else None)


def _metadata(pb: Any) -> FunctionMetadata:
    info = protos().BindingInfo
    bindings = {name: Binding(b.type, info.Direction.Name(b.direction), info.DataType.Name(b.data_type))
                for name, b in pb.bindings.items()}
    return FunctionMetadata(
        name=pb.name, function_id=pb.function_id, directory=pb.directory,
        script_file=pb.script_file, entry_point=pb.entry_point, language=pb.language,
        raw_bindings=tuple(json.loads(raw) for raw in pb.raw_bindings), bindings=bindings,
        retry=_retry(pb), properties=dict(pb.properties))


def _python_value(td: Any) -> Any:
    """A TypedData the worker returned, as a Python value (RpcHttp as HttpResult)."""
    if td is None:
        return None
    kind = td.WhichOneof("data")
    if kind is None:
        return None
    if kind == "http":
        body = _python_value(td.http.body)
        raw = body if isinstance(body, bytes) else (b"" if body is None else
                                                     body.encode("utf-8") if isinstance(body, str)
                                                     else json_text(body).encode("utf-8"))
        return HttpResult(int(td.http.status_code or 200), dict(td.http.headers), raw)
    if kind == "json":
        return json.loads(td.json)
    if kind.startswith("collection_"):
        return list(getattr(getattr(td, kind), kind.removeprefix("collection_")))
    return getattr(td, kind)


# -- settlement routing --------------------------------------------------------------------
class SettlementRouter:
    """Hands each settlement call to whoever holds the delivery's lock token."""

    def __init__(self) -> None:
        self._routes: dict[str, SettleCallback] = {}
        self._lock = threading.Lock()
        self.default: SettleCallback | None = None

    @contextlib.contextmanager
    def route(self, lock_token: uuid.UUID | str, callback: SettleCallback) -> Iterator[None]:
        key = str(lock_token)
        with self._lock:
            self._routes[key] = callback
        try:
            yield
        finally:
            with self._lock:
                self._routes.pop(key, None)

    def __call__(self, call: SettlementCall) -> None:
        with self._lock:
            callback = self._routes.get(call.lock_token, self.default)
        if callback is None:
            raise LookupError(f"no delivery holds the lock {call.lock_token}")
        callback(call)


# -- the host ------------------------------------------------------------------------------
class ContextThreadPool(ThreadPoolExecutor):
    """The worker's pool for sync functions, running each call in a copy of the context
    that submitted it (the invocation's task, hence the caller of `invoke`)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


def _carry_context_to_the_pool() -> None:
    """Replace the pool `start_threadpool_executor` made (same size) by a `ContextThreadPool`.
    The runtime keeps it in a module global that its invocation handler reads per call."""
    from azure_functions_runtime.utils import threadpool

    started = threadpool._threadpool_executor  # the runtime's one pool (no public setter)
    if not isinstance(started, ThreadPoolExecutor):
        raise WorkerError("azure_functions_runtime no longer keeps its pool where this driver "
                          "looks (utils.threadpool._threadpool_executor)")
    threadpool._threadpool_executor = ContextThreadPool(max_workers=started._max_workers)
    started.shutdown(wait=False)


@dataclass
class _WorkerRequest:
    """What the proxy worker awaits each handler with."""

    name: str
    request: Any
    properties: dict[str, Any]


class WorkerHost:
    """The real worker with the app loaded, plus the host-side settlement service.

        host = WorkerHost.start(app_dir, sample_settings(app_dir))
        host.metadata()["orders"].trigger
        host.invoke_service_bus("orders", SentMessage(b"..."), settle=calls.append)
    """

    _instance: WorkerHost | None = None
    _start_lock = threading.Lock()

    @classmethod
    def start(cls, app_dir: str | Path, settings: Mapping[str, str], *,
              timeout: float = 120.0) -> WorkerHost:
        """The process's worker host, started on first call (one app per process)."""
        app = str(Path(app_dir).resolve())
        env = {str(k): str(v) for k, v in settings.items()}
        with cls._start_lock:
            if cls._instance is not None:
                if cls._instance.app_dir != app or cls._instance.settings != env:
                    raise WorkerError(
                        "the worker keeps one app per process: already started for "
                        f"{cls._instance.app_dir} with other settings")
                return cls._instance
            host = cls(app, env, timeout)
            try:
                host._boot()
            except BaseException:
                host._shutdown_loop()
                host.settlement_server.stop()
                raise
            cls._instance = host
            return host

    @classmethod
    def running(cls) -> WorkerHost | None:
        return cls._instance

    def __init__(self, app_dir: str, settings: dict[str, str], timeout: float) -> None:
        self.app_dir = app_dir
        self.settings = settings
        self.timeout = timeout
        self.protos = protos()
        self.settlements = SettlementRouter()
        self.settlement_server = SettlementServer(self.settlements)
        self.init: Status | None = None
        self.capabilities: dict[str, str] = {}
        self.worker_metadata: dict[str, str] = {}
        self.loads: dict[str, Status] = {}
        self._metadata: dict[str, FunctionMetadata] = {}
        self._metadata_pb: dict[str, Any] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="worker-loop",
                                        daemon=True)

    # -- boot: init, metadata, load --------------------------------------------------------
    def _boot(self) -> None:
        from azure_functions_runtime import handle_event, start_threadpool_executor

        os.environ.update(self.settings)  # the host gives the worker its app settings as env
        self.settlement_server.start()
        self._point_settlement_client_here()
        if self.app_dir not in sys.path:
            sys.path.insert(0, self.app_dir)
        self._thread.start()
        start_threadpool_executor()  # the worker's pool for sync functions (as the proxy starts it)
        _carry_context_to_the_pool()
        pb = self.protos
        with self._fresh_app_module():
            response = self._send(handle_event.worker_init_request, "WorkerInitRequest",
                                  worker_init_request=pb.WorkerInitRequest(
                                      host_version=HOST_VERSION, function_app_directory=self.app_dir,
                                      worker_directory=str(Path(handle_event.__file__).parent)))
        self.init = _status(response.result)
        self.capabilities = dict(response.capabilities)
        self.worker_metadata = {
            "runtime_name": response.worker_metadata.runtime_name,
            "runtime_version": response.worker_metadata.runtime_version,
            "worker_version": response.worker_metadata.worker_version}
        if not self.init.ok:
            raise WorkerInitError(self.init)
        metadata = self._send(handle_event.functions_metadata_request, "FunctionsMetadataRequest",
                              functions_metadata_request=pb.FunctionsMetadataRequest(
                                  function_app_directory=self.app_dir))
        if not _status(metadata.result).ok:
            raise WorkerError(f"functions metadata failed: {_status(metadata.result)}")
        for item in metadata.function_metadata_results:
            self._metadata_pb[item.name] = item
            self._metadata[item.name] = _metadata(item)
        for name, item in self._metadata_pb.items():
            loaded = self._send(handle_event.function_load_request, "FunctionLoadRequest",
                                function_load_request=pb.FunctionLoadRequest(
                                    function_id=item.function_id, metadata=item))
            self.loads[name] = _status(loaded.result)
            if not self.loads[name].ok:
                raise WorkerError(f"{name}: load failed: {self.loads[name]}")

    def _point_settlement_client_here(self) -> None:
        """Put the settlement service's address where ServiceBusMessageActions reads it: the
        process's command line (the last `--host`/`--port` wins; a process spawned from one
        that ran a worker inherits that one's arguments)."""
        from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions
        from azurefunctions.extensions.bindings.servicebus.grpc_utils import (
            ArgumentError,
            get_grpc_uri,
            parse_grpc_args,
        )

        address = self.settlement_server.address
        existing = ServiceBusMessageActions._instance  # private: a sanity check only
        if existing is not None and existing._uri != address:
            raise WorkerError("ServiceBusMessageActions already talks to another host")
        try:
            current = get_grpc_uri(parse_grpc_args())
        except ArgumentError:
            current = None
        if current != address:
            sys.argv += ["--host", self.settlement_server.host, "--port",
                         str(self.settlement_server.port),
                         "--functions-grpc-max-message-length", str(GRPC_MAX_MESSAGE_LENGTH)]
        if get_grpc_uri(parse_grpc_args()) != address:
            raise WorkerError(f"cannot point the settlement client at {address}")

    @contextlib.contextmanager
    def _fresh_app_module(self) -> Iterator[None]:
        """Index as a new worker process would: the script module imported afresh.

        `FunctionApp.get_functions()` can index an app object once, so the worker
        gets its own import of the app module; whatever this process had under that
        name before (tests, tools) is put back afterwards, or the name is left
        unbound again, so a later `import function_app` elsewhere indexes its own copy.
        """
        script = self.settings.get("PYTHON_SCRIPT_FILE_NAME", "function_app.py")
        name = Path(script).stem
        previous = sys.modules.pop(name, None)
        try:
            yield
        finally:
            if previous is not None:
                sys.modules[name] = previous
            else:
                sys.modules.pop(name, None)

    def _properties(self) -> dict[str, Any]:
        return {"protos": self.protos, "host": self.settlement_server.host}

    def _send(self, handler: Callable[[Any], Any], name: str, *, timeout: float | None = None,
              **content: Any) -> Any:
        message = self.protos.StreamingMessage(request_id=uuid.uuid4().hex, **content)
        future = asyncio.run_coroutine_threadsafe(
            handler(_WorkerRequest(name, message, self._properties())), self._loop)
        return future.result(timeout=self.timeout if timeout is None else timeout)

    def run(self, coroutine: Any, *, timeout: float | None = None) -> Any:
        """Run a coroutine on the worker's event loop, where the app's `async def` functions
        run (async SDK clients belong to the loop that used them: close them here)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=self.timeout if timeout is None else timeout)

    def _shutdown_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    # -- what the host knows -------------------------------------------------------------
    def metadata(self) -> dict[str, FunctionMetadata]:
        """Every function the worker indexed, by name."""
        return dict(self._metadata)

    def resolve(self, value: str) -> str:
        """A binding expression such as `%ORDERS_QUEUE_NAME%`, from the app settings."""
        if value.startswith("%") and value.endswith("%"):
            return self.settings[value[1:-1]]
        return value

    @staticmethod
    def current_invocation_id() -> str | None:
        """Inside a function (the worker's pool thread): the invocation being run."""
        from azure_functions_runtime import invocation_id_cv

        return invocation_id_cv.get()

    # -- invocations ---------------------------------------------------------------------
    def _typed(self, value: Any) -> Any:
        """A trigger metadata value as the host's RPC conversion sends it: string, bytes,
        double, a string array as collection_string (empty entries dropped), a long array
        as collection_sint64, anything else (ints, bools, dates, objects) as JSON."""
        pb = self.protos
        if isinstance(value, str):
            return pb.TypedData(string=value)
        if isinstance(value, bytes):
            return pb.TypedData(bytes=value)
        if isinstance(value, float):
            return pb.TypedData(double=value)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return pb.TypedData(collection_string=pb.CollectionString(string=[v for v in value if v]))
        if (isinstance(value, list) and value
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            return pb.TypedData(collection_sint64=pb.CollectionSInt64(sint64=value))
        return pb.TypedData(json=json_text(value))

    def invoke(self, function: str, inputs: Mapping[str, Any], trigger_metadata: Mapping[str, Any],
               *, invocation_id: str | None = None, retry_count: int = 0, max_retry_count: int = 0,
               timeout: float | None = DEFAULT_TIMEOUT) -> InvocationResult:
        """One InvocationRequest; `inputs` are TypedData messages by parameter name.

        A worker that dies mid-invocation (an exception the worker does not
        catch, e.g. a simulated process crash) raises here: no response.
        """
        from azure_functions_runtime import handle_event

        pb = self.protos
        meta = self._metadata[function]
        invocation_id = invocation_id or str(uuid.uuid4())
        metadata = {key: value if isinstance(value, pb.TypedData) else self._typed(value)
                    for key, value in trigger_metadata.items()}
        metadata.setdefault("sys", self._typed(system_metadata(function)))
        request = pb.InvocationRequest(
            invocation_id=invocation_id, function_id=meta.function_id,
            input_data=[pb.ParameterBinding(name=name, data=data) for name, data in inputs.items()],
            trigger_metadata=metadata,
            trace_context=pb.RpcTraceContext(),
            retry_context=pb.RetryContext(retry_count=retry_count, max_retry_count=max_retry_count))
        response = self._send(handle_event.invocation_request, "InvocationRequest",
                              timeout=timeout, invocation_request=request)
        outputs = {b.name: _python_value(b.data) for b in response.output_data}
        return InvocationResult(function, invocation_id, _status(response.result),
                                _python_value(response.return_value)
                                if response.HasField("return_value") else None, outputs)

    def _trigger_name(self, function: str) -> str:
        return str(self._metadata[function].trigger["name"])

    def invoke_http(self, function: str, *, method: str = "POST",
                    headers: Mapping[str, str] | None = None, body: bytes = b"",
                    query: Mapping[str, str] | None = None,
                    route_params: Mapping[str, str] | None = None,
                    **options: Any) -> InvocationResult:
        """An HTTP request as RpcHttp (headers lowercased, body as `_http_body` says)."""
        pb = self.protos
        trigger = self._metadata[function].trigger
        route = str(trigger.get("route") or function)
        url = f"{LOCAL_HOST_URL}/api/{route}"
        if query:
            url += "?" + urlencode(dict(query))
        headers = {k.lower(): v for k, v in (headers or {}).items() if v}  # as the host lowercases
        http = pb.RpcHttp(method=method, url=url, headers=headers,
                          query={k: v for k, v in parse_qsl(urlsplit(url).query) if v},
                          params=dict(route_params or {}))
        if body:
            http.body.CopyFrom(self._http_body(headers, body))
        return self.invoke(function, {self._trigger_name(function): pb.TypedData(http=http)}, {},
                           **options)

    def _http_body(self, headers: Mapping[str, str], body: bytes) -> Any:
        """The request body as the host sends it to a worker that declared RpcHttpBodyOnly:
        bytes for octet-stream/multipart or when the worker asked for RawHttpBodyBytes
        (this worker does), text otherwise."""
        pb = self.protos
        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        media = content_type.split(";")[0].strip().lower()
        if (self.capabilities.get("RawHttpBodyBytes") == "true"
                or media == "application/octet-stream" or media.startswith("multipart/")):
            return pb.TypedData(bytes=body)
        return pb.TypedData(string=body.decode("utf-8", errors="replace"))

    def invoke_timer(self, function: str, *, past_due: bool = False, now: datetime | None = None,
                     **options: Any) -> InvocationResult:
        """A timer tick: the timer info as JSON."""
        pb = self.protos
        data = pb.TypedData(json=json_text(timer_info(past_due=past_due, now=now)))
        return self.invoke(function, {self._trigger_name(function): data}, {}, **options)

    def invoke_event_hub_batch(self, function: str, events: Sequence[SentEvent], *, partition_id: str,
                               event_hub: str | None = None, consumer_group: str | None = None,
                               namespace: str = "local.servicebus.windows.net",
                               **options: Any) -> InvocationResult:
        """A cardinality-many batch: the bodies as one collection (strings unless the binding's
        dataType is binary) and the batch's trigger metadata."""
        pb = self.protos
        trigger = self._metadata[function].trigger
        hub = event_hub or self.resolve(str(trigger["eventHubName"]))
        group = consumer_group or self.resolve(str(trigger.get("consumerGroup", "$Default")))
        if str(trigger.get("dataType", "")).lower() == "binary":
            data = pb.TypedData(collection_bytes=pb.CollectionBytes(bytes=[e.body for e in events]))
        else:
            data = pb.TypedData(collection_string=pb.CollectionString(
                string=[e.body.decode("utf-8") for e in events]))
        metadata = event_batch_metadata(list(events), partition_id=partition_id, event_hub=hub,
                                        consumer_group=group, namespace=namespace)
        return self.invoke(function, {self._trigger_name(function): data}, metadata, **options)

    def invoke_queue(self, function: str, message: ReceivedQueueMessage,
                     **options: Any) -> InvocationResult:
        """One Storage queue message: its text (bytes when the binding's dataType is binary)
        and the trigger metadata the host sends (`local_stack.host_data.queue_metadata`)."""
        pb = self.protos
        trigger = self._metadata[function].trigger
        if str(trigger.get("dataType", "")).lower() == "binary":
            data = pb.TypedData(bytes=message.body)
        else:
            data = pb.TypedData(string=queue_text(message.body))
        return self.invoke(function, {self._trigger_name(function): data},
                           queue_metadata(message), **options)

    def invoke_service_bus(self, function: str, message: SentMessage, *,
                           lock_token: uuid.UUID | None = None, delivery_count: int = 1,
                           sequence_number: int = 1, enqueued_time: datetime | None = None,
                           settle: SettleCallback | None = None, **options: Any) -> InvocationResult:
        """One received message as model binding data; `settle` gets the function's
        settlement calls for this lock token (over gRPC) while the invocation runs."""
        pb = self.protos
        token = lock_token or uuid.uuid4()
        content = service_bus_content(message, lock_token=token, delivery_count=delivery_count,
                                      sequence_number=sequence_number, enqueued_time=enqueued_time)
        data = pb.TypedData(model_binding_data=pb.ModelBindingData(
            version=MODEL_BINDING_VERSION, source=SERVICE_BUS_SOURCE,
            content_type=MODEL_BINDING_CONTENT_TYPE, content=content))
        metadata = service_bus_metadata(message, lock_token=token, delivery_count=delivery_count,
                                        sequence_number=sequence_number, enqueued_time=enqueued_time)
        route = (self.settlements.route(token, settle) if settle is not None
                 else contextlib.nullcontext())
        with route:
            return self.invoke(function, {self._trigger_name(function): data}, metadata, **options)


class WorkerInitError(WorkerError):
    """Worker init (indexing) failed; `status.message` is the worker's exception."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"worker init failed: {status.message}")
        self.status = status
