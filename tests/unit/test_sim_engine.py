"""The simulator's parts without HTTP: tokens, config, request parsing, and the engine
model (scheduler, KV cache, step cost) on hand-made sequences with exact numbers.

The scheduler is synchronous and clock-free, so these tests drive it step by step in
virtual time: no sleeping, no flakiness.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from epp.media import PLACEHOLDER
from epp.request import new_request as epp_request
from epp.request import parse_body
from epp.sim.chat import render_default
from epp.sim.config import Faults, KVEventsConfig, SimConfig
from epp.sim.engine import Engine
from epp.sim.kvcache import NONE_HASH, BlockRemoved, BlockStored, KVCache, external_hash, hash_block
from epp.sim.latency import StepCostModel, StepShape
from epp.sim.lora import LoraError, LoraRegistry
from epp.sim.openai import ApiError, parse
from epp.sim.scheduler import Scheduler, StepPlan
from epp.sim.sequence import Channel, SimRequest, State
from epp.sim.tokenizer import count_tokens, filler_text, filler_token, tokenize
from epp.tokenizer import SimpleTokenizer

# -- tokenizer -------------------------------------------------------------------------


def test_tokenizer_counts_words_and_punctuation() -> None:
    assert tokenize("Hello, world!") == ["Hello", ",", "world", "!"]
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("") == 0
    assert count_tokens("  spaced   out\n") == 2


def test_filler_is_one_token_each() -> None:
    assert all(count_tokens(filler_token(i)) == 1 for i in range(100))
    assert count_tokens(filler_text(37)) == 37
    assert filler_text(5) == filler_text(5)  # deterministic


# -- config ------------------------------------------------------------------------------


def test_config_validation_and_derived_values() -> None:
    config = SimConfig(lora_modules=["a", "b=/x"], kv_capacity_tokens=1024, block_size=32)  # type: ignore[arg-type]
    assert config.lora_modules == ("a", "b=/x")
    assert config.served_models == ("tiny", "a", "b")
    assert config.num_gpu_blocks == 32
    assert config.model_len == 1024
    for bad in [
        {"max_num_seqs": 0},
        {"max_num_batched_tokens": 0},
        {"long_prefill_token_threshold": -1},
        {"long_prefill_token_threshold": 2048, "max_model_len": 1024},
        {"time_scale": 0},
        {"failure_rate": 1.5},
        {"decode_ms_per_token": -1},
        {"step_base_ms": float("nan")},
        {"kv_capacity_tokens": 8, "block_size": 16},
        {"max_model_len": 10**9},
        {"kv_role": "sideways"},
        {"kv_events_format": "yaml"},
    ]:
        with pytest.raises(ValueError):
            SimConfig(**bad)  # type: ignore[arg-type]


def test_kv_events_config_follows_vllm() -> None:
    on = KVEventsConfig.from_dict({"enable_kv_cache_events": True})
    assert (on.publisher, on.endpoint, on.enabled) == ("zmq", "tcp://*:5557", True)
    assert not KVEventsConfig.from_dict({"publisher": "zmq"}).enabled
    for bad in [{"publisher": "kafka"}, {"nonsense": 1}, [1]]:
        with pytest.raises(ValueError):
            KVEventsConfig.from_dict(bad)  # type: ignore[arg-type]


def test_fault_updates_are_all_or_nothing() -> None:
    faults = Faults()
    faults.update({"delay_ms": 10, "fixed_queue": 3})
    assert faults.to_dict() == {
        "delay_ms": 10.0,
        "fail_rate": 0.0,
        "metrics": True,
        "healthy": True,
        "fixed_queue": 3,
    }
    with pytest.raises(ValueError):
        faults.update({"delay_ms": 20, "fail_rate": 7})
    assert faults.delay_ms == 10.0
    with pytest.raises(ValueError, match="unknown"):
        faults.update({"latency": 1})


# -- request parsing --------------------------------------------------------------------

CONFIG = SimConfig(default_max_tokens=16, kv_capacity_tokens=1024)
SIMPLE = SimpleTokenizer()


def test_parse_completion_prompt_forms() -> None:
    assert parse("completion", {"prompt": "a b c"}, CONFIG).prompt_tokens == (3,)
    assert parse("completion", {"prompt": "a b"}, CONFIG).prompts == (tuple(SIMPLE.encode("a b")),)
    assert parse("completion", {"prompt": [5, 6]}, CONFIG).prompts == ((5, 6),)
    assert parse("completion", {"prompt": ["a", [1, 2, 3]]}, CONFIG).prompt_tokens == (1, 3)
    for bad in ["", [], [None], [[]], {"x": 1}, None, [-1], [2**40]]:
        with pytest.raises(ApiError):
            parse("completion", {"prompt": bad}, CONFIG)


def test_parse_limits_reasons_and_extras() -> None:
    req = parse("completion", {"prompt": "x"}, CONFIG)
    assert (req.max_tokens, req.finish_reason, req.lora, req.kv_kind) == (16, "stop", None, "none")
    req = parse("completion", {"prompt": "x", "max_tokens": 3}, CONFIG)
    assert (req.max_tokens, req.finish_reason) == (3, "length")
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}
    assert parse("chat", body, CONFIG).max_tokens == 3
    body["max_completion_tokens"] = 5
    assert parse("chat", body, CONFIG).max_tokens == 5
    req = parse("chat", {**body, "stream": True, "stream_options": {"include_usage": True}}, CONFIG)
    assert req.stream and req.include_usage
    req = parse(
        "completion",
        {"prompt": "x", "cache_salt": "s", "kv_transfer_params": {"do_remote_decode": True}},
        CONFIG,
    )
    assert (req.cache_salt, req.kv_kind) == ("s", "do_remote_decode")
    lora = SimConfig(lora_modules=("sql",))
    assert parse("completion", {"prompt": "x", "model": "sql"}, lora).lora == "sql"
    with pytest.raises(ApiError) as e:
        parse("completion", {"prompt": "x " * 1020, "max_tokens": 10}, CONFIG)
    assert e.value.status == 400
    with pytest.raises(ApiError) as e:
        parse("completion", {"prompt": "x", "model": "other"}, CONFIG)
    assert e.value.status == 404
    for bad in [{"cache_salt": ""}, {"kv_transfer_params": [1]}]:
        with pytest.raises(ApiError):
            parse("completion", {"prompt": "x", **bad}, CONFIG)


CHATS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": None}, {"role": "user", "content": "a\nb"}],
    [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look:"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": " there"},
            ],
        },
        {"role": "assistant", "content": "ok"},
    ],
]


@pytest.mark.parametrize("messages", CHATS)
def test_chat_rendering_is_the_epps(messages: list) -> None:
    """The sim must tokenize exactly what the EPP tokenizes, or prefix routing misses:
    the same text, except that a media item is the EPP's marker (its digest) and the
    sim's placeholder (the same for every item, as vLLM's; the item's identity goes into
    the sim's block hashes), which have the same length in tokens."""
    epp = parse_body(
        epp_request({}, "/v1/chat/completions", "POST"),
        __import__("json").dumps({"model": "tiny", "messages": messages}).encode(),
    )
    text = epp.prompt_text
    for item in epp.media:
        text = text.replace(item.marker, PLACEHOLDER)
        assert len(SIMPLE.encode(item.marker)) == len(SIMPLE.encode(PLACEHOLDER))
    assert render_default(messages) == text
    req = parse("chat", {"messages": messages}, CONFIG)
    assert req.prompts == (tuple(SIMPLE.encode(text)),)
    assert [f[0] for f in req.mm] == [item.digest for item in epp.media]


def test_chat_validation() -> None:
    for bad in [[], [{"role": ""}], [{"role": "user", "content": 3}], [{"content": "x"}]]:
        with pytest.raises(ApiError):
            parse("chat", {"messages": bad}, CONFIG)


# -- the scheduler, step by step ---------------------------------------------------------


def scheduler(**overrides: object) -> Scheduler:
    config = SimConfig(**{"block_size": 4, "kv_capacity_tokens": 64 * 4, **overrides})  # type: ignore[arg-type]
    kv = KVCache(
        config.num_gpu_blocks, 4, enable_caching=config.enable_prefix_caching, emit_events=True
    )
    return Scheduler(
        config, kv, LoraRegistry(config.lora_modules, config.max_loras), output_ids=[7]
    )


def request(tokens: list[int] | range, max_tokens: int = 3, **kw: object) -> SimRequest:
    return SimRequest(list(tokens), max_tokens, Channel(), **kw)  # type: ignore[arg-type]


_clock = itertools.count()


def step(s: Scheduler) -> StepPlan:
    now = float(next(_clock))
    plan = s.schedule(now)
    assert plan is not None
    s.finish_step(plan, now + 0.5)
    return plan


def drain(s: Scheduler, limit: int = 1000) -> int:
    steps = 0
    while s.running or s.waiting or s.transferring:
        step(s)
        steps += 1
        assert steps < limit
    return steps


def test_batching_within_the_token_budget() -> None:
    s = scheduler(max_num_batched_tokens=10)
    a, b, c = request(range(8)), request(range(100, 108)), request(range(200, 208))
    for r in (a, b, c):
        s.add(r, 0.0)

    plan = step(s)  # A's whole prompt, B's first chunk; C waits for budget
    assert [(r, n) for r, n in plan.scheduled] == [(a, 8), (b, 2)]
    assert plan.shape == StepShape(prefill_tokens=10, decode_seqs=0, context_tokens=10)
    assert (a.generated, b.generated, c.state) == (1, 0, State.WAITING)
    assert s.kv.num_used_blocks == 2 + 1

    plan = step(s)  # A decodes, B finishes its prompt, C gets the 3 tokens left
    assert [(r, n) for r, n in plan.scheduled] == [(a, 1), (b, 6), (c, 3)]
    assert plan.shape == StepShape(prefill_tokens=9, decode_seqs=1, context_tokens=9 + 8 + 3)
    assert (a.generated, b.generated, c.generated) == (2, 1, 0)
    assert s.kv.num_used_blocks == 3 + 2 + 1

    plan = step(s)
    assert [(r, n) for r, n in plan.scheduled] == [(a, 1), (b, 1), (c, 5)]
    assert plan.shape == StepShape(prefill_tokens=5, decode_seqs=2, context_tokens=10 + 9 + 8)
    assert a.state is State.FINISHED and a.finish_reason == "length"
    assert a.tokens == [*range(8), 7, 7, 7]
    assert s.kv.num_used_blocks == 3 + 2  # A's three blocks went back
    drain(s)
    assert s.kv.num_used_blocks == 0
    assert s.stats.max_batched_tokens_seen == 10


def test_long_prefill_threshold_chunks_a_long_prompt_thin() -> None:
    """vLLM's long-prefill threshold: no request prefills more than it in one step while
    others are in the engine, so the long prompt B leaves room for A's decode and C's
    short prompt in every step."""
    s = scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=6)
    a = request(range(4), max_tokens=4)
    s.add(a, 0.0)
    assert [(r, n) for r, n in step(s).scheduled] == [(a, 4)]  # under the threshold: whole
    b, c = request(range(100, 120)), request(range(200, 205))
    s.add(b, 0.0)
    s.add(c, 0.0)
    assert [(r, n) for r, n in step(s).scheduled] == [(a, 1), (b, 6), (c, 5)]
    assert [(r, n) for r, n in step(s).scheduled] == [(a, 1), (b, 6), (c, 1)]
    assert [(r, n) for r, n in step(s).scheduled] == [(a, 1), (b, 6), (c, 1)]
    assert [(r, n) for r, n in step(s).scheduled] == [(b, 2)]  # A and C are done
    assert b.generated == 1
    drain(s)
    # alone in the engine a long prompt starves nobody and takes the budget (vLLM 0.32)
    alone = scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=6)
    long = request(range(100, 120))
    alone.add(long, 0.0)
    assert [(r, n) for r, n in step(alone).scheduled] == [(long, 20)]


def test_max_num_seqs_and_delays() -> None:
    s = scheduler(max_num_seqs=2)
    late, a, b, c = (request(range(i * 10, i * 10 + 4), max_tokens=2) for i in range(4))
    s.add(late, 0.0, delay=100.0)  # held back, but does not block the queue
    for r in (a, b, c):
        s.add(r, 0.0)
    plan = step(s)
    assert [r for r, _ in plan.scheduled] == [a, b]
    assert list(s.waiting) == [late, c]
    step(s)
    assert [r for r, _ in step(s).scheduled] == [c]
    step(s)
    assert c.state is State.FINISHED
    assert s.schedule(50.0) is None
    assert s.next_wakeup(50.0) == 100.0
    assert [r for r, _ in s.schedule(100.0).scheduled] == [late]  # type: ignore[union-attr]


def test_prefix_hits_are_whole_blocks_and_never_the_last_token() -> None:
    s = scheduler()
    first = request(range(8), max_tokens=1)
    s.add(first, 0.0)
    drain(s)
    assert s.kv.num_cached_blocks == 2  # tokens 0-7 fill two blocks of 4

    cases = [
        (range(8), 4),  # everything cached, but the last token is recomputed: 1 block hits
        (range(9), 8),  # 9 tokens: both blocks hit, the 9th token is computed
        ([0, 1, 2, 3, 99, 5, 6, 7, 8], 4),  # diverges in block 2
        ([9, 1, 2, 3, 4, 5, 6, 7, 8], 0),  # diverges in block 1: the chain is broken
        (range(3), 0),  # no full block
    ]
    queries = hits = 8, 0
    queries, hits = 8, 0
    for tokens, expected in cases:
        r = request(tokens, max_tokens=1)
        s.add(r, 0.0)
        plan = step(s)
        assert r.num_cached_tokens == expected, list(tokens)
        assert plan.shape.prefill_tokens == len(r.prompt) - expected
        queries += len(r.prompt)
        hits += expected
        drain(s)
    assert (s.stats.prefix_cache_queries, s.stats.prefix_cache_hits) == (queries, hits)


def test_lora_and_salt_separate_the_cache() -> None:
    s = scheduler(lora_modules=("a",))
    for kw in ({}, {"lora": "a"}, {"cache_salt": "x"}):
        s.add(request(range(9), max_tokens=1, **kw), 0.0)
        drain(s)
    r = request(range(9), max_tokens=1, lora="a")
    s.add(r, 0.0)
    step(s)
    assert r.num_cached_tokens == 8  # only the earlier request with the same adapter


def test_freed_blocks_are_evicted_least_recently_freed_first() -> None:
    s = scheduler(kv_capacity_tokens=4 * 4)  # four blocks
    a, b, c = range(8), range(100, 108), range(200, 208)
    for tokens in (a, b):
        s.add(request(tokens, max_tokens=1), 0.0)
        drain(s)
    assert s.kv.num_used_blocks == 0 and s.kv.num_cached_blocks == 4
    stored = [e for e in s.kv.drain_events() if isinstance(e, BlockStored)]
    a_hashes = stored[0].block_hashes
    assert stored[0].token_ids == list(a) and stored[0].parent_block_hash is None

    s.add(request(c, max_tokens=1), 0.0)
    drain(s)
    # A's blocks were freed first, so they go first - its last block before its first.
    removed = [e for e in s.kv.drain_events() if isinstance(e, BlockRemoved)]
    assert [e.block_hashes for e in removed] == [[a_hashes[1]], [a_hashes[0]]]
    assert s.kv.evictions == 2
    assert s.kv.find_cached_prefix(request(a)) == []
    assert len(s.kv.find_cached_prefix(request(b))) == 1


def test_preemption_when_blocks_run_out() -> None:
    s = scheduler(kv_capacity_tokens=4 * 4)  # 16 token slots for two growing sequences
    a, b = request(range(6), max_tokens=10), request(range(50, 56), max_tokens=10)
    s.add(a, 0.0)
    s.add(b, 0.0)
    step(s)
    step(s)
    assert s.kv.num_free_blocks == 0 and (a.generated, b.generated) == (2, 2)
    assert step(s).preempted == []  # 8 tokens still fit in two blocks each
    plan = step(s)  # A's 9th token needs a third block: B, the newest, makes room
    assert plan.preempted == [b] and [r for r, _ in plan.scheduled] == [a]
    assert (b.state, b.num_computed_tokens, b.blocks) == (State.WAITING, 0, [])
    assert list(s.waiting) == [b]
    drain(s)
    assert (a.generated, b.generated) == (10, 10)  # B kept its tokens and recomputed them
    assert b.tokens[:9] == [*range(50, 56), 7, 7, 7]
    assert (s.stats.preemptions, b.preemptions) == (1, 1)
    assert s.kv.num_used_blocks == 0


def test_lora_slots_hold_back_a_second_adapter() -> None:
    s = scheduler(lora_modules=("a", "b"), max_loras=1)
    a1, b1, a2 = (request(range(i, i + 4), max_tokens=2, lora=n) for i, n in enumerate("aba"))
    for r in (a1, b1, a2):
        s.add(r, 0.0)
    plan = step(s)
    assert [r for r, _ in plan.scheduled] == [a1, a2]
    assert plan.shape.lora_loads == 1 and s.lora.resident == ["a"]
    assert list(s.waiting) == [b1]
    plan = step(s)  # a1 and a2 finish; b1 still waits for the slot this step
    assert b1.state is State.WAITING
    plan = step(s)
    assert [r for r, _ in plan.scheduled] == [b1] and plan.shape.lora_loads == 1
    assert s.lora.resident == ["b"] and s.stats.lora_loads == 2


def test_remote_prefill_waits_for_the_transfer_then_computes_one_token() -> None:
    s = scheduler(kv_transfer_ms_per_token=1.0)
    s.add(request(range(4), max_tokens=1), 0.0)  # cache the first block locally
    drain(s)
    r = request([*range(4), *range(10, 16)], max_tokens=2, remote_prefill=True)
    s.add(r, 100.0)
    assert s.schedule(100.0) is None  # transferring, outside the batch
    assert (r.num_cached_tokens, r.num_transferred_tokens) == (4, 6)
    assert s.num_waiting == 1 and s.next_wakeup(100.0) == pytest.approx(100.006)
    plan = s.schedule(100.006)
    assert plan is not None and plan.scheduled == [(r, 1)]
    assert plan.shape == StepShape(prefill_tokens=1, decode_seqs=0, context_tokens=10)
    s.finish_step(plan, 100.01)
    assert r.generated == 1 and r.first_token_at == 100.01


def test_remote_prefill_of_a_one_token_prompt_transfers_once() -> None:
    s = scheduler(kv_transfer_ms_per_token=1.0)
    r = request([5], max_tokens=2, remote_prefill=True)
    s.add(r, 0.0)
    assert s.schedule(0.0) is None and r.num_transferred_tokens == 1
    drain(s)
    assert r.generated == 2 and r.num_transferred_tokens == 1


def test_prefill_side_reports_its_blocks() -> None:
    s = scheduler()
    r = request(range(10), max_tokens=1, remote_decode=True)
    s.add(r, 0.0)
    drain(s)
    assert r.state is State.FINISHED and len(r.remote_block_ids) == 3


def test_abort_frees_blocks_anywhere() -> None:
    s = scheduler(max_num_seqs=1)
    running, waiting = request(range(8), max_tokens=50), request(range(20, 28))
    s.add(running, 0.0)
    s.add(waiting, 0.0)
    step(s)
    assert s.abort(waiting) and s.abort(running)
    assert not s.abort(running)  # twice is harmless
    assert s.kv.num_used_blocks == 0 and not s.running and not s.waiting
    assert running.abort_reason == "aborted"


# -- KV cache and step cost ------------------------------------------------------------


def test_block_hash_chain_and_event_values() -> None:
    kv = KVCache(8, 4, emit_events=True)
    r = request(range(9))
    assert kv.allocate(r, 9)
    kv.cache_full_blocks(r, 9, lora_id=None)
    h0 = hash_block(NONE_HASH, [0, 1, 2, 3])
    h1 = hash_block(h0, [4, 5, 6, 7])
    assert r.block_hashes == [h0, h1]
    [event] = kv.drain_events()
    assert event == BlockStored(
        block_hashes=[external_hash(h0), external_hash(h1)],
        parent_block_hash=None,
        token_ids=list(range(8)),
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    assert all(0 <= h < 2**64 for h in event.block_hashes)
    assert not kv.reset()  # blocks in use
    kv.free(r)
    assert kv.reset() and kv.num_cached_blocks == 0


def test_step_cost_model() -> None:
    legacy = StepCostModel(
        SimConfig(prefill_ms_per_token=0.5, decode_ms_per_token=4.0, batch_slowdown=0.5)
    )
    assert legacy.seconds(StepShape(prefill_tokens=40)) == pytest.approx(0.020)
    assert legacy.seconds(StepShape(decode_seqs=1)) == pytest.approx(0.004)
    assert legacy.seconds(StepShape(decode_seqs=2)) == pytest.approx(0.006)
    assert legacy.seconds(StepShape(prefill_tokens=10, decode_seqs=1)) == pytest.approx(0.009)
    assert legacy.seconds(StepShape()) == 0.0
    linear = StepCostModel(
        SimConfig(
            step_base_ms=5.0,
            prefill_ms_per_token=0.02,
            decode_ms_per_token=0.03,
            batch_slowdown=1.0,
            attention_ms_per_ktoken=0.1,
            lora_load_ms=10.0,
        )
    )
    shape = StepShape(prefill_tokens=100, decode_seqs=10, context_tokens=5000, lora_loads=1)
    assert linear.seconds(shape) == pytest.approx((5 + 2 + 0.3 + 0.5 + 10) / 1000)
    # The roofline: matmuls cost at least one read of the weights.
    roof = StepCostModel(SimConfig(weight_read_ms=6.0, prefill_ms_per_token=0.05))
    assert roof.seconds(StepShape(prefill_tokens=100)) == pytest.approx(0.006)
    assert roof.seconds(StepShape(prefill_tokens=200)) == pytest.approx(0.010)


def test_lora_registry_api() -> None:
    reg = LoraRegistry(["a=/p/a"], max_loras=1)
    assert reg.adapters["a"].path == "/p/a" and reg.id_of("a") == 1
    assert "added" in reg.load("b", "/p/b") and reg.id_of("b") == 2
    with pytest.raises(LoraError) as e:
        reg.load("b", "/p/b")
    assert e.value.status == 400
    assert reg.activate("a", set()) and not reg.activate("a", {"a"})
    assert reg.activate("b", set()) and reg.resident == ["b"]
    assert "removed" in reg.unload("b") and reg.resident == []
    with pytest.raises(LoraError) as e:
        reg.unload("b")
    assert e.value.status == 404


# -- the async engine ------------------------------------------------------------------


def fast(**overrides: object) -> SimConfig:
    return SimConfig(**{"decode_ms_per_token": 1.0, "time_scale": 20.0, **overrides})  # type: ignore[arg-type]


async def finished(*reqs: SimRequest) -> None:
    for r in reqs:
        while not r.done:
            await asyncio.wait_for(r.channel.wait(), 10)


async def test_engine_fifo_one_slot_and_timestamps() -> None:
    engine = Engine(fast(max_num_seqs=1, prefill_ms_per_token=0.5, decode_ms_per_token=4.0))
    engine.start()
    try:
        reqs = [request(range(i * 100, i * 100 + 10), max_tokens=3) for i in range(3)]
        for r in reqs:
            engine.submit(r)
        await finished(*reqs)
        assert all(r.state is State.FINISHED and r.generated == 3 for r in reqs)
        assert engine.max_running_seen == 1
        for earlier, later in itertools.pairwise(reqs):
            assert later.admitted_at >= earlier.finished_at  # type: ignore[operator]
        first = reqs[0]
        # Prefill of 10 tokens = 5 ms of model time, then >= 4 ms per decode step.
        assert first.first_token_at - first.arrival >= 0.005 - 1e-9  # type: ignore[operator]
        assert first.finished_at - first.first_token_at >= 0.008 - 1e-9  # type: ignore[operator]
    finally:
        await engine.stop()


async def test_engine_stop_aborts_and_crash_fails_requests() -> None:
    engine = Engine(fast(max_num_seqs=1, decode_ms_per_token=1000.0, time_scale=1.0))
    engine.start()
    running, queued = request(range(4), max_tokens=1000), request(range(9, 13))
    engine.submit(running)
    engine.submit(queued)
    while running.generated == 0:
        await asyncio.wait_for(running.channel.wait(), 10)
    snap = engine.snapshot()
    assert (snap.running, snap.waiting) == (1, 1)
    await engine.stop()
    assert running.state is State.ABORTED and queued.state is State.ABORTED
    assert queued.abort_reason == "server is shutting down"
    with pytest.raises(RuntimeError):
        engine.submit(request(range(3)))

    class Broken:
        def on_prefix_cache(self, queries: int, hits: int) -> None:
            raise RuntimeError("bug")

    engine = Engine(fast(), observer=Broken())  # type: ignore[arg-type]
    engine.start()
    try:
        r = request(range(4))
        engine.submit(r)
        await finished(r)
        assert r.state is State.ABORTED and "crashed" in r.abort_reason
    finally:
        await engine.stop()


def test_an_offload_tier_takes_evicted_blocks_and_announces_them_as_vllm_does() -> None:
    from epp.sim.kvcache import MEDIUM_CPU, BlockRemoved

    kv = KVCache(2, 4, emit_events=True, offload_blocks=1)
    a = request(range(9))  # two full blocks
    assert kv.allocate(a, 9) is False  # three blocks needed, two exist
    assert kv.allocate(a, 8)
    kv.cache_full_blocks(a, 8, lora_id=None)
    kv.free(a)
    kv.drain_events()
    h0, h1 = (external_hash(h) for h in a.block_hashes)
    b = request(range(100, 108))
    assert kv.allocate(b, 8)  # evicts a's blocks: tail first freed, head first evicted
    events = kv.drain_events()
    # each GPU eviction: a CPU store by hash only, then the GPU removal; the tier holds
    # one block, so the first offloaded block leaves it again
    assert events == [
        BlockStored([h1], None, [], 4, None, MEDIUM_CPU, None),
        BlockRemoved([h1], "GPU"),
        BlockStored([h0], None, [], 4, None, MEDIUM_CPU, None),
        BlockRemoved([h1], MEDIUM_CPU),
        BlockRemoved([h0], "GPU"),
    ]
    assert kv.is_offloaded(a.block_hashes[0]) and not kv.is_offloaded(a.block_hashes[1])
