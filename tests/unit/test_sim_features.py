"""The simulator's vLLM features over real HTTP and real ZMQ: KV events (both socket
modes, both encodings), prefix-cache hits in responses, LoRA adapters, P/D legs,
presets and the CLI's configuration layers."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from epp.harness.procs import free_port, free_port_range
from epp.sim import SimCluster, SimConfig, SimServer, cli, config_for
from epp.sim.config import KVEventsConfig
from epp.sim.kv_events import encode_batch, encode_event
from epp.sim.kvcache import NONE_HASH, AllBlocksCleared, BlockRemoved, external_hash, hash_block
from epp.sim.presets import PRESETS
from tests.unit.test_sim import samples, scrape, value

FAST = SimConfig(decode_ms_per_token=1.0, time_scale=20.0)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as resp:
        if resp.content_type == "application/json":
            return resp.status, await resp.json()
        return resp.status, await resp.text()


# -- KV events -------------------------------------------------------------------------


def test_event_encodings() -> None:
    removed = BlockRemoved([5], "GPU")
    assert encode_event(removed) == {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}
    assert encode_event(removed, "array") == ["BlockRemoved", [5], "GPU"]
    assert encode_event(AllBlocksCleared()) == {"type": "AllBlocksCleared"}
    assert encode_event(AllBlocksCleared(), "array") == ["AllBlocksCleared"]
    ts, events, rank = msgpack.unpackb(encode_batch(1.5, [removed], 0, "array"))
    assert (ts, events, rank) == (1.5, [["BlockRemoved", [5], "GPU"]], 0)


class Subscriber:
    """A SUB socket plus the dance around ZMQ's slow joiner: messages published before
    the subscription reaches the publisher are lost, so warm up with throwaway requests."""

    def __init__(self, endpoint: str, bind: bool) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sock.setsockopt(zmq.LINGER, 0)
        (self.sock.bind if bind else self.sock.connect)(endpoint)
        self.last_seq = -1

    async def recv(self, timeout: float = 5.0) -> tuple[str, int, Any]:
        frames = await asyncio.wait_for(self.sock.recv_multipart(), timeout)
        assert len(frames) == 3
        topic, seq, payload = frames
        assert len(seq) == 8
        self.last_seq = int.from_bytes(seq, "big")
        return topic.decode(), self.last_seq, msgpack.unpackb(payload)

    async def warm_up(self, http: aiohttp.ClientSession, url: str) -> None:
        for i in range(100):
            await post(http, url + "/v1/completions", {"prompt": [90000 + i] * 17, "max_tokens": 1})
            try:
                await self.recv(timeout=0.1)
                return
            except TimeoutError:
                continue
        raise AssertionError("no KV event arrived")

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


PROMPT = list(range(1000, 1020))  # 20 tokens: one full block of 16, then 4 more


async def test_kv_events_bind_mode_map_format(http: aiohttp.ClientSession) -> None:
    port = free_port()
    events = KVEventsConfig.from_dict(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    )
    async with SimServer("sim-e", SimConfig(kv_events=events, time_scale=20.0)) as server:
        sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=False)  # the server binds
        try:
            await sub.warm_up(http, server.url)
            before = sub.last_seq
            status, _ = await post(
                http, server.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1}
            )
            assert status == 200
            topic, seq, (ts, batch, rank) = await sub.recv()
            assert topic == f"kv@127.0.0.1:{server.port}@tiny"
            assert seq == before + 1
            assert abs(ts - time.time()) < 60 and rank == 0
            digest = hash_block(NONE_HASH, PROMPT[:16])
            assert batch == [
                {
                    "type": "BlockStored",
                    "block_hashes": [external_hash(digest)],
                    "parent_block_hash": None,
                    "token_ids": PROMPT[:16],
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                }
            ]
            async with http.post(server.url + "/reset_prefix_cache") as resp:
                assert resp.status == 200
            assert (await sub.recv())[2][1] == [{"type": "AllBlocksCleared"}]
            async with http.get(server.url + "/kv_event_sources") as resp:
                assert await resp.json() == [
                    {
                        "data_parallel_rank": 0,
                        "endpoint": f"tcp://127.0.0.1:{port}",
                        "replay_endpoint": None,
                        "topic": topic,
                    }
                ]
        finally:
            sub.close()


async def test_kv_events_connect_mode_array_format_with_lora(http: aiohttp.ClientSession) -> None:
    port = free_port()
    sub = Subscriber(f"tcp://127.0.0.1:{port}", bind=True)  # the subscriber binds
    events = KVEventsConfig.from_dict(
        {
            "enable_kv_cache_events": True,
            "endpoint": f"tcp://127.0.0.1:{port}",
            "topic": "kv@{host}:{port}@{model}-custom",
        }
    )
    config = SimConfig(
        kv_events=events, kv_events_format="array", lora_modules=("sql",), time_scale=20.0
    )
    try:
        async with SimServer("sim-c", config) as server:
            await sub.warm_up(http, server.url)
            body = {"model": "sql", "prompt": PROMPT, "max_tokens": 1}
            assert (await post(http, server.url + "/v1/completions", body))[0] == 200
            topic, _, (_, batch, _) = await sub.recv()
            assert topic == f"kv@127.0.0.1:{server.port}@tiny-custom"
            digest = hash_block(NONE_HASH, PROMPT[:16], b"\x00lora:sql")
            assert batch == [
                ["BlockStored", [external_hash(digest)], None, PROMPT[:16], 16, 1, "GPU", "sql"]
            ]
    finally:
        sub.close()


async def test_replicas_get_their_own_topics_and_bound_ports() -> None:
    base = free_port_range(2)  # replica i binds base + i
    bind = KVEventsConfig.from_dict({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{base}"})
    async with SimCluster(n=2, config=SimConfig(kv_events=bind)) as cluster:
        sources = [s.publisher.source() for s in cluster if s.publisher]
    assert [s["endpoint"] for s in sources] == [
        f"tcp://127.0.0.1:{base}",
        f"tcp://127.0.0.1:{base + 1}",
    ]
    assert sources[0]["topic"] != sources[1]["topic"]


# -- prefix caching over HTTP -------------------------------------------------------------


async def test_cached_tokens_in_usage_and_metrics(http: aiohttp.ClientSession) -> None:
    async with SimServer("sim-p", FAST) as server:
        body = {"prompt": list(range(40)), "max_tokens": 2}
        _, first = await post(http, server.url + "/v1/completions", body)
        _, second = await post(http, server.url + "/v1/completions", body)
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        # 40 tokens = 2 full blocks of 16 + 8; both full blocks hit, never the last token.
        assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
        assert second["kv_transfer_params"] is None
        text = await scrape(http, server)
        assert value(text, "vllm:prefix_cache_queries_total") == 80
        assert value(text, "vllm:prefix_cache_hits_total") == 32
        assert value(text, "vllm:request_prompt_tokens_count") == 2
        assert value(text, "vllm:request_prompt_tokens_sum") == 80
        assert value(text, "vllm:request_generation_tokens_sum") == 4
        assert value(text, "vllm:num_preemptions_total") == 0
        assert server.admin_state()["stats"]["cached_tokens"] == 32


# -- LoRA ---------------------------------------------------------------------------------


async def test_lora_load_unload_and_load_time(http: aiohttp.ClientSession) -> None:
    config = SimConfig(model="base", lora_modules=("sql=/a/sql",), lora_load_ms=300.0,
                       time_scale=30.0)  # fmt: skip
    async with SimServer("sim-l", config) as server:
        url = server.url
        status, text = await post(
            http, url + "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": "/a/chat"}
        )
        assert (status, text) == (200, "Success: LoRA adapter 'chat' added successfully.")
        status, err = await post(
            http, url + "/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": "/a/chat"}
        )
        assert status == 400 and "already been loaded" in err["error"]["message"]
        assert (await post(http, url + "/v1/load_lora_adapter", {"lora_name": "x"}))[0] == 400
        async with http.get(url + "/v1/models") as resp:
            models = (await resp.json())["data"]
        assert [(m["id"], m["root"], m["parent"]) for m in models] == [
            ("base", "base", None),
            ("sql", "/a/sql", "base"),
            ("chat", "/a/chat", "base"),
        ]
        for _ in range(2):
            body = {"model": "chat", "prompt": "hi", "max_tokens": 1}
            assert (await post(http, url + "/v1/completions", body))[0] == 200
        text = await scrape(http, server)
        # The first request waited for the adapter's load (300 ms model time); the second
        # found it resident.
        assert value(text, "vllm:time_to_first_token_seconds_sum") >= 0.3
        assert server.admin_state()["engine"]["lora_loads"] == 1
        status, text = await post(http, url + "/v1/unload_lora_adapter", {"lora_name": "chat"})
        assert (status, text) == (200, "Success: LoRA adapter 'chat' removed successfully.")
        status, err = await post(http, url + "/v1/unload_lora_adapter", {"lora_name": "chat"})
        assert status == 404
        body = {"model": "chat", "prompt": "hi"}
        assert (await post(http, url + "/v1/completions", body))[0] == 404


async def test_lora_requests_info_shows_waiting_adapter(http: aiohttp.ClientSession) -> None:
    config = SimConfig(lora_modules=("a", "b"), max_loras=1, decode_ms_per_token=50.0)
    async with SimServer("sim-w", config) as server:
        long = asyncio.ensure_future(
            post(
                http,
                server.url + "/v1/completions",
                {"model": "a", "prompt": "x", "max_tokens": 40},
            )
        )
        held = asyncio.ensure_future(
            post(
                http, server.url + "/v1/completions", {"model": "b", "prompt": "y", "max_tokens": 1}
            )
        )
        try:
            for _ in range(200):
                snap = server.engine.snapshot()
                if snap.running == 1 and snap.waiting == 1:
                    break
                await asyncio.sleep(0.01)
            text = await scrape(http, server)
            series = [lab for n, lab, _ in samples(text) if n == "vllm:lora_requests_info"]
            assert {"max_lora": "1", "running_lora_adapters": "a",
                    "waiting_lora_adapters": "b"}.items() <= series[-1].items()  # fmt: skip
        finally:
            long.cancel()
            held.cancel()


# -- P/D ----------------------------------------------------------------------------------


async def test_prefill_then_decode(http: aiohttp.ClientSession) -> None:
    prompt = " ".join(f"w{i}" for i in range(100))  # 100 tokens
    prefill_cfg = SimConfig(kv_role="prefill", time_scale=20.0)
    decode_cfg = SimConfig(kv_role="decode", kv_transfer_ms_per_token=2.0, time_scale=20.0)
    async with SimServer("pre", prefill_cfg) as pre, SimServer("dec", decode_cfg) as dec:
        leg1 = {
            "prompt": prompt,
            "max_tokens": 1,
            "kv_transfer_params": {
                "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None,
            },
        }  # fmt: skip
        status, answer = await post(http, pre.url + "/v1/completions", {**leg1, "max_tokens": 9})
        assert status == 200
        assert answer["usage"]["completion_tokens"] == 1  # stopped after prefill
        assert answer["choices"][0]["finish_reason"] == "length"
        params = answer["kv_transfer_params"]
        assert params == {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": params["remote_block_ids"],
            "remote_engine_id": pre.engine_id,
            "remote_host": "127.0.0.1",
            "remote_port": pre.port,
            "tp_size": 1,
        }
        assert len(params["remote_block_ids"]) == 7  # 101 tokens in blocks of 16
        assert all(isinstance(b, int) for b in params["remote_block_ids"])

        leg2 = {"prompt": prompt, "max_tokens": 5, "kv_transfer_params": params}
        status, answer = await post(http, dec.url + "/v1/completions", leg2)
        assert status == 200 and answer["usage"]["completion_tokens"] == 5
        assert answer["kv_transfer_params"] is None
        state = dec.admin_state()
        assert state["stats"]["kv_transfer"] == {
            "do_remote_decode": 0, "do_remote_prefill": 1, "other": 0,
        }  # fmt: skip
        # The decoder computed only the last prompt token, after pulling 99 tokens' KV
        # (2 ms each of model time), then decoded.
        assert state["engine"]["max_batched_tokens_seen"] == 1
        text = await scrape(http, dec)
        assert value(text, "vllm:time_to_first_token_seconds_sum") >= 0.198
        assert pre.admin_state()["stats"]["kv_transfer"]["do_remote_decode"] == 1

        # A server without that role serves such a request as a normal one, and counts it.
        status, answer = await post(http, pre.url + "/v1/completions", leg2)
        assert status == 200 and answer["usage"]["completion_tokens"] == 5
        assert pre.admin_state()["stats"]["kv_transfer"]["do_remote_prefill"] == 1
        status, answer = await post(http, dec.url + "/v1/completions", leg1)
        assert answer["kv_transfer_params"] is None
        body = {"prompt": "x", "kv_transfer_params": {"something": "else"}}
        await post(http, dec.url + "/v1/completions", body)
        assert dec.admin_state()["stats"]["kv_transfer"]["other"] == 1


# -- presets and the CLI ------------------------------------------------------------------


def test_presets_cite_their_sources() -> None:
    for preset in PRESETS.values():
        assert preset.sources, preset.name
        config = config_for(preset.name)
        assert config.preset == preset.name
    big = config_for("llama-3.1-8b-h100", max_num_seqs=64)
    assert (big.max_num_seqs, big.max_num_batched_tokens, big.batch_slowdown) == (64, 8192, 1.0)
    assert config_for("70b-4xh100").kv_capacity_tokens == 461_376
    with pytest.raises(ValueError, match="unknown preset"):
        config_for("gpt-9")


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_layers_defaults_preset_and_flags() -> None:
    plain = cli.config_from_args(args())
    assert plain == SimConfig()
    config = cli.config_from_args(
        args("--preset", "tiny", "--max-num-seqs", "3", "--num-gpu-blocks", "100",
             "--lora-modules", "a=/x", "b", "--kv-role", "decode")
    )  # fmt: skip
    assert (config.preset, config.max_num_seqs, config.kv_capacity_tokens) == ("tiny", 3, 1600)
    assert config.step_base_ms == PRESETS["tiny"].values["step_base_ms"]
    assert (config.lora_modules, config.kv_role) == (("a=/x", "b"), "decode")
    events = json.dumps({"enable_kv_cache_events": True, "topic": "kv@fixed"})
    config = cli.config_from_args(args("--kv-events-config", events, "--kv-events-format", "array"))
    assert config.kv_events is not None and config.kv_events.topic == "kv@fixed"
    for bad in [
        ("--kv-events-config", "{nope"),
        ("--kv-events-config", events, "--replicas", "2"),  # one topic for two servers
        ("--num-gpu-blocks", "4", "--kv-capacity-tokens", "64"),
    ]:
        with pytest.raises(ValueError):
            cli.config_from_args(args(*bad))


async def test_tiny_preset_and_hf_tokenizer(http: aiohttp.ClientSession, tmp_path: Any) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog"] * 50,
        trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"]),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    config = config_for("tiny", tokenizer=str(tmp_path / "tokenizer.json"), time_scale=20.0)
    async with SimServer("sim-hf", config) as server:
        text = "the lazy dog jumps"
        _, data = await post(
            http, server.url + "/v1/completions", {"prompt": text, "max_tokens": 2}
        )
        expected = len(tok.encode(text, add_special_tokens=False).ids)
        assert data["usage"]["prompt_tokens"] == expected


def test_jinja_chat_template(tmp_path: Any) -> None:
    from epp.sim.chat import load_renderer

    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]"
                "{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
            }
        )
    )
    render = load_renderer(str(tmp_path))
    assert render([{"role": "user", "content": "hi"}]) == "<s>[user]hi[assistant]"
