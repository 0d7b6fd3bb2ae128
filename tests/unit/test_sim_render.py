"""What vllm-router needs from the simulator, over real HTTP and ZMQ: the render routes
(the token ids a request would run with, without running it: vLLM's /v1/completions/render
and /v1/chat/completions/render, which its cache_aware policy asks every worker for) and
KV events under the empty topic (its --kv-event-source subscribes to exactly that)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from epp.harness.procs import free_port
from epp.sim import SimConfig, SimServer
from epp.sim.config import KVEventsConfig
from epp.tokenizer import SimpleTokenizer

FAST = SimConfig(decode_ms_per_token=1.0, time_scale=20.0)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_completion_render_gives_the_ids_the_request_runs_with(
    http: aiohttp.ClientSession,
) -> None:
    async with SimServer("sim-r", FAST) as server:
        prompt = "abc def, ghi"
        status, got = await post(
            http,
            server.url + "/v1/completions/render",
            {"model": "tiny", "prompt": [prompt, [7, 8, 9]], "max_tokens": 3},
        )
        assert status == 200
        # One GenerateRequest per prompt, ids from the server's own tokenizer:
        # "abc", "def", ",", "ghi" = 4 tokens; a token-id prompt passes through.
        ids = SimpleTokenizer().encode(prompt)
        assert len(ids) == 4
        assert [g["token_ids"] for g in got] == [ids, [7, 8, 9]]
        assert [g["sampling_params"]["max_tokens"] for g in got] == [3, 3]
        assert got[0]["request_id"] != got[1]["request_id"]
        # Rendering runs nothing: no request reached the engine.
        assert server.admin_state()["stats"]["requests_received"] == 0


async def test_chat_render_is_the_rendered_chat_the_server_tokenizes(
    http: aiohttp.ClientSession,
) -> None:
    async with SimServer("sim-r", FAST) as server:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]}
        status, got = await post(http, server.url + "/v1/chat/completions/render", body)
        assert status == 200
        expected = SimpleTokenizer().encode(server.render(body["messages"]))
        assert got["token_ids"] == expected and expected


async def test_render_validates_like_the_inference_routes(http: aiohttp.ClientSession) -> None:
    async with SimServer("sim-r", FAST) as server:
        status, got = await post(
            http, server.url + "/v1/completions/render", {"model": "other", "prompt": "x"}
        )
        assert status == 404 and "other" in got["error"]["message"]


async def test_null_kv_events_topic_publishes_the_empty_topic(
    http: aiohttp.ClientSession,
) -> None:
    """`"topic": null`: messages go out under the empty topic (vLLM's default), the one
    vllm-router's --kv-event-source subscribes to; "" keeps the llm-d convention."""
    port = free_port()
    raw = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    events = KVEventsConfig.from_dict({**raw, "topic": None})
    assert KVEventsConfig.from_dict(raw).topic == ""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        async with SimServer("sim-t", SimConfig(kv_events=events, time_scale=20.0)) as server:
            async with http.get(server.url + "/kv_event_sources") as resp:
                assert (await resp.json())[0]["topic"] == ""
            for i in range(100):  # the slow joiner: until one message gets through
                body = {"prompt": [5000 + i] * 17, "max_tokens": 1}
                await post(http, server.url + "/v1/completions", body)
                try:
                    frames = await asyncio.wait_for(sock.recv_multipart(), 0.1)
                    break
                except TimeoutError:
                    continue
            else:
                raise AssertionError("no KV event arrived")
            assert frames[0] == b""
            assert msgpack.unpackb(frames[2])[1][0]["type"] == "BlockStored"
    finally:
        sock.close()
        ctx.term()
