"""The simulator over real HTTP: a server on a free port in this process (and one
`epp sim` subprocess), driven with an aiohttp client.

No test asserts an upper bound on a duration: load is checked by counts (gauges,
`max_running_seen`), and time by model-time lower bounds, which cannot flake.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.headers import SIM_SERVER
from epp.sim import SimCluster, SimConfig, SimServer, count_tokens
from epp.sim.chat import render_default as render_chat
from tests.eventually import eventually

# Fast enough that 16 tokens take ~2 ms of real time.
FAST = SimConfig(decode_ms_per_token=1.0, time_scale=10.0)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    async with SimServer("sim-t", FAST, port=0) as server:
        yield server


async def post(
    http: aiohttp.ClientSession, server: SimServer, path: str, body: Any
) -> tuple[int, dict[str, Any], aiohttp.ClientResponse]:
    async with http.post(server.url + path, json=body) as resp:
        return resp.status, await resp.json(), resp


async def sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """The `data:` payloads of an SSE stream, `[DONE]` kept as the string."""
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def value(text: str, name: str, **labels: str) -> float:
    found = [v for n, lab, v in samples(text) if n == name and labels.items() <= lab.items()]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


async def scrape(http: aiohttp.ClientSession, server: SimServer) -> str:
    async with http.get(server.url + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


# -- completions ---------------------------------------------------------------------


async def test_completion(http: aiohttp.ClientSession, sim: SimServer) -> None:
    body = {"model": "tiny", "prompt": "Hello, world!", "max_tokens": 5}
    status, data, resp = await post(http, sim, "/v1/completions", body)
    assert status == 200
    assert resp.headers[SIM_SERVER] == "sim-t"
    assert "sim_server" not in data
    assert data["object"] == "text_completion"
    assert data["model"] == "tiny"
    [choice] = data["choices"]
    assert choice["finish_reason"] == "length"
    assert count_tokens(choice["text"]) == 5
    assert data["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_completion_defaults_and_batches(http: aiohttp.ClientSession, sim: SimServer) -> None:
    # No model and no max_tokens: the served model, the default length, a natural stop.
    status, data, _ = await post(http, sim, "/v1/completions", {"prompt": "hi"})
    assert status == 200
    assert data["usage"]["completion_tokens"] == 16
    assert data["choices"][0]["finish_reason"] == "stop"

    body = {"prompt": ["a b", "c d e", [1, 2, 3, 4]], "max_tokens": 2}
    status, data, _ = await post(http, sim, "/v1/completions", body)
    assert status == 200
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert data["usage"]["prompt_tokens"] == 2 + 3 + 4
    assert data["usage"]["completion_tokens"] == 6


async def test_completion_stream(http: aiohttp.ClientSession, sim: SimServer) -> None:
    body = {
        "prompt": "one two three",
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers[SIM_SERVER] == "sim-t"
        events = await sse(resp)
    assert events[-1] == "[DONE]"
    tokens, usage = events[:-2], events[-2]
    assert len(tokens) == 7
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None] * 6 + ["length"]
    assert count_tokens("".join(t["choices"][0]["text"] for t in tokens)) == 7
    assert len({t["id"] for t in [*tokens, usage]}) == 1
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == 3
    assert usage["usage"]["completion_tokens"] == 7
    assert usage["usage"]["total_tokens"] == 10

    # Without include_usage, OpenAI (and vLLM) send no usage chunk.
    body = {"prompt": "x", "max_tokens": 3, "stream": True}
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        events = await sse(resp)
    assert len(events) == 4
    assert all("usage" not in e for e in events[:-1])


# -- chat ------------------------------------------------------------------------------

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Describe this picture:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "in five words."},
        ],
    },
]


async def test_chat(http: aiohttp.ClientSession, sim: SimServer) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "max_completion_tokens": 4}
    status, data, resp = await post(http, sim, "/v1/chat/completions", body)
    assert status == 200
    assert resp.headers[SIM_SERVER] == "sim-t"
    assert data["object"] == "chat.completion"
    message = data["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert count_tokens(message["content"]) == 4
    expected_prompt = count_tokens(render_chat(MESSAGES))
    assert expected_prompt > count_tokens("You are terse. Describe this picture: in five words.")
    assert data["usage"]["prompt_tokens"] == expected_prompt
    assert data["usage"]["completion_tokens"] == 4


async def test_chat_stream(http: aiohttp.ClientSession, sim: SimServer) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        events = await sse(resp)
    assert events[-1] == "[DONE]"
    tokens = events[:-2]
    assert len(tokens) == 5
    assert all(t["object"] == "chat.completion.chunk" for t in tokens)
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "role" not in tokens[1]["choices"][0]["delta"]
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 5


# -- other endpoints and errors ----------------------------------------------------------


async def test_models_health_and_lora(http: aiohttp.ClientSession) -> None:
    config = SimConfig(model="base", lora_modules=("sql", "chat"), time_scale=10.0)
    async with SimServer("sim-l", config) as server:
        async with http.get(server.url + "/v1/models") as resp:
            assert resp.headers[SIM_SERVER] == "sim-l"
            data = await resp.json()
        assert data["object"] == "list"
        assert [m["id"] for m in data["data"]] == ["base", "sql", "chat"]
        assert data["data"][1]["parent"] == "base"
        async with http.get(server.url + "/health") as resp:
            assert resp.status == 200
            assert resp.headers[SIM_SERVER] == "sim-l"
        status, data, _ = await post(
            http, server, "/v1/completions", {"model": "sql", "prompt": "x", "max_tokens": 1}
        )
        assert status == 200
        assert data["model"] == "sql"


async def test_errors(http: aiohttp.ClientSession, sim: SimServer) -> None:
    async with http.post(sim.url + "/v1/completions", data=b"{not json") as resp:
        assert resp.status == 400
        assert resp.headers[SIM_SERVER] == "sim-t"
        err = (await resp.json())["error"]
        assert set(err) >= {"message", "type", "code"}
        assert err["code"] == 400
        assert err["type"] == "BadRequestError"

    status, data, _ = await post(http, sim, "/v1/completions", {"model": "gpt-9", "prompt": "x"})
    assert status == 404
    assert data["error"]["code"] == 404
    assert "gpt-9" in data["error"]["message"]

    bad_bodies = [
        ("/v1/completions", [1, 2]),
        ("/v1/completions", {"prompt": 5}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}),
        ("/v1/completions", {"prompt": "x", "stream": "yes"}),
        ("/v1/chat/completions", {"messages": []}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 100_000}),  # > context
    ]
    for path, body in bad_bodies:
        status, data, _ = await post(http, sim, path, body)
        assert status == 400, body
        assert data["error"]["type"] == "BadRequestError"

    async with http.get(sim.url + "/nope") as resp:
        assert resp.status == 404
        assert resp.headers[SIM_SERVER] == "sim-t"


# -- metrics -----------------------------------------------------------------------------

GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = [
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
]
HISTOGRAMS = [
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
]


async def test_metrics_names_and_labels(http: aiohttp.ClientSession, sim: SimServer) -> None:
    async with http.get(sim.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        assert resp.headers[SIM_SERVER] == "sim-t"
        text = await resp.text()
    base = {"model_name": "tiny", "engine": "0"}
    for name in GAUGES + COUNTERS:
        assert value(text, name, **base) == 0.0
    for name in HISTOGRAMS:
        assert value(text, name + "_count", **base) == 0.0
    assert value(text, "vllm:request_success_total", finish_reason="length", **base) == 0.0
    assert (
        value(
            text,
            "vllm:cache_config_info",
            block_size="16",
            num_gpu_blocks=str(65536 // 16),
            enable_prefix_caching="True",
            **base,
        )
        == 1.0
    )
    lora_value = value(
        text,
        "vllm:lora_requests_info",
        max_lora="1",
        running_lora_adapters="",
        waiting_lora_adapters="",
    )
    assert abs(lora_value - time.time()) < 600  # a unix timestamp


async def test_metrics_count_requests(http: aiohttp.ClientSession, sim: SimServer) -> None:
    for prompt in ["a b c", "d e f g h"]:
        status, _, _ = await post(http, sim, "/v1/completions", {"prompt": prompt, "max_tokens": 4})
        assert status == 200
    text = await scrape(http, sim)
    assert value(text, "vllm:prompt_tokens_total") == 8
    assert value(text, "vllm:prefix_cache_queries_total") == 8
    assert value(text, "vllm:prefix_cache_hits_total") == 0
    assert value(text, "vllm:generation_tokens_total") == 8
    assert value(text, "vllm:request_success_total", finish_reason="length") == 2
    assert value(text, "vllm:time_to_first_token_seconds_count") == 2
    assert value(text, "vllm:inter_token_latency_seconds_count") == 2 * 3
    assert value(text, "vllm:e2e_request_latency_seconds_count") == 2
    # Three decode steps of 1 ms model time each come after the first token.
    assert value(text, "vllm:e2e_request_latency_seconds_sum") >= 2 * 0.003
    state = sim.admin_state()
    assert state["stats"]["requests_succeeded"] == 2
    assert state["stats"]["completion_tokens"] == 8


async def test_gauges_follow_load_and_abort_frees(http: aiohttp.ClientSession) -> None:
    # One slot, three long streams: one runs, two wait. Then the clients leave.
    config = SimConfig(max_num_seqs=1, decode_ms_per_token=10.0)
    async with SimServer("sim-q", config) as server:
        body = {"prompt": "x " * 100, "max_tokens": 10_000, "stream": True}
        clients = [aiohttp.ClientSession() for _ in range(3)]
        streams: list[aiohttp.ClientResponse] = []
        try:
            for c in clients:
                streams.append(await c.post(server.url + "/v1/completions", json=body))
            assert all(s.status == 200 for s in streams)

            async def loaded() -> bool:
                text = await scrape(http, server)
                return (
                    value(text, "vllm:num_requests_running") == 1
                    and value(text, "vllm:num_requests_waiting") == 2
                    and value(text, "vllm:kv_cache_usage_perc") > 0
                )

            await eventually(loaded)
            assert server.engine.max_running_seen == 1
        finally:
            for s in streams:
                s.close()
            for c in clients:
                await c.close()

        async def drained() -> bool:
            text = await scrape(http, server)
            return (
                value(text, "vllm:num_requests_running") == 0
                and value(text, "vllm:num_requests_waiting") == 0
                and value(text, "vllm:kv_cache_usage_perc") == 0
            )

        await eventually(drained)
        assert server.stats.requests_aborted == 3
        assert server.stats.requests_succeeded == 0


async def test_max_num_seqs_holds(http: aiohttp.ClientSession) -> None:
    config = SimConfig(max_num_seqs=2, decode_ms_per_token=2.0, time_scale=4.0)
    async with SimServer("sim-m", config) as server:
        body = {"prompt": "hello there", "max_tokens": 8}
        results = await asyncio.gather(
            *(post(http, server, "/v1/completions", body) for _ in range(7))
        )
        assert [status for status, _, _ in results] == [200] * 7
        assert server.engine.max_running_seen == 2
        text = await scrape(http, server)
        assert value(text, "vllm:request_success_total", finish_reason="length") == 7


async def test_waiting_request_of_departed_client_is_dropped(
    http: aiohttp.ClientSession,
) -> None:
    config = SimConfig(max_num_seqs=1, decode_ms_per_token=10.0)
    async with SimServer("sim-d", config) as server:
        long_body = {"prompt": "x", "max_tokens": 10_000, "stream": True}
        async with http.post(server.url + "/v1/completions", json=long_body) as first:
            assert first.status == 200
            timeout = aiohttp.ClientTimeout(total=0.3)
            with pytest.raises(asyncio.TimeoutError):
                await http.post(
                    server.url + "/v1/completions",
                    json={"prompt": "y", "max_tokens": 2},
                    timeout=timeout,
                )

            async def dropped() -> bool:
                return server.engine.snapshot().waiting == 0

            await eventually(dropped)
            assert server.engine.snapshot().running == 1


# -- faults --------------------------------------------------------------------------------


async def test_admin_delay(http: aiohttp.ClientSession) -> None:
    async with SimServer("sim-a", SimConfig(time_scale=10.0)) as server:
        status, state, _ = await post(http, server, "/admin", {"delay_ms": 500})
        assert status == 200
        assert state["faults"]["delay_ms"] == 500
        status, _, _ = await post(http, server, "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 200
        text = await scrape(http, server)
        # Model time: 0.5 s of delay shows up in full although only ~50 ms passed.
        assert value(text, "vllm:time_to_first_token_seconds_sum") >= 0.5
        assert value(text, "vllm:request_queue_time_seconds_sum") >= 0.5


async def test_admin_fail_rate(http: aiohttp.ClientSession, sim: SimServer) -> None:
    await post(http, sim, "/admin", {"fail_rate": 1.0})
    status, data, resp = await post(http, sim, "/v1/completions", {"prompt": "x"})
    assert status == 500
    assert resp.headers[SIM_SERVER] == "sim-t"
    assert data["error"]["code"] == 500

    await post(http, sim, "/admin", {"fail_rate": 0.5})
    body = {"prompt": "x", "max_tokens": 1}
    statuses = [(await post(http, sim, "/v1/completions", body))[0] for _ in range(40)]
    assert set(statuses) == {200, 500}  # seeded: the same split on every run
    async with http.get(sim.url + "/admin") as resp:
        state = await resp.json()
    assert state["stats"]["requests_failed"] == 1 + statuses.count(500)
    assert state["stats"]["requests_succeeded"] == statuses.count(200)


async def test_admin_metrics_off_hangs(http: aiohttp.ClientSession, sim: SimServer) -> None:
    await post(http, sim, "/admin", {"metrics": False})
    with pytest.raises(asyncio.TimeoutError):
        await http.get(sim.url + "/metrics", timeout=aiohttp.ClientTimeout(total=0.3))
    assert sim.stats.metrics_hung == 1
    sim.set_faults(metrics=True)  # the Python API, same effect as POST /admin
    await scrape(http, sim)

    # A scrape hanging when the server stops must not hold up shutdown.
    async with SimServer("sim-h", FAST) as server:
        server.set_faults(metrics=False)
        hung = asyncio.ensure_future(http.get(server.url + "/metrics"))
        await eventually(lambda: server.stats.metrics_hung == 1)
    with pytest.raises(aiohttp.ClientError):
        await hung


async def test_admin_fixed_queue_health_and_validation(
    http: aiohttp.ClientSession, sim: SimServer
) -> None:
    await post(http, sim, "/admin", {"fixed_queue": 7, "healthy": False})
    assert value(await scrape(http, sim), "vllm:num_requests_waiting") == 7
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 503
    await post(http, sim, "/admin", {"fixed_queue": None, "healthy": True})
    assert value(await scrape(http, sim), "vllm:num_requests_waiting") == 0

    for bad in [{"nonsense": 1}, {"fail_rate": 2}, {"delay_ms": -1}, {"metrics": "no"}, [1]]:
        status, data, _ = await post(http, sim, "/admin", bad)
        assert status == 400, bad
        assert "error" in data
    assert sim.faults.fail_rate == 0.0  # a rejected update changes nothing


async def test_time_scale_keeps_model_time(http: aiohttp.ClientSession) -> None:
    # 2000 prompt tokens at 1 ms each: 2 s of model time, 20 ms of real time.
    config = SimConfig(prefill_ms_per_token=1.0, time_scale=100.0)
    async with SimServer("sim-s", config) as server:
        slept: list[tuple[float, float]] = []  # (model, real) seconds of each engine sleep
        sleep = server.clock.sleep

        async def recorded(model_s: float) -> None:
            slept.append((model_s, server.clock.to_real(model_s)))
            await sleep(model_s)

        server.clock.sleep = recorded  # type: ignore[method-assign]
        body = {"prompt": "x " * 2000, "max_tokens": 1}
        status, data, _ = await post(http, server, "/v1/completions", body)
        assert status == 200
        assert data["usage"]["prompt_tokens"] == 2000
        text = await scrape(http, server)
    assert value(text, "vllm:time_to_first_token_seconds_sum") >= 2.0
    # ... and the engine slept 1/100 of its model time in real time (time_scale's promise)
    model, real = (sum(x) for x in zip(*slept, strict=True))
    assert model >= 2.0 and real == pytest.approx(model / 100)


# -- many servers ----------------------------------------------------------------------


async def test_cluster(http: aiohttp.ClientSession) -> None:
    async with SimCluster(n=3, config=FAST) as cluster:
        assert [s.name for s in cluster] == ["sim-0", "sim-1", "sim-2"]
        assert len(set(cluster.ports)) == 3
        assert all(p > 0 for p in cluster.ports)
        cluster[1].set_faults(fail_rate=1.0)
        for server in cluster:
            status, _, resp = await post(http, server, "/v1/completions", {"prompt": "x"})
            assert resp.headers[SIM_SERVER] == server.name
            assert status == (500 if server.name == "sim-1" else 200)
        assert cluster.by_name("sim-2").stats.requests_succeeded == 1

    slow = SimConfig(decode_ms_per_token=50.0)
    async with SimCluster(configs=[FAST, slow], name_prefix="pod") as cluster:
        assert [s.name for s in cluster] == ["pod-0", "pod-1"]
        assert cluster[1].config.decode_ms_per_token == 50.0


async def test_cli_subprocess() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "epp.cli",
        "sim",
        "--replicas",
        "2",
        "--port",
        "0",
        "--time-scale",
        "10",
        "--name-prefix",
        "sub",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        urls = {}
        for _ in range(2):
            line = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().split()
            assert line[:2] == ["sim", line[1]] and line[2:4] == ["listening", "on"], line
            urls[line[1]] = line[4]
        assert set(urls) == {"sub-0", "sub-1"}
        async with aiohttp.ClientSession() as http:
            for name, url in urls.items():
                body = {"prompt": "hi", "max_tokens": 2}
                async with http.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    assert resp.headers[SIM_SERVER] == name
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 5) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
