"""Requests through a real Envoy and `epp serve` to the two real vLLM servers."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.real_vllm.conftest import LORA_NAME, MODEL_NAME, Stack
from tests.real_vllm.helpers import TIMEOUT, get_text, post, value, wait_for

pytestmark = pytest.mark.real_vllm


async def endpoints_ready(http: aiohttp.ClientSession, stack: Stack) -> list[dict]:
    rows = json.loads(await get_text(http, f"{stack.epp_metrics_url}/debug/endpoints"))
    return rows


async def test_epp_sees_both_servers_healthy_with_their_model(stack, vllm_pool):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        rows: list[dict] = []

        async def ready() -> bool:
            rows[:] = await endpoints_ready(http, stack)
            want = {s.name: sorted(s.models) for s in vllm_pool.servers}
            return {r["name"]: r["models"] for r in rows if r["healthy"]} == want

        # The EPP polls /v1/models every 5 s.
        await wait_for(ready, 20, lambda: f"/debug/endpoints: {rows}")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_openai_requests_through_envoy_and_epp(stack, api, stream):
    max_tokens = 8
    body: dict = {"model": MODEL_NAME, "max_tokens": max_tokens, "ignore_eos": True}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "Which endpoint should serve me?"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "Which endpoint should serve me?"
        path = "/v1/completions"
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        r = await post(http, stack.url + path, body)
    assert r.status == 200, r.body[:500]
    if not stream:
        reply = r.json()
        choice = reply["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
        assert isinstance(text, str)
        assert reply["model"] == MODEL_NAME
        assert reply["usage"]["completion_tokens"] == max_tokens
        assert choice["finish_reason"] == "length"
        return
    events = r.sse()
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == max_tokens
    finishes = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert finishes[-1] == "length"
    if api == "chat":
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert deltas[0].get("role") == "assistant"


async def test_unknown_model_is_refused_by_the_epp(stack):
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        r = await post(
            http, stack.url + "/v1/completions", {"model": "no-such-model", "prompt": "x"}
        )
    assert r.status == 404, r.body[:300]
    assert "no-such-model" in r.json()["error"]["message"]


def scheduled_counts(page: str) -> dict[str, float]:
    """Successful scheduling attempts per endpoint name, from the EPP's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if (
                s.name == "inference_extension_scheduler_attempts_total"
                and s.labels.get("status") == "success"
            ):
                out[s.labels["pod_name"]] = out.get(s.labels["pod_name"], 0) + s.value
    return out


async def test_each_server_serves_what_the_epp_sent_it(stack, vllm_pool):
    n = 24
    body = {"model": MODEL_NAME, "prompt": "Spread me out.", "max_tokens": 32, "ignore_eos": True}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def served() -> dict[str, float]:
            return {
                s.name: value(
                    await get_text(http, f"{s.url}/metrics"), "vllm:request_success_total"
                )
                for s in vllm_pool.servers
            }

        served_before = await served()
        sched_before = scheduled_counts(await get_text(http, stack.epp_metrics_url + "/metrics"))
        sem = asyncio.Semaphore(8)

        async def one():
            async with sem:
                return await post(http, stack.url + "/v1/completions", body)

        replies = await asyncio.gather(*(one() for _ in range(n)))
        assert [r.status for r in replies] == [200] * n, [r.body[:200] for r in replies]
        sched_after = scheduled_counts(await get_text(http, stack.epp_metrics_url + "/metrics"))
        deltas: dict[str, float] = {}

        async def settled() -> bool:
            after = await served()
            deltas.update({k: after[k] - served_before[k] for k in after})
            return sum(deltas.values()) >= n

        await wait_for(settled, 10, lambda: f"vLLM success counters moved by {deltas}")
    scheduled = {k: v - sched_before.get(k, 0) for k, v in sched_after.items()}
    scheduled = {k: v for k, v in scheduled.items() if v}
    assert sum(deltas.values()) == n
    assert {k: v for k, v in deltas.items() if v} == scheduled


async def test_adapter_requests_go_only_to_the_server_that_has_it(stack, vllm_pool):
    """vllm-1 alone lists the LoRA adapter in /v1/models: the EPP sends it all of them."""
    holders = [s for s in vllm_pool.servers if LORA_NAME in s.models]
    assert len(holders) == 1
    n = 8
    body = {"model": LORA_NAME, "prompt": "Adapter request.", "max_tokens": 4}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def served() -> dict[str, float]:
            return {
                s.name: value(
                    await get_text(http, f"{s.url}/metrics"), "vllm:request_success_total"
                )
                for s in vllm_pool.servers
            }

        before = await served()
        replies = await asyncio.gather(
            *(post(http, stack.url + "/v1/completions", body) for _ in range(n))
        )
        assert [r.status for r in replies] == [200] * n, [r.body[:200] for r in replies]
        assert {r.json()["model"] for r in replies} == {LORA_NAME}
        deltas: dict[str, float] = {}

        async def settled() -> bool:
            after = await served()
            deltas.update({k: after[k] - before[k] for k in after})
            return sum(deltas.values()) >= n

        await wait_for(settled, 10, lambda: f"vLLM success counters moved by {deltas}")
    assert deltas == {s.name: (n if s in holders else 0) for s in vllm_pool.servers}
