"""Headless Chromium (Debian's /usr/bin/chromium) driven over the DevTools protocol.

No browser-automation dependency: Chromium's --remote-debugging-port serves the protocol
as JSON over a WebSocket, which aiohttp (already a dependency) speaks. As root Chromium
needs --no-sandbox; the background-networking flags keep it from dialling Google's
hosts, which this machine cannot reach (/work/.library/env/machines/python.md).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from epp.harness.procs import HttpReady, ManagedProcess, ProcessGroup, free_port

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def chromium_binary() -> str | None:
    return shutil.which("chromium")


def start_chromium(
    pg: ProcessGroup, profile_dir: Path, size: tuple[int, int] = (1400, 1000)
) -> tuple[ManagedProcess, int]:
    """Chromium with a fresh profile and a free debugging port; (process, port)."""
    binary = chromium_binary()
    assert binary is not None
    port = free_port()
    argv = [binary, *FLAGS, f"--user-data-dir={profile_dir}", f"--remote-debugging-port={port}"]
    argv += [f"--window-size={size[0]},{size[1]}", "about:blank"]
    proc = pg.start(
        "chromium", argv, ready=HttpReady(f"http://127.0.0.1:{port}/json/version"), timeout=60
    )
    return proc, port


class Page:
    """One tab: `navigate`, `evaluate` (a JS expression's value), `screenshot` (PNG)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    @classmethod
    async def open(cls, session: aiohttp.ClientSession, port: int) -> Page:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
            targets = json.load(r)
        page = next(t for t in targets if t["type"] == "page")
        ws = await session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 << 20)
        return cls(ws)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), timeout=30)
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, what: str, timeout: float = 30.0) -> Any:
        """Poll `expression` until it is truthy; its value. Fails naming `what`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            await asyncio.sleep(0.2)

    async def screenshot(self) -> bytes:
        result = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return base64.b64decode(result["data"])
