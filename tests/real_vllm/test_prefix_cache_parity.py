"""The simulator counts prefix-cache hits exactly as a real vLLM does.

The same sequence of shared-prefix requests goes, one at a time, to a real vLLM (the one
with the big cache, so nothing is evicted) and to an `epp sim` that uses the same
tokenizer.json, block size (32) and number of blocks, prefix caching on. After each
request both servers' `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`
deltas (in tokens) must be equal, as must the replies' `usage.prompt_tokens` and
`usage.prompt_tokens_details.cached_tokens`.

The sequence covers: a cold prompt, a sibling sharing whole blocks with it, an exact
repeat (the last token is always recomputed, so a fully cached prompt hits one block
less when its length is a multiple of the block size), a prompt whose length is an exact
multiple of 32, a prefix of an earlier prompt, and one that shares less than a block.
A second sequence is a growing multi-turn chat, rendered on both sides by the model's
own chat template (the simulator gets it with `--chat-template`).
"""

from __future__ import annotations

import subprocess
import uuid

import aiohttp
import pytest

from epp.harness.localstack import EPP_CMD
from epp.harness.procs import HttpReady, ProcessGroup, free_port
from epp.tokenizer import HFTokenizer
from tests.real_vllm.conftest import BLOCK_SIZE, MODEL_NAME
from tests.real_vllm.helpers import TIMEOUT, families, get_text, post, value, wait_for

pytestmark = pytest.mark.real_vllm

SIM_FLAGS = ("--tokenizer", "--block-size", "--num-gpu-blocks", "--enable-prefix-caching")

SHARED = (
    "An endpoint picker routes each request to the model server that can answer it "
    "soonest. When many requests share a long system prompt, the server that already "
    "holds that prompt's key-value blocks skips most of the prefill, so the picker "
    "tracks which server holds which prefix and weighs that against queue length and "
    "cache pressure before it answers the proxy with the chosen address."
)

WORDS = "and then the picker weighs every candidate again before it answers"


Request = tuple[str, dict]  # (path, body without model and max_tokens)
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def sequence(tok: HFTokenizer) -> list[str]:
    """Prompts sharing prefixes in several ways (unique to this run: a fresh tag)."""
    base = f"[{uuid.uuid4().hex}] {SHARED}"
    one = base + " First question: how long is the queue on the first server right now?"
    two = base + " Second question: which server has the most free cache blocks?"
    # Grow a prompt word by word until its length is an exact multiple of the block size.
    words = WORDS.split()
    exact, n_base = base, len(tok.encode(base))
    for i in range(400):
        exact += " " + words[i % len(words)]
        if len(tok.encode(exact)) % BLOCK_SIZE == 0 and len(tok.encode(exact)) > n_base:
            break
    else:
        raise AssertionError("could not build a prompt of a whole number of blocks")
    other = f"[{uuid.uuid4().hex}] A prompt that shares nothing beyond its first words."
    return [one, two, one, exact, exact, base, other, two]


def conversation() -> list[Request]:
    """Multi-turn chat: each turn resends the whole history (the common shared prefix)."""
    system = {"role": "system", "content": f"[{uuid.uuid4().hex}] {SHARED}"}
    turns = [
        ("user", "Which server should take my next request?"),
        ("assistant", "The one that already holds your conversation's blocks."),
        ("user", "And if that server's queue is long?"),
        ("assistant", "Then the picker weighs the saved prefill against the wait."),
        ("user", "Thanks. One more: what happens when the cache is full?"),
    ]
    history = [system]
    requests: list[Request] = []
    for role, content in turns:
        history = [*history, {"role": role, "content": content}]
        if role == "user":
            requests.append((CHAT, {"messages": history}))
    sibling = [system, {"role": "user", "content": "A different first question, then."}]
    return [*requests, (CHAT, {"messages": sibling}), requests[1]]


def sim_missing_flags() -> list[str]:
    """The flags this comparison needs that `epp sim --help` does not list."""
    done = subprocess.run(
        [*EPP_CMD, "sim", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"`epp sim --help` exited {done.returncode}:\n{done.stderr[-2000:]}", pytrace=False
        )
    return [f for f in SIM_FLAGS if f not in done.stdout]


async def counters(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    page = await get_text(http, f"{url}/metrics")
    return (
        value(page, "vllm:prefix_cache_queries_total"),
        value(page, "vllm:prefix_cache_hits_total"),
    )


async def send_and_count(http: aiohttp.ClientSession, url: str, request: Request) -> dict:
    path, body = request
    q0, h0 = await counters(http, url)
    r = await post(http, f"{url}{path}", {"model": MODEL_NAME, "max_tokens": 1, **body})
    assert r.status == 200, f"{url}{path}: {r.status} {r.body[:300]!r}"
    usage = r.json()["usage"]
    n = usage["prompt_tokens"]
    deltas = {}

    async def counted() -> bool:
        q1, h1 = await counters(http, url)
        deltas.update(queries=q1 - q0, hits=h1 - h0)
        return deltas["queries"] >= n

    # Counters are updated as the engine step is reported, a moment after the reply.
    await wait_for(counted, 5, lambda: f"{url}: queries moved by {deltas} for {n} prompt tokens")
    details = usage.get("prompt_tokens_details") or {}
    return {
        "prompt_tokens": n,
        "queries": deltas["queries"],
        "hits": deltas["hits"],
        "cached_tokens": details.get("cached_tokens"),
    }


async def compare(vllm_pool, requests: list[Request], *sim_flags: str) -> str:
    """Send `requests` in turn to the big-cache real server and to a fresh simulator;
    fail unless every request's accounting is equal. Returns the table."""
    missing = sim_missing_flags()
    if missing:
        pytest.fail(
            f"`epp sim` lacks {missing}: the simulator needs prefix caching with a "
            "Hugging Face tokenizer.json and a block size (issue 3) for this comparison",
            pytrace=False,
        )
    real = vllm_pool.servers[0]  # the one with a big cache: no eviction here
    rows = []
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        info = families(await get_text(http, f"{real.url}/metrics"))["vllm:cache_config_info"]
        num_blocks = info.samples[0][1]["num_gpu_blocks"]
        with ProcessGroup() as pg:
            port = free_port()
            argv = [
                *EPP_CMD, "sim", "--port", str(port), "--name-prefix", "parity",
                "--model", MODEL_NAME,
                "--tokenizer", str(vllm_pool.tokenizer_json),
                "--block-size", str(BLOCK_SIZE),
                "--num-gpu-blocks", num_blocks,
                "--max-model-len", "2048",
                "--enable-prefix-caching",
                *sim_flags,
            ]  # fmt: skip
            sim_url = f"http://127.0.0.1:{port}"
            pg.start("sim", argv, ready=HttpReady(f"{sim_url}/health"), timeout=60)
            for i, request in enumerate(requests):
                want = await send_and_count(http, real.url, request)
                got = await send_and_count(http, sim_url, request)
                rows.append((i, request[0], want, got))
    table = "\n".join(
        f"  #{i} {path}: vLLM {w}  sim {g}" + ("" if w == g else "   <-- differs")
        for i, path, w, g in rows
    )
    assert all(w == g for _, _, w, g in rows), f"prefix-cache accounting differs:\n{table}"
    # The sequence must really exercise the cache, or the equality says nothing.
    total_hits = sum(w["hits"] for _, _, w, _ in rows)
    assert total_hits >= 4 * BLOCK_SIZE, f"too few hits to compare:\n{table}"
    assert any(w["hits"] == 0 for _, _, w, _ in rows), f"no cold request:\n{table}"
    print(f"\nprefix-cache accounting, vLLM and simulator alike:\n{table}")
    return table


async def test_prefix_cache_hits_match_the_real_server(vllm_pool):
    tok = HFTokenizer(vllm_pool.tokenizer_json)
    requests = [(COMPLETIONS, {"prompt": p}) for p in sequence(tok)]
    await compare(vllm_pool, requests)


async def test_chat_prefix_cache_hits_match_the_real_server(vllm_pool):
    """A growing conversation, rendered by the model's chat template on both sides."""
    template = vllm_pool.model_dir / "chat_template.jinja"
    assert template.is_file(), f"no chat template at {template}"
    await compare(vllm_pool, conversation(), "--chat-template", str(template))
