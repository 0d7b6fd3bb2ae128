"""The EPP predicts, block for block, the prefix-cache hit a real vLLM then reports.

The EPP's prefix producers — precise (fed by the servers' KV events) and approximate
(what the EPP itself routed) — are configured as in production with the served model's
directory as their `tokenizer`, so chat requests are rendered by the model's own chat
template as vLLM renders them. For each request of a mixed sequence (completions; a
multi-turn chat with a system prompt, tools, an assistant tool call and a tool result,
content parts, a developer message, `continue_final_message`, `chat_template_kwargs`),
the request is scheduled on the endpoint with the longest precise match (ties round-robin),
sent there, and then:

- the EPP's token ids equal vLLM's own (`POST /tokenize` with the same body), and their
  count equals `usage.prompt_tokens`;
- the precise prediction `PrefixMatchInfo.cached_tokens(picked)` equals
  `usage.prompt_tokens_details.cached_tokens` (server flag `--enable-prompt-tokens-details`),
  and so does the approximate one (nothing is evicted in this sequence).

A Messages sequence (system blocks, tools, thinking, tool use and results, an inline
system reminder) is checked the same way against `/v1/messages/render` and Anthropic usage.

Three servers: the two of the session (no BOS anywhere) and one started here on the
tiny model's BOS variant (its tokenizer adds `<s>`, its chat template writes
`{{ bos_token }}`): completions then carry one BOS, chats exactly one (vLLM does not add
a second on top of the template's). Every prompt starts with a fresh nonce, so no other
test's cache can help or hurt.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from dataclasses import dataclass, field

import aiohttp
import pytest

from epp.datastore import Endpoint, EndpointMetrics, EndpointSnapshot
from epp.harness.procs import HttpReady, free_port, wait_ready
from epp.request import new_request, parse_body
from epp.response import Usage
from epp.scheduling.registry import Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.prefix.approx_producer import ApproxPrefixCacheProducer, ApproxPrefixParams
from plugins.prefix.match_info import PREFIX_MATCH_KEY
from plugins.prefix.precise_producer import PrecisePrefixCacheProducer, PrecisePrefixParams
from tests.real_vllm.conftest import (
    BLOCK_SIZE,
    MODEL_NAME,
    SERVE_SCRIPT,
    STARTUP_TIMEOUT_S,
    VllmServer,
)
from tests.real_vllm.helpers import TIMEOUT, post, wait_for

pytestmark = pytest.mark.real_vllm

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"

SYSTEM = (
    "You are the routing assistant of an inference gateway. The endpoint picker sends "
    "each request to the model server that already holds the longest prefix of its "
    "prompt in its key-value cache, weighed against queue length and cache pressure. "
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "queue_length",
            "description": "The number of requests waiting on one model server.",
            "parameters": {
                "type": "object",
                "properties": {"server": {"type": "string"}},
                "required": ["server"],
            },
        },
    },
    {"type": "function", "function": {"name": "cache_usage"}},
]


# tool_choice "none": the servers run without a tool-call parser, which "auto" (the
# default when tools are given) needs; the tools are still rendered into the prompt
# (vLLM drops them only with --exclude-tools-when-tool-choice-none).
WITH_TOOLS = {"tools": TOOLS, "tool_choice": "none"}


def requests(nonce: str) -> list[tuple[str, dict]]:
    """(path, body) pairs that share prefixes in the ways real clients do."""
    doc = f"[{nonce}] " + SYSTEM * 3
    system = {"role": "system", "content": f"[{nonce}] {SYSTEM}"}
    q1 = {"role": "user", "content": "Which server should take my next request?"}
    a1 = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "queue_length", "arguments": '{"server": "vllm-0"}'},
            }
        ],
    }
    t1 = {"role": "tool", "tool_call_id": "call_1", "content": "3 requests waiting"}
    q2 = {
        "role": "user",
        "content": [
            {"type": "text", "text": "And the second server?"},
            {"type": "text", "text": "Answer in one word."},
        ],
    }
    a2 = {"role": "assistant", "content": "vllm-1"}
    q3 = {"role": "developer", "content": "Prefer the server with the warm cache."}
    turn1 = [system, q1]
    turn2 = [system, q1, a1, t1, q2]
    turn3 = [system, q1, a1, t1, q2, a2, q3]
    return [
        (COMPLETIONS, {"prompt": doc + "First question: how long is the queue?"}),
        (COMPLETIONS, {"prompt": doc + "Second question: which server has free blocks?"}),
        (COMPLETIONS, {"prompt": doc + "First question: how long is the queue?"}),
        (CHAT, {"messages": turn1, **WITH_TOOLS}),
        (CHAT, {"messages": turn2, **WITH_TOOLS}),
        (CHAT, {"messages": turn3, **WITH_TOOLS, "chat_template_kwargs": {"x": 1}}),
        (CHAT, {"messages": turn2, **WITH_TOOLS}),  # a retry: fully cached but the tail
        (
            CHAT,
            {
                "messages": [*turn2, {"role": "assistant", "content": "The second"}],
                **WITH_TOOLS,
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
        ),
        (CHAT, {"messages": [system, {"role": "user", "content": "Something else."}]}),
    ]


@dataclass
class Epp:
    """The two producers as the EPP runs them, and the candidate snapshots."""

    precise: PrecisePrefixCacheProducer
    approx: ApproxPrefixCacheProducer
    servers: list[VllmServer]
    snaps: list[EndpointSnapshot]
    http: aiohttp.ClientSession
    turn: int = 0
    rows: list[str] = field(default_factory=list)

    def schedule(self, path: str, body: dict):
        raw = json.dumps({"model": MODEL_NAME, "max_tokens": 1, **body}).encode()
        req = parse_body(new_request({}, path, "POST"), raw)
        state = CycleState()
        precise = self.precise.produce(state, req, self.snaps)
        approx = self.approx.produce(state, req, self.snaps)
        best = max(precise.matched.get(s.name, 0.0) for s in self.snaps)
        ties = [s for s in self.snaps if precise.matched.get(s.name, 0.0) == best]
        pick = ties[self.turn % len(ties)]
        self.turn += 1
        # What the scheduler does: the producer's output under its key, then pre-request.
        state.write(PREFIX_MATCH_KEY, approx)
        result = SchedulingResult({"p": ProfileResult([pick])}, "p", cycle_state=state)
        self.approx.pre_request(req, result)
        ids = state.read("prompt-tokens:" + self.precise.tokenizer.name)
        return req, pick, precise, approx, ids

    async def vllm_ids(self, server: VllmServer, path: str, body: dict) -> list[int]:
        tok_body = {"model": MODEL_NAME, **body}
        if path == MESSAGES:  # /tokenize takes no Messages body; the render route does
            r = await post(self.http, f"{server.url}{path}/render", {**tok_body, "max_tokens": 1})
            assert r.status == 200, f"{path}/render: {r.status} {r.body[:300]!r}"
            return r.json()["token_ids"]
        r = await post(self.http, f"{server.url}/tokenize", tok_body)
        assert r.status == 200, f"/tokenize: {r.status} {r.body[:300]!r}"
        return r.json()["tokens"]

    async def send(self, server: VllmServer, path: str, body: dict) -> dict:
        full = {"model": MODEL_NAME, "max_tokens": 1, **body}
        r = await post(self.http, f"{server.url}{path}", full)
        assert r.status == 200, f"{server.url}{path}: {r.status} {r.body[:300]!r}"
        if path != MESSAGES:
            return r.json()["usage"]
        usage = Usage.from_json(r.json()["usage"])  # Anthropic's: input + cache reads
        assert usage is not None, r.body[:300]
        details = {"cached_tokens": usage.cached_tokens}
        return {"prompt_tokens": usage.prompt_tokens, "prompt_tokens_details": details}

    async def settled(self, pick: EndpointSnapshot, chain: list[int], n_tokens: int) -> None:
        """Wait until the picked server's BlockStored events for this prompt are in."""
        want = n_tokens // BLOCK_SIZE

        def held() -> bool:
            return self.precise.index.longest_prefix(pick.name, chain[:want], 0.0)[1] >= want

        await wait_for(held, 10, f"{pick.name}: the prompt's {want} blocks never reported")


def snapshot(server: VllmServer) -> EndpointSnapshot:
    metrics = EndpointMetrics(cache_block_size=BLOCK_SIZE, cache_num_blocks=1 << 20)
    return EndpointSnapshot(Endpoint(server.name, "127.0.0.1", server.port), metrics)


@pytest.fixture(scope="module")
def bos_server(vllm_pool):
    """A third server, on the BOS variant of the tiny model, publishing its KV events
    where the session's servers do."""
    model = vllm_pool.model_dir / "bos-variant"
    if not (model / "tokenizer.json").is_file():
        pytest.fail(
            f"no BOS variant at {model}: rerun scripts/vllm/make_tiny_model.py", pytrace=False
        )
    port = free_port()
    topic = f"kv@127.0.0.1:{port}@{MODEL_NAME}"
    argv = [
        vllm_pool.python, str(SERVE_SCRIPT),
        "--model", str(model), "--served-model-name", MODEL_NAME, "--port", str(port),
        "--block-size", str(BLOCK_SIZE), "--max-num-seqs", "8", "--max-model-len", "2048",
        "--kv-events", vllm_pool.kv_events_endpoint, "--kv-events-topic", topic,
        "--cpus", str((os.cpu_count() or 1) - 1),
        "--", "--enable-prompt-tokens-details",
    ]  # fmt: skip
    proc = vllm_pool.pg.spawn("vllm-bos", argv)
    wait_ready(proc, HttpReady(f"http://127.0.0.1:{port}/health"), STARTUP_TIMEOUT_S)
    # The session's ProcessGroup stops it with the others.
    return VllmServer("vllm-bos", port, proc, topic, frozenset({MODEL_NAME}))


async def run_parity(
    vllm_pool, servers: list[VllmServer], model_dir, sequence: list | None = None
) -> list[str]:
    endpoints = [Endpoint(s.name, "127.0.0.1", s.port) for s in servers]
    handle = Handle(rng=random.Random(0), pool=lambda: endpoints)
    precise = PrecisePrefixCacheProducer(
        "precise",
        PrecisePrefixParams(
            mode="bind",
            endpoint=vllm_pool.kv_events_endpoint,
            tokenizer=str(model_dir),
            block_size_tokens=BLOCK_SIZE,
            speculative_indexing=False,  # predictions from the servers' own events only
        ),
        handle,
    )
    approx = ApproxPrefixCacheProducer(
        "approx",
        ApproxPrefixParams(block_size_tokens=BLOCK_SIZE, tokenizer=str(model_dir)),
        handle,
    )
    assert precise.tokenizer.chat_template is not None, "the model's chat template was not loaded"
    await precise.start()
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            epp = Epp(precise, approx, servers, [snapshot(s) for s in servers], http)
            await warm_up(epp)
            for path, body in sequence or requests(uuid.uuid4().hex):
                await check_one(epp, path, body)
            return epp.rows
    finally:
        await precise.stop()


async def warm_up(epp: Epp) -> None:
    """PUB sockets reconnect to a freshly bound SUB within their retry interval, and
    what they publish before that is lost: send fresh prompts until each server's
    events are seen."""
    for server, snap in zip(epp.servers, epp.snaps, strict=True):
        for _ in range(20):
            body = {"prompt": f"warm-up {uuid.uuid4().hex} " + SYSTEM}
            _, _, info, _, ids = epp.schedule(COMPLETIONS, body)
            await epp.send(server, COMPLETIONS, body)
            try:
                await epp.settled(snap, list(info.chains[BLOCK_SIZE]), len(ids))
                break
            except AssertionError:
                continue
        else:
            pytest.fail(f"no KV events from {server.name} after 20 prompts", pytrace=False)


async def check_one(epp: Epp, path: str, body: dict) -> None:
    _, pick, precise, approx, ids = epp.schedule(path, body)
    server = next(s for s in epp.servers if s.name == pick.name)
    vllm_ids = await epp.vllm_ids(server, path, body)
    at = next((i for i, (a, b) in enumerate(zip(ids, vllm_ids, strict=False)) if a != b), None)
    assert ids == vllm_ids, (
        f"{path} on {server.name}: the EPP's {len(ids)} token ids differ from vLLM's "
        f"{len(vllm_ids)} (first difference at {at}): body {json.dumps(body)[:400]}"
    )
    usage = await epp.send(server, path, body)
    reported = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    row = (
        f"{path:22} -> {server.name:8} prompt {usage['prompt_tokens']:4} tokens  "
        f"predicted precise {precise.cached_tokens(pick.name):4} approx "
        f"{approx.cached_tokens(pick.name):4}  vLLM cached {reported}"
    )
    epp.rows.append(row)
    assert usage["prompt_tokens"] == len(ids), row
    assert precise.cached_tokens(pick.name) == reported, row
    assert approx.cached_tokens(pick.name) == reported, row
    await epp.settled(pick, list(precise.chains[BLOCK_SIZE]), len(ids))


async def test_predicted_cached_tokens_equal_the_servers(vllm_pool, bos_server):
    servers = [*vllm_pool.servers, bos_server]
    # Two pools: the BOS server's tokenizer differs, so it is scored with its own model.
    rows = await run_parity(vllm_pool, vllm_pool.servers, vllm_pool.model_dir)
    rows += ["-- BOS variant --"]
    rows += await run_parity(vllm_pool, [bos_server], vllm_pool.model_dir / "bos-variant")
    table = "\n".join(rows)
    print(f"\nEPP prediction vs vLLM, per request:\n{table}")
    hits = [r for r in rows if "vLLM cached 0" not in r and "--" not in r]
    assert len(hits) >= 8, f"too few cache hits for the comparison to mean much:\n{table}"
    assert servers  # all three ran


# ---- Anthropic's Messages API ---------------------------------------------------------
ANTHROPIC_TOOLS = [
    {
        "name": "queue_length",
        "description": "The number of requests waiting on one model server.",
        "input_schema": {"type": "object", "properties": {"server": {"type": "string"}}},
    }
]
# "none": the servers run without a tool-call parser, which "auto" (vLLM's default when
# tools are given) needs; the tools are still rendered into the prompt.
WITH_ANTHROPIC_TOOLS = {"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "none"}}


def messages_requests(nonce: str) -> list[tuple[str, dict]]:
    """A growing agent conversation over /v1/messages: system blocks (with the billing
    header vLLM strips), tools, thinking, tool use and tool results, an inline system
    reminder, then a retry and a sibling."""
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
        {"type": "text", "text": f"[{nonce}] {SYSTEM}"},
        {"type": "text", "text": "Answer briefly."},
    ]
    q1 = {"role": "user", "content": "Which server should take my next request?"}
    a1 = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should look at the queues.", "signature": "s"},
            {"type": "text", "text": "Let me check the queue."},
            {"type": "tool_use", "id": "toolu_1", "name": "queue_length", "input": {"server": "a"}},
        ],
    }
    r1 = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "text", "text": "3 requests waiting"}],
            },
            {"type": "text", "text": "And the second server?"},
        ],
    }
    a2 = {"role": "assistant", "content": [{"type": "text", "text": "vllm-1 has none."}]}
    reminder = {"role": "system", "content": "Reminder: prefer the warm cache."}
    q3 = {"role": "user", "content": [{"type": "text", "text": "Then send it there."}]}
    base = {"system": system, **WITH_ANTHROPIC_TOOLS}
    return [
        (MESSAGES, {**base, "messages": [q1]}),
        (MESSAGES, {**base, "messages": [q1, a1, r1]}),
        (MESSAGES, {**base, "messages": [q1, a1, r1, a2, reminder, q3]}),
        (MESSAGES, {**base, "messages": [q1, a1, r1]}),  # a retry: cached but the tail
        (MESSAGES, {**base, "messages": [{"role": "user", "content": "Something else."}]}),
    ]


async def test_messages_predicted_cached_tokens_equal_the_servers(vllm_pool):
    """The Messages API as vLLM 0.32 serves it: the EPP's token ids equal the ones vLLM's
    `/v1/messages/render` returns, and both producers predict the cache hit vLLM reports
    (`cache_read_input_tokens`)."""
    sequence = messages_requests(uuid.uuid4().hex)
    rows = await run_parity(vllm_pool, vllm_pool.servers, vllm_pool.model_dir, sequence)
    table = "\n".join(rows)
    print(f"\nEPP prediction vs vLLM, /v1/messages:\n{table}")
    hits = [r for r in rows if "vLLM cached 0" not in r]
    assert len(hits) >= 3, f"too few cache hits for the comparison to mean much:\n{table}"
