"""The latency relay (local_stack/relay.py): bytes pass intact, and round trips gain its delay.

Only lower bounds are asserted: a loaded machine can make a round trip slower, never faster
than the relay holds each chunk.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from local_stack.relay import Relay

DELAY_MS = 10.0  # one way; the added round trip is 20 ms


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True


@pytest.fixture(scope="module")
def echo_port() -> Iterator[int]:
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _exchange(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    received = b""
    while len(received) < len(payload):
        chunk = sock.recv(65536)
        assert chunk, "connection closed early"
        received += chunk
    return received


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_each_round_trip_gains_the_relay_delay_and_bytes_pass_intact(echo_port, process):
    with Relay(echo_port, delay_ms=DELAY_MS, process=process) as relay:
        assert relay.rtt_ms == 2 * DELAY_MS
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            assert _exchange(sock, b"hello") == b"hello"
            first = time.perf_counter() - started  # handshake round trip + the exchange
            rtts = []
            for n in range(5):
                sent = time.perf_counter()
                assert _exchange(sock, f"ping {n}".encode()) == f"ping {n}".encode()
                rtts.append(time.perf_counter() - sent)
            payload = bytes(range(256)) * 2000  # many chunks, in order
            assert _exchange(sock, payload) == payload
    # Lower bounds only (5% slack for clock granularity): the relay never forwards early.
    assert min(rtts) * 1000 >= 0.95 * relay.rtt_ms
    assert first * 1000 >= 0.95 * 2 * relay.rtt_ms


def test_without_handshake_a_new_connection_costs_one_round_trip(echo_port):
    with Relay(echo_port, delay_ms=DELAY_MS, handshake=False, process=False) as relay:
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
            assert _exchange(sock, b"x") == b"x"
        assert (time.perf_counter() - started) * 1000 >= 0.95 * relay.rtt_ms


def test_a_relay_only_forwards_to_loopback():
    with pytest.raises(ValueError, match="loopback"):
        Relay(443, delay_ms=1, target_host="192.0.2.1")
    with pytest.raises(ValueError, match="loopback"):
        Relay(443, delay_ms=1, target_host="example.org")
