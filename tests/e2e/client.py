"""A small client for end-to-end tests: send OpenAI requests through Envoy, record who served."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass

import aiohttp

from epp.headers import SIM_SERVER


@dataclass
class Reply:
    status: int
    server: str | None
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict | bytes,
    path: str = "/v1/completions",
    headers: dict[str, str] | None = None,
) -> Reply:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    async with session.post(url + path, data=data, headers=hdrs) as r:
        return Reply(r.status, r.headers.get(SIM_SERVER), await r.read())


async def burst(
    url: str, n: int, concurrency: int, body: dict, headers: dict[str, str] | None = None
) -> list[Reply]:
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> Reply:
            async with sem:
                return await send(session, url, body, headers=headers)

        return await asyncio.gather(*(one() for _ in range(n)))


def servers(replies: list[Reply]) -> Counter:
    return Counter(r.server for r in replies)


def sim_prefix(server_header: str | None) -> str | None:
    """`sim-1-0` (the simulator's own name) → `sim-1` (the EPP's endpoint name)."""
    return server_header.rsplit("-", 1)[0] if server_header else None
