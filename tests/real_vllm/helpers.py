"""Small tools for the real-vLLM tier: Prometheus pages, HTTP calls, waiting."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

TIMEOUT = aiohttp.ClientTimeout(total=120)


@dataclass(frozen=True)
class Family:
    name: str  # as prometheus_client names families (counters without `_total`)
    type: str
    label_keys: frozenset[str]  # over every sample, without `le` / `quantile`
    samples: tuple[tuple[str, dict[str, str], float], ...]


def families(page: str) -> dict[str, Family]:
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(page):
        keys: set[str] = set()
        for s in fam.samples:
            keys |= set(s.labels) - {"le", "quantile"}
        samples = tuple((s.name, dict(s.labels), float(s.value)) for s in fam.samples)
        out[fam.name] = Family(fam.name, fam.type, frozenset(keys), samples)
    return out


def value(page: str, sample_name: str, **labels: str) -> float:
    """Sum of the samples named exactly `sample_name` whose labels include `labels`."""
    total, found = 0.0, False
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += float(s.value)
                found = True
    if not found:
        raise AssertionError(f"no sample {sample_name}{labels or ''} on the page")
    return total


async def get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as r:
        assert r.status == 200, f"GET {url} -> {r.status}: {(await r.text())[:300]}"
        return await r.text()


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> dict:
        return json.loads(self.body)

    def sse(self) -> list[str]:
        """The `data:` payloads of a streamed reply, in order."""
        return [
            line[len("data: ") :]
            for line in self.body.decode().splitlines()
            if line.startswith("data: ")
        ]


async def post(
    session: aiohttp.ClientSession, url: str, body: dict, headers: dict[str, str] | None = None
) -> Reply:
    hdrs = {"content-type": "application/json", **(headers or {})}
    async with session.post(url, data=json.dumps(body).encode(), headers=hdrs) as r:
        return Reply(r.status, await r.read(), dict(r.headers))


async def wait_for(
    cond: Callable[[], bool | Awaitable[bool]],
    timeout: float,
    what: Callable[[], str] | str,
    interval: float = 0.05,
) -> None:
    """Poll `cond` until true; on timeout fail with `what` (a message or its maker)."""
    deadline = time.monotonic() + timeout
    while True:
        result = cond()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            msg = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g}s: {msg}")
        await asyncio.sleep(interval)
