"""The EPP's scraper reads real vLLM metrics into the datastore."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from epp.datalayer.scraper import MetricsScraper
from epp.datastore import Datastore, Endpoint
from tests.real_vllm.conftest import BLOCK_SIZE, MODEL_NAME
from tests.real_vllm.helpers import TIMEOUT, families, get_text, post, wait_for

pytestmark = pytest.mark.real_vllm


async def test_scraper_fills_the_datastore_from_real_servers(vllm_pool):
    eps = [Endpoint(s.name, "127.0.0.1", s.port) for s in vllm_pool.servers]
    ds = Datastore(staleness=2.0)
    ds.set_endpoints(eps)
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        MetricsScraper(ds, interval=0.05, models_interval=0.5) as scraper,
    ):
        await wait_for(
            lambda: all(ds.is_healthy(e.name) and ds.models(e.name) for e in eps),
            15,
            lambda: f"endpoints not healthy with models; scrape failures: {scraper.failing()}",
        )
        for s in vllm_pool.servers:
            page = families(await get_text(http, f"{s.url}/metrics"))
            info = page["vllm:cache_config_info"].samples[0][1]
            m = ds.metrics(s.name)
            assert m is not None
            assert ds.models(s.name) == s.models
            assert m.cache_block_size == BLOCK_SIZE == int(info["block_size"])
            assert m.cache_num_blocks == int(info["num_gpu_blocks"]) > 0
            assert 0.0 <= m.kv_cache_usage <= 1.0
            assert not scraper.failing()

        # Load one server with long generations: the datastore must see it running
        # requests and holding KV blocks, and then see it idle again.
        target = vllm_pool.servers[0]
        body = {
            "model": MODEL_NAME,
            "prompt": "The scraper must see this server busy: " * 8,
            "max_tokens": 200,
            "ignore_eos": True,
        }
        seen = {"running": 0, "kv": 0.0}

        async def watch() -> None:
            while True:
                m = ds.metrics(target.name)
                seen["running"] = max(seen["running"], m.running_requests + m.waiting_queue_size)
                seen["kv"] = max(seen["kv"], m.kv_cache_usage)
                await asyncio.sleep(0.01)

        watcher = asyncio.create_task(watch())
        try:
            replies = await asyncio.gather(
                *(post(http, f"{target.url}/v1/completions", body) for _ in range(8))
            )
        finally:
            watcher.cancel()
        assert [r.status for r in replies] == [200] * 8, replies[0].body[:300]
        assert all(r.json()["usage"]["completion_tokens"] == 200 for r in replies)
        assert seen["running"] >= 1, f"datastore never saw the 8 requests: {seen}"
        assert seen["kv"] > 0.0, f"datastore never saw KV blocks in use: {seen}"
        await wait_for(
            lambda: (
                ds.metrics(target.name).running_requests == 0
                and ds.metrics(target.name).waiting_queue_size == 0
            ),
            10,
            lambda: f"server still busy in the datastore: {ds.metrics(target.name)}",
        )
        assert all(ds.is_healthy(e.name) for e in eps)
