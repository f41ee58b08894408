"""Processes for Azurite and the Cosmos server, with readiness waits."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_BIN = ROOT / "node_modules" / ".bin"

# Azurite's published development account; it only opens the local emulator.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
# The Cosmos-compatible server accepts any base64 key; this one is ours.
COSMOS_LOCAL_KEY = "bG9jYWwtY29zbW9zLXRlc3Qta2V5LW5vdC1hLXNlY3JldA=="


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early ({proc.returncode}); log:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"server did not listen on 127.0.0.1:{port} within {timeout}s")


@dataclass
class ServerProcess:
    """One local server: a command line, its port, and a start/stop lifecycle."""

    name: str
    argv: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(suffix=".log")[1]))

    def start(self, timeout: float = 60.0) -> None:
        if shutil.which(self.argv[0]) is None and not Path(self.argv[0]).exists():
            raise FileNotFoundError(f"{self.argv[0]} not found: run `npm ci` first")
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv from this module
                self.argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait_for_port(self.port, self.proc, self.log, timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        """Stop and start again on the same port (a store outage for tests)."""
        self.stop()
        self.start()


def azurite_tables(port: int) -> ServerProcess:
    argv = [
        str(NODE_BIN / "azurite-table"),
        "--inMemoryPersistence",
        "--tableHost",
        "127.0.0.1",
        "--tablePort",
        str(port),
        "--disableTelemetry",
        "--skipApiVersionCheck",
    ]
    return ServerProcess("azurite-table", argv, port)


def azurite_queues(port: int) -> ServerProcess:
    """Azurite's queue service: a real at-least-once queue (visibility timeouts, dequeue
    counts, pop receipts). `--skipApiVersionCheck`: azure-storage-queue 12.18 sends an API
    version newer than Azurite 3.35 knows."""
    argv = [
        str(NODE_BIN / "azurite-queue"),
        "--inMemoryPersistence",
        "--queueHost",
        "127.0.0.1",
        "--queuePort",
        str(port),
        "--disableTelemetry",
        "--skipApiVersionCheck",
    ]
    return ServerProcess("azurite-queue", argv, port)


def queue_connection_string(port: int) -> str:
    """The connection string of an Azurite queue service on loopback `port`."""
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"QueueEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};")


def cosmos_server(port: int, *, advertise_port: int | None = None) -> ServerProcess:
    """The Cosmos server on `port`; with `advertise_port`, its account names that port as its
    endpoint (a relay there then carries every request the SDK makes)."""
    argv = ["node", str(ROOT / "tools" / "cosmos-server" / "launch.js"), "--port", str(port)]
    if advertise_port is not None:
        argv += ["--advertise-port", str(advertise_port)]
    return ServerProcess("cosmos-server", argv, port)


@dataclass
class LocalStack:
    """Azurite tables + the Cosmos server on free loopback ports."""

    table_port: int = field(default_factory=free_port)
    cosmos_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.azurite = azurite_tables(self.table_port)
        self.cosmos = cosmos_server(self.cosmos_port)

    @property
    def table_connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"TableEndpoint=http://127.0.0.1:{self.table_port}/{AZURITE_ACCOUNT};"
        )

    @property
    def cosmos_endpoint(self) -> str:
        return f"https://127.0.0.1:{self.cosmos_port}/"

    def environment(self) -> dict[str, str]:
        """App settings that point the app at this stack."""
        return {
            "TABLE_CONNECTION_STRING": self.table_connection_string,
            "COSMOS_ENDPOINT": self.cosmos_endpoint,
            "COSMOS_KEY": COSMOS_LOCAL_KEY,
            "COSMOS_VERIFY_TLS": "false",
        }

    def __enter__(self) -> LocalStack:
        self.azurite.start()
        try:
            self.cosmos.start()
        except BaseException:
            self.azurite.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cosmos.stop()
        self.azurite.stop()
