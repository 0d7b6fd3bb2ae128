"""A hostile client that makes the EPP hold request bodies, and the ordinary traffic that
must get through meanwhile: the body-budget attack of bench/body_flood.py and its e2e test.

Each held body is one HTTP/1.1 connection from a chosen loopback address (Linux routes
all of 127.0.0.0/8 to lo, so 127.0.0.2 is another client to Envoy): headers declaring
one byte more than is sent, then the body, then nothing. Envoy streams it to the EPP
(FULL_DUPLEX_STREAMED), which must hold it until it ends or is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp

MODEL_BODY_HEAD = b'{"model": "tiny", "prompt": "'
SMALL_BODY = b'{"model": "tiny", "prompt": "hello there", "max_tokens": 2}'


@dataclass
class HeldBody:
    """One connection holding an unfinished body; `status` is Envoy's answer, if any."""

    writer: asyncio.StreamWriter
    reader: asyncio.StreamReader
    status: int | None = None
    _read: asyncio.Task[None] | None = field(default=None, repr=False)

    async def _read_status(self) -> None:
        with contextlib.suppress(Exception):
            line = await self.reader.readline()
            if line.startswith(b"HTTP/"):
                self.status = int(line.split()[1])

    def close(self) -> None:
        if self._read is not None:
            self._read.cancel()
        self.writer.close()


async def hold_body(host: str, port: int, source: str, size: int, settle: float = 2.0) -> HeldBody:
    """Open a connection from `source`, send headers for `size` + 1 bytes and `size`
    bytes of body; return once they are sent (or refused), holding the connection."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {size + 1}\r\n\r\n"
    ).encode()
    held = HeldBody(writer, reader)
    held._read = asyncio.create_task(held._read_status())
    writer.write(head + MODEL_BODY_HEAD + b"x" * (size - len(MODEL_BODY_HEAD)))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.drain(), settle * 10)
    # the EPP's answer (a refusal) comes within `settle`, or the body is held
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(held._read), settle)
    return held


async def hold_bodies(
    host: str, port: int, sources: list[str], size: int, settle: float = 2.0
) -> list[HeldBody]:
    """One held body per entry of `sources` (repeat an address for several connections)."""
    return list(await asyncio.gather(*(hold_body(host, port, s, size, settle) for s in sources)))


@dataclass
class GoodTraffic:
    sent: int = 0
    ok: int = 0
    errors: dict[int, int] = field(default_factory=dict)


async def good_traffic(url: str, n: int, concurrency: int = 4) -> GoodTraffic:
    """`n` ordinary small completions from 127.0.0.1; every non-200 is counted."""
    out = GoodTraffic()
    queue = iter(range(n))
    conn = aiohttp.TCPConnector(limit=concurrency, local_addr=("127.0.0.1", 0))
    async with aiohttp.ClientSession(connector=conn) as http:

        async def worker() -> None:
            for _ in queue:
                out.sent += 1
                try:
                    async with http.post(
                        url + "/v1/completions",
                        data=SMALL_BODY,
                        headers={"content-type": "application/json"},
                        timeout=aiohttp.ClientTimeout(total=60),
                    ) as r:
                        await r.read()
                        status = r.status
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                if status == 200:
                    out.ok += 1
                else:
                    out.errors[status] = out.errors.get(status, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def attack_sources(n: int, spread: bool) -> list[str]:
    """`n` connections from one attacker address (127.0.0.2), or each from its own
    (127.0.1.x: a botnet, where no per-address share helps)."""
    return [f"127.0.1.{i + 1}" for i in range(n)] if spread else ["127.0.0.2"] * n
