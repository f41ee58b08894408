"""A loopback TCP relay that adds round-trip time in front of a local server.

    with Relay(10002, delay_ms=2.5) as relay:   # RTT + 5 ms in front of 127.0.0.1:10002
        client = make_client(port=relay.port)

Every chunk read from one side is written to the other side `delay_ms` later,
in each direction, so a request/response exchange gains about 2 x `delay_ms`
(a round trip). Chunks are pipelined, not serialized: a chunk's delay starts
when it arrives, so bandwidth is not throttled. A new connection also waits
one round trip before its first bytes go upstream, the cost of a TCP
handshake on a real network (`handshake=False` turns that off). TLS passes
through unchanged (the relay never looks inside the bytes).

The timers run on a `select()`-based event loop: `epoll` and `poll` round
their timeouts up to whole milliseconds, which would add up to 1 ms per hop.

Loopback only: the relay listens on 127.0.0.1 and refuses a target that is not
a loopback address. By default it runs in a child process (`python -m
local_stack.relay`), so its CPU time and its share of the GIL stay out of the
measuring process; `process=False` runs it on a thread of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import selectors
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

CHUNK = 64 * 1024
READY = "relay listening on port "


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the relay only forwards to loopback addresses, not {host!r}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                not_before: float) -> None:
    """Copy `reader` to `writer`, each chunk `delay` seconds after it arrived."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def pump() -> None:
        while True:
            try:
                data = await reader.read(CHUNK)
            except (ConnectionError, OSError):
                data = b""
            queue.put_nowait((max(loop.time(), not_before) + delay, data))
            if not data:
                return

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(ConnectionError, OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    pumping = asyncio.ensure_future(pump())
    try:
        await deliver()
    except (ConnectionError, OSError):
        pass
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await pumping


async def _connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, *,
                      target: tuple[str, int], delay: float, handshake: bool) -> None:
    loop = asyncio.get_running_loop()
    opened = loop.time() + (2 * delay if handshake else 0.0)
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(
            _pipe(client_reader, server_writer, delay, opened),
            _pipe(server_reader, client_writer, delay, 0.0))
    finally:
        for writer in (client_writer, server_writer):
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


async def serve(target_port: int, *, delay: float, target_host: str = "127.0.0.1",
                listen_port: int = 0, handshake: bool = True,
                started: threading.Event | None = None, port_box: list[int] | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run the relay until `stop` is set (forever without one)."""
    _check_loopback(target_host)

    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await _connection(reader, writer, target=(target_host, target_port), delay=delay,
                              handshake=handshake)
        finally:
            tasks.discard(task)

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    port = server.sockets[0].getsockname()[1]
    if port_box is not None:
        port_box.append(port)
    else:
        print(f"{READY}{port}", flush=True)
    if started is not None:
        started.set()
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        server.close()
        server.abort_clients()  # wait_closed would wait for idle keep-alive clients
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


class Relay:
    """A relay in front of 127.0.0.1:`target_port`, as a context manager.

    `delay_ms` is the one-way delay per chunk (added RTT = 2 x `delay_ms`). `listen_port`
    (default: a free one) lets a relay stopped to cut its clients off (a store outage) be
    started again where they connect.
    """

    def __init__(self, target_port: int, *, delay_ms: float, target_host: str = "127.0.0.1",
                 handshake: bool = True, process: bool = True, timeout: float = 10.0,
                 listen_port: int = 0) -> None:
        _check_loopback(target_host)
        if delay_ms < 0:
            raise ValueError("delay_ms must not be negative")
        self.target = (target_host, target_port)
        self.delay_ms = delay_ms
        self.handshake = handshake
        self.process = process
        self.timeout = timeout
        self.port = listen_port
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def rtt_ms(self) -> float:
        """The nominal added round-trip time."""
        return 2 * self.delay_ms

    def start(self) -> Relay:
        if self.process:
            self._start_process()
        else:
            self._start_thread()
        return self

    def _start_process(self) -> None:
        argv = [sys.executable, "-m", "local_stack.relay", "--target-port", str(self.target[1]),
                "--target-host", self.target[0], "--delay-ms", str(self.delay_ms),
                "--listen-port", str(self.port)]
        if not self.handshake:
            argv.append("--no-handshake")
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True,  # noqa: S603
                                      cwd=Path(__file__).resolve().parent.parent)
        stdout = self._proc.stdout
        assert stdout is not None
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.timeout)
        line = ready[0] if ready else ""
        if not line.startswith(READY):
            self.stop()
            raise RuntimeError(f"relay did not start within {self.timeout}s: {line!r}")
        self.port = int(line[len(READY):])

    def _start_thread(self) -> None:
        started = threading.Event()
        box: list[int] = []
        self._loop = _loop()
        self._stop = asyncio.Event()

        def run() -> None:
            assert self._loop is not None and self._stop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve(
                self.target[1], delay=self.delay_ms / 1000, target_host=self.target[0],
                listen_port=self.port, handshake=self.handshake, started=started, port_box=box,
                stop=self._stop))

        self._thread = threading.Thread(target=run, name="relay", daemon=True)
        self._thread.start()
        if not started.wait(self.timeout):
            raise RuntimeError(f"relay did not start within {self.timeout}s")
        self.port = box[0]

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None
        if self._thread is not None and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=5)
            self._loop.close()
            self._thread = None

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m local_stack.relay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--target-host", default="127.0.0.1")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay per chunk")
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--no-handshake", action="store_true",
                        help="do not hold a new connection's first bytes for one round trip")
    args = parser.parse_args(argv)
    loop = _loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        loop.run_until_complete(serve(args.target_port, delay=args.delay_ms / 1000,
                                      target_host=args.target_host, listen_port=args.listen_port,
                                      handshake=not args.no_handshake, stop=stop))
    finally:
        loop.close()

if __name__ == "__main__":
    main()
