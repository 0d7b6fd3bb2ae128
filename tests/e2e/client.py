"""A small client for end-to-end tests: send OpenAI requests through Envoy, record who served."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Callable
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


@dataclass
class Outcome:
    """One request of a steady load: when it started and ended (loop time), how it went."""

    start: float
    end: float
    status: int | None  # None: the connection failed or the body was cut off
    body: bytes = b""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


async def steady(
    url: str,
    concurrency: int,
    body: dict | Callable[[], dict],
    stop: asyncio.Event,
    path: str = "/v1/completions",
    timeout_s: float = 60,
    sink: list[Outcome] | None = None,
    pause_on_error: float = 0.0,
) -> list[Outcome]:
    """`concurrency` clients each sending `body` back to back until `stop` is set.

    `body` may be a function giving each request its own body. A streamed body
    (`"stream": true`) counts as ok only if it ends with `[DONE]`. Outcomes are appended
    to `sink` (readable while it runs) as they end; a client waits `pause_on_error`
    after a failure (a fast 503 must not spin the CPU).
    """
    loop = asyncio.get_running_loop()
    outcomes: list[Outcome] = sink if sink is not None else []
    make = body if callable(body) else lambda: body

    async def client(http: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            start = loop.time()
            one = make()
            streamed = bool(one.get("stream"))
            try:
                async with http.post(url + path, json=one) as r:
                    raw = await r.read()
                    error = ""
                    if r.status == 200 and streamed and b"data: [DONE]" not in raw:
                        error = "stream without [DONE]"
                    outcomes.append(Outcome(start, loop.time(), r.status, raw, error))
            except (TimeoutError, aiohttp.ClientError) as e:
                outcomes.append(Outcome(start, loop.time(), None, b"", type(e).__name__))
            if pause_on_error and not outcomes[-1].ok:
                await asyncio.sleep(pause_on_error)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return sorted(outcomes, key=lambda o: o.start)


class Recorder:
    """`steady()` as a task whose outcomes can be read while it runs (`outcomes`)."""

    def __init__(self, url: str, concurrency: int, body: dict | Callable[[], dict]) -> None:
        self.stop = asyncio.Event()
        self.outcomes: list[Outcome] = []
        self.task = asyncio.create_task(
            steady(url, concurrency, body, self.stop, sink=self.outcomes, pause_on_error=0.05)
        )

    def ok_after(self, t: float) -> int:
        return sum(o.ok and o.start > t for o in self.outcomes)

    async def wait_ok(self, n: int, after: float = 0.0, timeout_s: float = 60) -> None:
        """Until `n` requests that started after `after` have succeeded."""
        for _ in range(int(timeout_s / 0.05)):
            if self.ok_after(after) >= n:
                return
            if self.task.done():
                await self.task  # raises what killed it
            await asyncio.sleep(0.05)
        raise AssertionError(f"never {n} successful requests after t={after:.2f}")

    async def finish(self) -> list[Outcome]:
        self.stop.set()
        await self.task
        return sorted(self.outcomes, key=lambda o: o.start)


def describe(outcomes: list[Outcome]) -> Counter:
    """How requests ended: `200`, or status and error code / client-side error."""
    return Counter("200" if o.ok else f"{o.status} {error_code(o) or o.error}" for o in outcomes)


def error_code(o: Outcome) -> str | None:
    """The OpenAI-style error body's `code`, if the body is one."""
    try:
        return json.loads(o.body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def debug_endpoints(stack) -> list[dict]:
    """The EPP's view of its pool (`/debug/endpoints` on its metrics port): health,
    in-flight counts, scraped queue per endpoint. Blocking: call it in a thread."""
    with urllib.request.urlopen(stack.epp_metrics_url + "/debug/endpoints", timeout=5) as r:
        return json.load(r)
