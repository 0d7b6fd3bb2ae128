"""The shipped default config (sticky until saturated) on the two real vLLM servers.

The simulator shares the EPP's assumptions about prefix caching and the response path;
these check them against real vLLM: a group of requests sharing a long prefix stays on
the server that cached it, that server's own prefix-cache counters show the hits, and the
EPP's in-flight counts (the token-load scorer's input) return to zero once real streamed
and whole responses end.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.real_vllm.conftest import MODEL_NAME
from tests.real_vllm.helpers import TIMEOUT, get_text, post, value, wait_for

pytestmark = pytest.mark.real_vllm

# The NATO alphabet, 300 words of it per prompt: hundreds of tokens, many 16-token blocks.
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]


def system_prompt(group: int) -> str:
    words = [WORDS[(group * 7 + i * 3) % len(WORDS)] for i in range(300)]
    return f"You are assistant number {group}. " + " ".join(words) + "\n"


async def server_counters(http: aiohttp.ClientSession, pool) -> dict[str, tuple[float, float]]:
    """Per server: (requests finished, prefix-cache hit tokens), from vLLM's own page."""
    out = {}
    for s in pool.servers:
        page = await get_text(http, f"{s.url}/metrics")
        out[s.name] = (
            value(page, "vllm:request_success_total"),
            value(page, "vllm:prefix_cache_hits_total"),
        )
    return out


async def send_and_locate(http, stack, pool, prompt: str) -> tuple[str, float]:
    """Send one request; return the server that served it and the hit tokens it reported."""
    before = await server_counters(http, pool)
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}
    r = await post(http, stack.url + "/v1/completions", body)
    assert r.status == 200, r.body[:300]
    moved: dict[str, tuple[float, float]] = {}

    async def settled() -> bool:
        after = await server_counters(http, pool)
        moved.clear()
        for name, (done, hits) in after.items():
            moved[name] = (done - before[name][0], hits - before[name][1])
        return sum(d for d, _ in moved.values()) >= 1

    await wait_for(settled, 10, lambda: f"vLLM success counters moved by {moved}")
    served = [name for name, (d, _) in moved.items() if d]
    assert len(served) == 1, moved
    return served[0], moved[served[0]][1]


async def test_a_shared_prefix_stays_on_the_server_that_cached_it(stack, vllm_pool):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for group in (1, 2):
            prefix = system_prompt(group)
            first, _ = await send_and_locate(http, stack, vllm_pool, prefix + "Question 0?")
            for q in range(1, 4):
                server, hits = await send_and_locate(
                    http, stack, vllm_pool, prefix + f"Question {q}?"
                )
                # One request at a time: no server is loaded, so the gate keeps the
                # cached one, and the server itself reports the prefix as cached
                # (the shared prefix is hundreds of tokens: at least 10 blocks of 16).
                assert server == first, (group, q, server, first)
                assert hits >= 160, (group, q, hits)


async def test_in_flight_counts_return_to_zero_after_real_responses(stack, vllm_pool):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def one(i: int) -> None:
            body = {
                "model": MODEL_NAME,
                "prompt": system_prompt(10 + i % 3) + f"Item {i}.",
                "max_tokens": 16,
                "ignore_eos": True,
                "stream": i % 2 == 0,
            }
            r = await post(http, stack.url + "/v1/completions", body)
            assert r.status == 200, r.body[:300]

        await asyncio.gather(*(one(i) for i in range(12)))
        rows: list[dict] = []

        async def drained() -> bool:
            rows[:] = json.loads(await get_text(http, stack.epp_metrics_url + "/debug/endpoints"))
            return all(
                row["inflight_requests"] == 0
                and row["inflight_tokens"] == 0
                and row["inflight_prefill_tokens"] == 0
                for row in rows
            )

        # The EPP releases a request when its response ends (the last chunk through
        # Envoy's response path), so nothing may stay counted after the replies.
        await wait_for(drained, 10, lambda: f"in-flight counts left: {rows}")
        assert len(rows) == len(vllm_pool.servers)
