"""Measure a running OpenAI server (`epp sim`, vLLM): the HTTP side of `epp profile`.

- **Prompts are token ids** (`"prompt": [ids]`, accepted by vLLM's and the simulator's
  `/v1/completions`): the server's tokenizer is unknown here, and ids make every ISL
  exact. Ids are drawn from `TOKEN_IDS` (inside the vocabulary of any real tokenizer,
  and of the 4096-token model of the real-vLLM tier, past the special tokens of the
  usual ones), at random from a seeded generator, so no two prompts share a block: no
  KV reuse where none is wanted.
- **TTFT and ITL are read from the SSE stream** on the client (the time of the first
  chunk carrying a choice; then one time per chunk), with `ignore_eos` so every stream
  runs its full length. Times are multiplied by `time_scale`: for an `epp sim
  --time-scale S`, pass S to get model time back.
- **Decode points warm first**: the same prompts are sent once with `max_tokens` 1, so
  the measured streams hit the prefix cache and the engine decodes undisturbed by
  prefill (Dynamo's profiler does the same with a second AIPerf run). This needs prefix
  caching on, which is vLLM V1's default.
- **KV capacity** is `num_gpu_blocks * block_size` of `vllm:cache_config_info` on
  `/metrics`; `max_model_len` comes from `/v1/models`.
- **The server's own view**: around each measurement the TTFT and inter-token
  histograms of `/metrics` are read; the change in `_sum / _count` is the server's mean
  over exactly the measured requests (the profiler must be the server's only client).
  Reported beside the client's numbers (`summary.json`), it separates network and
  client overhead from the engine's own latency. Not used in the NPZ files: like
  Dynamo's AIPerf runs, those hold what a client sees.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from epp.datalayer import promtext
from epp.planner.profiler.measure import DecodeTiming, PrefillTiming, steady_decode
from epp.planner.profiler.plan import DecodeLoad, EndpointLimits
from epp.planner.profiler.results import Endpoint

TOKEN_IDS = (1000, 4000)
TTFT_HISTOGRAM = "vllm:time_to_first_token_seconds"
ITL_HISTOGRAM = "vllm:inter_token_latency_seconds"
REQUEST_TIMEOUT_S = 600.0


class SweepError(RuntimeError):
    """The server could not be measured; the message names the endpoint and why."""


@dataclass
class HttpTarget:
    """A `driver.Target` that measures `endpoint.url` over HTTP."""

    endpoint: Endpoint
    session: aiohttp.ClientSession
    time_scale: float = 1.0
    seed: int = 0
    model: str = ""
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.base = self.endpoint.url.rstrip("/")

    # -- server facts ------------------------------------------------------------------

    async def _get(self, path: str) -> str:
        url = self.base + path
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as r:
                text = await r.text()
                if r.status != 200:
                    raise SweepError(f"GET {url} answered {r.status}: {text[:200]}")
                return text
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SweepError(f"cannot reach {url}: {e or type(e).__name__}") from None

    async def limits(self) -> EndpointLimits:
        try:
            models = json.loads(await self._get("/v1/models"))["data"]
            card = models[0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise SweepError(f"{self.base}/v1/models lists no model") from None
        self.model = self.model or str(card.get("id", ""))
        max_len = card.get("max_model_len")
        metrics = promtext.parse(await self._get("/metrics"), ["vllm:cache_config_info"])
        info = metrics.get("vllm:cache_config_info")
        if not info:
            raise SweepError(
                f"{self.base}/metrics has no vllm:cache_config_info: the KV capacity is"
                " unknown (is this a vLLM server?)"
            )
        labels = info[0].labels
        try:
            kv_tokens = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):
            raise SweepError(
                f"{self.base}: vllm:cache_config_info lacks num_gpu_blocks/block_size"
            ) from None
        if not isinstance(max_len, int) or max_len < 1:
            max_len = kv_tokens
        return EndpointLimits(max_kv_tokens=kv_tokens, max_model_len=max_len)

    async def _histogram_totals(self) -> dict[str, tuple[float, float]]:
        """(sum, count) of the TTFT and ITL histograms, summed over label sets."""
        text = await self._get("/metrics")
        found = promtext.parse(text, [TTFT_HISTOGRAM, ITL_HISTOGRAM])
        out = {}
        for family, samples in found.items():
            total = sum(s.value for s in samples if s.name == family + "_sum")
            n = sum(s.value for s in samples if s.name == family + "_count")
            out[family] = (total, n)
        return out

    @staticmethod
    def _mean_ms(
        before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], name: str
    ) -> float | None:
        if name not in before or name not in after:
            return None
        total = after[name][0] - before[name][0]
        n = after[name][1] - before[name][1]
        return 1000 * total / n if n > 0 else None

    # -- measurements ------------------------------------------------------------------

    def _prompt(self, isl: int) -> list[int]:
        lo, hi = TOKEN_IDS
        return [self._rng.randrange(lo, hi) for _ in range(isl)]

    async def _stream(self, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
        """Send one streamed completion; (send time, arrival time of every chunk that
        carries a choice), wall-clock seconds."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
        }
        url = self.base + "/v1/completions"
        times: list[float] = []
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        sent = time.monotonic()
        try:
            async with self.session.post(url, json=body, timeout=timeout) as r:
                if r.status != 200:
                    text = await r.text()
                    raise SweepError(f"POST {url} answered {r.status}: {text[:200]}")
                async for raw in r.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    now = time.monotonic()
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise SweepError(f"POST {url} failed mid-stream: {chunk['error']}")
                    if chunk.get("choices"):
                        times.append(now)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SweepError(f"POST {url}: {e or type(e).__name__}") from None
        if not times:
            raise SweepError(f"POST {url}: the stream carried no token")
        return sent, times

    async def prefill(self, isl: int, osl: int) -> PrefillTiming:
        before = await self._histogram_totals()
        sent, times = await self._stream(self._prompt(isl), osl)
        after = await self._histogram_totals()
        ttft = 1000 * (times[0] - sent) * self.time_scale
        return PrefillTiming(ttft, self._mean_ms(before, after, TTFT_HISTOGRAM))

    async def decode(self, load: DecodeLoad) -> DecodeTiming:
        prompts = [self._prompt(load.isl) for _ in range(load.num_request)]
        await asyncio.gather(*(self._stream(p, 1) for p in prompts))
        before = await self._histogram_totals()
        runs = await asyncio.gather(*(self._stream(p, load.osl) for p in prompts))
        after = await self._histogram_totals()
        scale = self.time_scale
        timing = steady_decode([[t * scale for t in times] for _, times in runs])
        return replace(timing, server_itl_ms=self._mean_ms(before, after, ITL_HISTOGRAM))


def open_session() -> aiohttp.ClientSession:
    """No connection limit (a decode point holds hundreds of streams at once), and no
    proxy from the environment: the endpoints are addressed directly."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=False)


class ProgressBar:
    """`[#####-----] 12/40 what` on stderr, redrawn in place; `enabled=False` is silent."""

    def __init__(self, enabled: bool = True, width: int = 30) -> None:
        self.enabled, self.width = enabled, width
        self.started = time.monotonic()

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.enabled:
            return
        filled = self.width * done // max(1, total)
        elapsed = time.monotonic() - self.started
        line = (
            f"[{'#' * filled}{'-' * (self.width - filled)}] {done}/{total} {elapsed:5.0f}s {what}"
        )
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\r{line[:119]:<119}{end}")
        sys.stderr.flush()
