"""vLLM's `--long-prefill-token-threshold` does what the simulator (and so `epp plan
replay --long-prefill-token-threshold`) models: a prompt sharing the engine with another
request is computed in chunks of at most the threshold, and a prompt alone in the engine
is not capped.

Seen through vLLM's own KV events: a step caches the blocks its chunk filled and
publishes them as one `BlockStored`, so with the threshold equal to the block size a
capped prompt arrives as one block per event and an uncapped one as all its full
blocks in one event. The server is a third one, started with the threshold, so the
tier's two servers keep vLLM's defaults for the other tests.
"""

from __future__ import annotations

import json
import os
import uuid

import aiohttp
import pytest

from epp.datalayer.kv_decode import BlockStored, EventBatch
from epp.datalayer.kvevents import KVEventSubscriber
from epp.datastore import Endpoint
from epp.harness.procs import HttpReady, ProcessGroup, free_port, wait_ready
from epp.tokenizer import HFTokenizer
from tests.real_vllm.conftest import BLOCK_SIZE, MODEL_NAME, SERVE_SCRIPT, STARTUP_TIMEOUT_S
from tests.real_vllm.helpers import TIMEOUT, post, wait_for

pytestmark = pytest.mark.real_vllm

THRESHOLD = BLOCK_SIZE  # a capped step fills exactly one block
NAME = "vllm-chunked"
TEXT = (
    "A long prompt that shares the engine with a decoding request is computed a chunk at "
    "a time, so the decoding request keeps getting a token every step. "
)


@pytest.fixture(scope="module")
def chunked(vllm_pool):
    """(server url, its endpoint, the subscriber's endpoint) for a vLLM server with the
    threshold, publishing KV events where a subscriber of this module binds."""
    port, events = free_port(), f"tcp://127.0.0.1:{free_port()}"
    argv = [
        vllm_pool.python, str(SERVE_SCRIPT),
        "--model", str(vllm_pool.model_dir), "--served-model-name", MODEL_NAME,
        "--port", str(port), "--block-size", str(BLOCK_SIZE), "--max-model-len", "2048",
        "--kv-events", events, "--kv-events-topic", f"kv@127.0.0.1:{port}@{MODEL_NAME}",
        "--cpus", str((os.cpu_count() or 1) - 1),
        "--", "--long-prefill-token-threshold", str(THRESHOLD),
    ]  # fmt: skip
    with ProcessGroup(grace_s=20.0) as pg:
        proc = pg.spawn(NAME, argv)
        url = f"http://127.0.0.1:{port}"
        wait_ready(proc, HttpReady(f"{url}/health"), STARTUP_TIMEOUT_S)
        yield url, Endpoint(NAME, "127.0.0.1", port), events


class Stored:
    """The server's `BlockStored` events, as the EPP's subscriber decodes them."""

    def __init__(self) -> None:
        self.events: list[BlockStored] = []

    def on_batch(self, name: str, model: str, batch: EventBatch) -> None:
        self.events += [ev for ev in batch.events if isinstance(ev, BlockStored)]

    def chain_of(self, ids: list[int]) -> list[BlockStored] | None:
        """The events that stored `ids`' full blocks, in order, once all have arrived."""
        want = ids[: len(ids) // BLOCK_SIZE * BLOCK_SIZE]
        start = next(
            (
                i
                for i, ev in enumerate(self.events)
                if ev.token_ids[:BLOCK_SIZE] == want[:BLOCK_SIZE]
            ),
            None,
        )
        if start is None:
            return None
        chain, tokens = [], []
        for ev in self.events[start:]:
            if tokens == want:
                break
            if ev.token_ids and want[len(tokens) : len(tokens) + len(ev.token_ids)] == ev.token_ids:
                chain.append(ev)
                tokens += ev.token_ids
        return chain if tokens == want else None


async def complete(http: aiohttp.ClientSession, url: str, prompt: str) -> None:
    r = await post(
        http, f"{url}/v1/completions", {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
    )
    assert r.status == 200, r.body[:300]


async def test_a_prompt_beside_a_decode_is_chunked_and_a_lone_one_is_not(vllm_pool, chunked):
    url, endpoint, events = chunked
    stored = Stored()
    tok = HFTokenizer(vllm_pool.tokenizer_json)
    sub = KVEventSubscriber(stored.on_batch, mode="bind", endpoint=events, pool=lambda: [endpoint])
    await sub.start()
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            # The PUB socket connects within its reconnect interval: send short prompts
            # until one's blocks arrive (what is sent before is lost, as PUB/SUB is).
            for _ in range(20):
                probe = f"probe {uuid.uuid4().hex} " + TEXT
                await complete(http, url, probe)
                try:
                    await wait_for(lambda p=probe: stored.chain_of(tok.encode(p)), 1.0, "")
                    break
                except AssertionError:
                    continue
            else:
                pytest.fail(f"no BlockStored from {NAME}; subscriber {dict(sub.stats)}")

            # Alone: the whole prompt in one step, its full blocks in one event.
            alone = f"alone {uuid.uuid4().hex} " + TEXT * 12
            ids = tok.encode(alone)
            assert len(ids) // BLOCK_SIZE >= 8, len(ids)
            await complete(http, url, alone)
            await wait_for(lambda: stored.chain_of(ids), 10.0, "the lone prompt's blocks")
            chain = stored.chain_of(ids)
            assert [len(ev.block_hashes) for ev in chain] == [len(ids) // BLOCK_SIZE]

            # Beside a request that is decoding: one block a step.
            decoding = {
                "model": MODEL_NAME, "prompt": "keep decoding", "max_tokens": 1500,
                "ignore_eos": True, "stream": True,
            }  # fmt: skip
            async with http.post(
                f"{url}/v1/completions",
                data=json.dumps(decoding).encode(),
                headers={"content-type": "application/json"},
            ) as stream:
                assert stream.status == 200
                await stream.content.readline()  # its first token: it is decoding now
                beside = f"beside {uuid.uuid4().hex} " + TEXT * 12
                ids = tok.encode(beside)
                await complete(http, url, beside)
                assert not stream.content.at_eof(), "the decoding request ended first"
                stream.close()
            await wait_for(lambda: stored.chain_of(ids), 10.0, "the shared prompt's blocks")
            chain = stored.chain_of(ids)
            assert [len(ev.block_hashes) for ev in chain] == [1] * (len(ids) // BLOCK_SIZE)
        assert not any(k.startswith("dropped:") for k in sub.stats), dict(sub.stats)
    finally:
        await sub.stop()
