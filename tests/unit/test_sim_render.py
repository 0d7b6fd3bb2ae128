"""The simulator's render routes over real HTTP: the token ids a request would run with,
without running it (vLLM's /v1/completions/render and /v1/chat/completions/render, which
vllm-router's cache_aware policy asks its workers for)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epp.sim import SimConfig, SimServer
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
