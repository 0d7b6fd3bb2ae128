"""The EPP's KV-event subscriber receives and decodes real vLLM events.

Both servers were started with `--kv-events-config` pointing at one `tcp://127.0.0.1:PORT`
(no `*`), so their PUB sockets *connect* there and the EPP's subscriber *binds* it
(`KVEventSubscriber(mode="bind")`), telling the servers apart by topic
(`kv@127.0.0.1:<port>@tiny`). Decoded `BlockStored` events must carry exactly the
prompt's token ids (as the shared tokenizer cuts them) in 32-token blocks; fed into the
precise prefix index they must make the prompt's blocks findable on the server that
served it, and only there. On the small-cache server, evictions (`BlockRemoved`) and a
cache reset (`AllBlocksCleared`) must reach the index so that its prediction of the
server's cache hit equals what the server then reports (`cached_tokens`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from epp.datalayer.kv_decode import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epp.datalayer.kvevents import KVEventSubscriber
from epp.datastore import Endpoint
from epp.tokenizer import HFTokenizer
from plugins.prefix.hashing import chain_seed, chain_tokens
from plugins.prefix.precise_index import PreciseIndex
from tests.real_vllm.conftest import BLOCK_SIZE, LORA_NAME, MODEL_NAME, VllmServer
from tests.real_vllm.helpers import TIMEOUT, post, wait_for

pytestmark = pytest.mark.real_vllm

TEXT = (
    "Routing a request to the server that already holds its prefix saves the prefill of "
    "every cached block, which is why the endpoint picker listens to the KV events each "
    "model server publishes about its cache. Every stored block carries its token ids, "
    "so the picker can key it by its own hash and find it again when a request with the "
    "same prefix arrives. "
)


def prompt_for(tag: str, repeat: int = 1) -> str:
    """A prompt of a few blocks that no other request has sent (unique first block)."""
    return f"{tag} {uuid.uuid4().hex} " + TEXT * repeat


@dataclass
class Harness:
    """The EPP's subscriber bound where both servers publish, feeding a precise index."""

    sub: KVEventSubscriber
    index: PreciseIndex
    tok: HFTokenizer
    http: aiohttp.ClientSession
    received: list[tuple[str, str, EventBatch]] = field(default_factory=list)

    def events(self, server: VllmServer, kind: type) -> list:
        return [
            ev
            for name, _, batch in self.received
            if name == server.name
            for ev in batch.events
            if isinstance(ev, kind)
        ]

    def own_hashes(self, ids: list[int]) -> list[int]:
        return chain_tokens(ids, BLOCK_SIZE, chain_seed(MODEL_NAME))

    async def complete(self, server: VllmServer, prompt: str) -> dict:
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
        r = await post(self.http, f"{server.url}/v1/completions", body)
        assert r.status == 200, r.body[:300]
        return r.json()["usage"]

    async def connected(self, server: VllmServer) -> tuple[str, list[int]]:
        """Send fresh prompts until one's BlockStored arrives; return it and its ids.

        The server's PUB socket (re)connects to the freshly bound SUB socket within its
        reconnect interval; what it sends before that is lost (PUB/SUB), hence retries.
        """
        for _attempt in range(20):
            prompt = prompt_for(server.name)
            ids = self.tok.encode(prompt)
            usage = await self.complete(server, prompt)
            assert usage["prompt_tokens"] == len(ids), (
                "vLLM and the EPP's tokenizer disagree on the prompt's length"
            )
            head = ids[:BLOCK_SIZE]
            with contextlib.suppress(AssertionError):
                await wait_for(
                    lambda head=head: any(
                        ev.token_ids[:BLOCK_SIZE] == head for ev in self.events(server, BlockStored)
                    ),
                    1.0,
                    "",
                )
                return prompt, ids
        pytest.fail(
            f"no BlockStored from {server.name} within 20 requests; subscriber stats "
            f"{dict(self.sub.stats)}; batches from {sorted({n for n, _, _ in self.received})}",
            pytrace=False,
        )

    def check_clean(self) -> None:
        assert not any(k.startswith("dropped:") for k in self.sub.stats), dict(self.sub.stats)
        assert not any(batch.skipped for _, _, batch in self.received)


@contextlib.asynccontextmanager
async def harness(vllm_pool) -> AsyncIterator[Harness]:
    endpoints = [Endpoint(s.name, "127.0.0.1", s.port) for s in vllm_pool.servers]
    index = PreciseIndex(max_blocks_per_endpoint=1_000_000, clock=lambda: 0.0)
    received: list[tuple[str, str, EventBatch]] = []

    def on_batch(name: str, model: str, batch: EventBatch) -> None:
        received.append((name, model, batch))
        index.on_batch(name, model, batch)

    sub = KVEventSubscriber(
        on_batch, mode="bind", endpoint=vllm_pool.kv_events_endpoint, pool=lambda: endpoints
    )
    await sub.start()
    try:
        assert sub.bound_endpoint == vllm_pool.kv_events_endpoint
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            yield Harness(sub, index, HFTokenizer(vllm_pool.tokenizer_json), http, received)
    finally:
        await sub.stop()


async def test_subscriber_decodes_real_block_stored_events(vllm_pool):
    servers = vllm_pool.servers
    async with harness(vllm_pool) as h:
        for server in servers:
            _, ids = await h.connected(server)
            full = len(ids) // BLOCK_SIZE
            assert full >= 2, f"prompt too short for the test: {len(ids)} tokens"
            want = ids[: full * BLOCK_SIZE]
            await asyncio.sleep(0.3)  # the chain may come in one event or several
            chain = h.events(server, BlockStored)
            start = next(
                i for i, ev in enumerate(chain) if ev.token_ids[:BLOCK_SIZE] == want[:BLOCK_SIZE]
            )
            first = chain[start]
            assert first.parent_block_hash is None, "a new prompt's first block has no parent"
            assert first.block_size == BLOCK_SIZE
            assert first.medium in (None, "GPU")
            tokens: list[int] = []
            hashes: list[int] = []
            for ev in chain[start:]:
                if len(tokens) >= len(want):
                    break
                assert ev.block_size == BLOCK_SIZE
                assert len(ev.token_ids) == BLOCK_SIZE * len(ev.block_hashes)
                if hashes:
                    assert ev.parent_block_hash == hashes[-1], "blocks must chain"
                tokens += ev.token_ids
                hashes += ev.block_hashes
            assert tokens == want, "BlockStored token ids differ from the prompt's"
            assert all(0 <= x < 1 << 64 for x in hashes)
            assert len(set(hashes)) == len(hashes)
            assert {m for name, m, _ in h.received if name == server.name} == {MODEL_NAME}

            # Fed to the precise index, the prompt's blocks are found on this server only.
            own = h.own_hashes(ids)
            assert len(own) == full
            assert h.index.longest_prefix(server.name, own, 0.0) == (float(full), full)
            for other in servers:
                if other is not server:
                    assert h.index.longest_prefix(other.name, own, 0.0) == (0.0, 0)
        h.check_clean()


async def test_evictions_and_reset_keep_the_index_true(vllm_pool):
    """BlockRemoved and AllBlocksCleared from a real server keep the index's prediction
    of the server's cache hit equal to the hit the server then reports."""
    server = next(s for s in vllm_pool.servers if LORA_NAME in s.models)  # small cache
    async with harness(vllm_pool) as h:
        await h.connected(server)
        first = prompt_for(f"{server.name}-first", repeat=3)
        first_ids = h.tok.encode(first)
        n_blocks = len(first_ids) // BLOCK_SIZE
        assert len(first_ids) % BLOCK_SIZE, "the check below assumes a partial last block"
        own = h.own_hashes(first_ids)

        async def predicted_then_real() -> tuple[int, int]:
            """(hit the index predicts, hit vLLM reports) for sending `first` now."""
            await asyncio.sleep(0.5)  # let the last request's events arrive
            _, n = h.index.longest_prefix(server.name, own, 0.0)
            usage = await h.complete(server, first)
            return n * BLOCK_SIZE, usage["prompt_tokens_details"]["cached_tokens"]

        await h.complete(server, first)
        assert await predicted_then_real() == (n_blocks * BLOCK_SIZE,) * 2

        # Fill the small cache with other long prompts until `first` loses blocks.
        for _ in range(60):
            await h.complete(server, prompt_for(f"{server.name}-filler", repeat=6))
            await asyncio.sleep(0.2)
            if h.index.longest_prefix(server.name, own, 0.0)[1] < n_blocks:
                break
        else:
            pytest.fail(
                f"{server.name} never evicted the first prompt's blocks; "
                f"{len(h.events(server, BlockRemoved))} BlockRemoved seen",
                pytrace=False,
            )
        removed = h.events(server, BlockRemoved)
        assert removed and all(ev.block_hashes for ev in removed)
        predicted, real = await predicted_then_real()
        assert predicted == real < n_blocks * BLOCK_SIZE, (predicted, real)

        # A reset empties the server's cache. vLLM queues the AllBlocksCleared and
        # publishes it with the next engine step, so a short request (under one block:
        # no BlockStored of its own) flushes it; then it must empty the index.
        r = await post(h.http, f"{server.url}/reset_prefix_cache", {})
        assert r.status == 200 and r.json().get("success") is True, r.body[:300]
        await h.complete(server, "flush")
        await wait_for(
            lambda: h.events(server, AllBlocksCleared),
            5,
            lambda: f"no AllBlocksCleared from {server.name}; stats {dict(h.sub.stats)}",
        )
        assert h.index.size(server.name) == 0
        assert await predicted_then_real() == (0, 0)
        h.check_clean()
