"""`epp sim --data-parallel-size N`: N engines behind one port, over real HTTP and ZMQ."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from epp.datalayer.metric_maps import extract, get_engine
from epp.datalayer.promtext import parse
from epp.headers import DATA_PARALLEL_RANK, SIM_DP_RANK
from epp.procs import free_port_range
from epp.sim import SimConfig, SimServer
from epp.sim.config import KVEventsConfig
from tests.unit.test_sim_features import Subscriber

PROMPT = list(range(2000, 2020))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


async def _post(http, url: str, rank: str | None = None, prompt=PROMPT, max_tokens: int = 1):
    headers = {DATA_PARALLEL_RANK: rank} if rank is not None else {}
    body = {"prompt": prompt, "max_tokens": max_tokens}
    async with http.post(url + "/v1/completions", json=body, headers=headers) as resp:
        await resp.read()
        return resp.status, resp.headers.get(SIM_DP_RANK)


def test_the_size_must_be_positive():
    with pytest.raises(ValueError, match="data_parallel_size"):
        SimConfig(data_parallel_size=0)


async def test_the_header_names_the_rank_and_without_it_the_least_loaded_runs(http):
    config = SimConfig(data_parallel_size=3, decode_ms_per_token=1.0, time_scale=20.0)
    async with SimServer("sim-dp", config) as server:
        assert await _post(http, server.url, "2") == (200, "2")
        assert await _post(http, server.url, "0") == (200, "0")
        status, _ = await _post(http, server.url, "3")
        assert status == 400  # out of range, as vLLM refuses it
        assert (await _post(http, server.url, "x"))[0] == 200  # not an int: ignored
        # three long requests at once, no header: each rank gets one (least loaded)
        got = await asyncio.gather(*(_post(http, server.url, max_tokens=200) for _ in range(3)))
        assert sorted(r for _, r in got) == ["0", "1", "2"]
        assert server.engines[2].snapshot().running == 0


async def test_metrics_list_every_rank_under_one_family_and_read_per_rank(http):
    config = SimConfig(data_parallel_size=2, decode_ms_per_token=50.0, time_scale=1.0)
    async with SimServer("sim-dp", config) as server:
        task = asyncio.ensure_future(_post(http, server.url, "1", max_tokens=50))
        for _ in range(200):
            if server.engines[1].snapshot().running:
                break
            await asyncio.sleep(0.01)
        async with http.get(server.url + "/metrics") as resp:
            text = await resp.text()
        assert text.count("# TYPE vllm:num_requests_running gauge") == 1
        emap = get_engine("vllm")
        m = extract("vllm", parse(text, emap.families), 1.0)
        assert [r.rank for r in m.ranks] == [0, 1]
        assert (m.ranks[0].running_requests, m.ranks[1].running_requests) == (0, 1)
        task.cancel()


async def test_each_rank_publishes_its_kv_events_with_its_rank(http):
    port = free_port_range(2)  # rank 1 binds port + 1: both must be free
    events = KVEventsConfig.from_dict(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    )
    config = SimConfig(data_parallel_size=2, kv_events=events, time_scale=20.0)
    async with SimServer("sim-dp", config) as server:
        # a bound endpoint is offset by the rank, as vLLM does: rank 1 binds port + 1
        sub = Subscriber(f"tcp://127.0.0.1:{port + 1}", bind=False)
        try:
            for i in range(100):
                await _post(http, server.url, "1", prompt=[90000 + i] * 17)
                try:
                    _, _, (_, _, rank) = await sub.recv(timeout=0.1)
                    break
                except TimeoutError:
                    continue
            else:
                raise AssertionError("no KV event from rank 1")
            assert rank == 1
            async with http.get(server.url + "/kv_event_sources") as resp:
                sources = await resp.json()
            assert [s["data_parallel_rank"] for s in sources] == [0, 1]
        finally:
            sub.close()
