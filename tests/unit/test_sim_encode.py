"""The simulator's encode role: per-item encode time, the encoder cache, the route."""

import json

import pytest

from epp.sim.clock import ModelClock
from epp.sim.config import SimConfig
from epp.sim.encode import Encoder
from epp.sim.server import SimServer


class RecordingClock(ModelClock):
    def __init__(self) -> None:
        super().__init__(1000.0)
        self.slept: list[float] = []

    async def sleep(self, model_seconds: float) -> None:
        self.slept.append(model_seconds)


async def test_each_uncached_item_costs_its_encode_time_once():
    clock = RecordingClock()
    enc = Encoder(clock, ms_per_item=40.0, capacity=2)
    assert await enc.encode(["a", "b", "a"]) == (2, 1)  # a repeated item is encoded once
    assert clock.slept == [pytest.approx(0.08)]
    assert await enc.encode(["a", "b"]) == (0, 2)  # all cached: no time
    assert clock.slept == [pytest.approx(0.08)]
    assert await enc.encode(["c"]) == (1, 0)  # evicts a, the least recently used
    assert await enc.encode(["a"]) == (1, 0)
    assert await enc.encode([]) == (0, 0)


def test_bad_encode_settings_are_refused():
    with pytest.raises(ValueError, match="ec_role"):
        SimConfig(ec_role="encoder")
    with pytest.raises(ValueError, match="encoder_cache_items"):
        SimConfig(encoder_cache_items=0)
    with pytest.raises(ValueError, match="latencies"):
        SimConfig(encode_ms_per_item=-1)


async def test_an_encode_server_answers_one_token_and_counts_items():
    import aiohttp

    server = SimServer("enc", SimConfig(ec_role="encode", time_scale=1000.0), port=0)
    await server.start()
    try:
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}
        body = {
            "model": server.config.model,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}],
        }
        async with aiohttp.ClientSession() as s:
            for _ in range(2):
                async with s.post(server.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    answer = json.loads(await r.read())
        assert answer["usage"]["completion_tokens"] == 1
        assert server.stats.mm_items_encoded == 1 and server.stats.encoder_cache_hits == 1
        assert server.engine.snapshot().running == 0  # never entered the engine
    finally:
        await server.stop()
