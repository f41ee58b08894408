"""Headless Chromium driven over the DevTools protocol, to see what a reader's browser draws.

Material for MkDocs renders each Mermaid diagram into a *closed* shadow root, which `--dump-dom` and
page scripts cannot see; the DevTools protocol's `DOM.getDocument(pierce=true)` can. Chromium is
Debian's (tests/simulator/test_html_report.py installs it on first use); the site is served on a
loopback port by this process.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.simulator.test_html_report import CHROMIUM_FLAGS


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """The folder over HTTP on a free loopback port; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Diagram:
    """One `div.mermaid` host of the page and the SVG markup in its shadow root ("" if none)."""

    svg: str


@contextmanager
def chromium_session(chromium: Path, profile: Path) -> Iterator[int]:
    """A headless Chromium with a DevTools port; yields the port."""
    profile.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen([str(chromium), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                "--remote-debugging-port=0", "--remote-allow-origins=*",
                                "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not open its DevTools port (exit {process.poll()})")
            time.sleep(0.1)
        yield int(port_file.read_text().split()[0])
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def mermaid_diagrams(port: int, url: str, *, expected: int, timeout: float = 60.0) -> list[Diagram]:
    """Loads `url` and returns its rendered diagrams once `expected` hosts hold an SVG (or the
    timeout passes: then what is there, so the caller's assertion names the shortfall)."""
    return asyncio.run(_diagrams(port, url, expected, timeout))


async def _diagrams(port: int, url: str, expected: int, timeout: float) -> list[Diagram]:
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as answer:
            target = json.loads(await answer.text())
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1_000_000))

            async def call(method: str, **params: Any) -> dict[str, Any]:
                number = next(ids)
                await ws.send_json({"id": number, "method": method, "params": params})
                while True:
                    message = await ws.receive_json()
                    if message.get("id") == number:
                        if "error" in message:
                            raise RuntimeError(f"{method}: {message['error']}")
                        return message["result"]

            await call("Page.enable")
            await call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout
            found: list[Diagram] = []
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                root = (await call("DOM.getDocument", depth=-1, pierce=True))["root"]
                found = []
                for host in _hosts(root):
                    svg = ""
                    for shadow in host.get("shadowRoots", []):
                        node = next(_by_name(shadow, "svg"), None)
                        if node is not None:
                            svg = (await call("DOM.getOuterHTML", nodeId=node["nodeId"]))["outerHTML"]
                    found.append(Diagram(svg))
                if len(found) >= expected and all(d.svg for d in found):
                    break
            return found


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("children", []):
        yield from _walk(child)
    for shadow in node.get("shadowRoots", []):
        yield from _walk(shadow)


def _by_name(node: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    return (n for n in _walk(node) if n.get("nodeName", "").lower() == name)


_KEYWORDS = ("sequenceDiagram", "flowchart", "graph ")


def _text(node: dict[str, Any]) -> str:
    return "".join(n.get("nodeValue", "") for n in _walk(node) if n.get("nodeType") == 3)


def _hosts(root: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the page's diagrams are: elements of class `mermaid` (Material's host divs, or a `pre`
    not yet handled), and a `pre` still holding diagram source (Material takes the class off while
    it loads Mermaid, and never puts it back when Mermaid cannot be had)."""
    hosts = []
    for node in _walk(root):
        attributes = node.get("attributes", [])
        values = dict(zip(attributes[::2], attributes[1::2], strict=True))
        if "mermaid" in values.get("class", "").split() or (
                node.get("nodeName") == "PRE" and _text(node).lstrip().startswith(_KEYWORDS)):
            hosts.append(node)
    return hosts
