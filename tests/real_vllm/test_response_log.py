"""The default response path (`--response-path log`: Envoy's Lua filter and gRPC access log)
against real vLLM: every request's in-flight count returns to 0 once it ends, and the
tokens the EPP records (its `inference_objective_*` histograms, fed by the same records the
planner and the latency predictor get) equal the usage vLLM itself reported."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from tests.real_vllm.conftest import MODEL_NAME
from tests.real_vllm.helpers import TIMEOUT, get_text, post, value, wait_for

SERIES = {
    "isl": "inference_objective_input_tokens_sum",
    "osl": "inference_objective_output_tokens_sum",
    "cached": "inference_objective_prompt_cached_tokens_sum",
    "ttft_n": "inference_objective_request_ttft_seconds_count",
}


async def inflight(http: aiohttp.ClientSession, stack) -> int:
    rows = json.loads(await get_text(http, f"{stack.epp_metrics_url}/debug/endpoints"))
    return sum(r["inflight_requests"] for r in rows)


async def observed(http: aiohttp.ClientSession, stack) -> dict[str, float]:
    page = await get_text(http, stack.epp_metrics_url + "/metrics")
    out = {}
    for key, name in SERIES.items():
        try:
            out[key] = value(page, name)
        except AssertionError:  # no request yet: the histogram has no series
            out[key] = 0.0
    out["joined"] = value(page, "epp_response_log_entries_total", outcome="joined")
    return out


def usage_of(reply, stream: bool) -> dict:
    if not stream:
        return reply.json()["usage"]
    chunks = [json.loads(e) for e in reply.sse()[:-1]]
    return [c["usage"] for c in chunks if c.get("usage")][-1]


async def test_each_request_is_released_and_its_tokens_are_vllms_usage(stack):
    prompt = "Count the tokens of this answer for me, please. " * 4
    cases = [
        ("/v1/completions", {"prompt": prompt}, True),
        ("/v1/completions", {"prompt": prompt}, True),  # the same prefix, now cached
        ("/v1/completions", {"prompt": prompt}, False),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}, True),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}, False),
    ]
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        for path, extra, stream in cases:
            body = {"model": MODEL_NAME, "max_tokens": 12, "ignore_eos": True, **extra}
            if stream:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            before = await observed(http, stack)
            reply = await post(http, stack.url + path, body)
            assert reply.status == 200, reply.body[:300]

            async def released() -> bool:
                return await inflight(http, stack) == 0

            await wait_for(released, 30, f"in-flight after {path} stream={stream}")
            after = await observed(http, stack)
            usage = usage_of(reply, stream)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            got = {k: after[k] - before[k] for k in after}
            assert got["isl"] == usage["prompt_tokens"], (path, stream, got, usage)
            assert got["osl"] == usage["completion_tokens"] == 12, (path, stream, got, usage)
            assert got["cached"] == cached, (path, stream, got, usage)
            assert got["ttft_n"] == 1 and got["joined"] == 1, (path, stream, got)


async def test_concurrent_streams_all_come_back_to_zero(stack):
    body = {
        "model": MODEL_NAME,
        "prompt": "Stream with the others.",
        "max_tokens": 16,
        "ignore_eos": True,
        "stream": True,
    }
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        before = await observed(http, stack)
        replies = await asyncio.gather(*(post(http, stack.url + "/v1/completions", body)
                                         for _ in range(12)))  # fmt: skip
        assert [r.status for r in replies] == [200] * 12

        async def released() -> bool:
            return await inflight(http, stack) == 0

        await wait_for(released, 30, "in-flight after 12 concurrent streams")
        after = await observed(http, stack)
    assert after["joined"] - before["joined"] == 12
    assert after["ttft_n"] - before["ttft_n"] == 12
