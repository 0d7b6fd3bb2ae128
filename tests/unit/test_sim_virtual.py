"""The virtual-time engine: the simulator's scheduler stepped by the caller's clock, with
decode-only runs jumped over in closed form. Jumping must not change anything a replay
measures, so every test here runs the same requests twice (macro-stepping on and off)
and compares every output token's time."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from epp.sim import presets
from epp.sim.config import SimConfig
from epp.sim.virtual import HASH_BASE, VirtualEngine, prompt_tokens


def workload(n: int, rate: float, seed: int, *, isl=(20, 400), osl=(1, 300), shared=0):
    """(rid, at, isl, osl, hash_ids): Poisson arrivals; with `shared` > 0, prompts draw
    their first blocks from `shared` common prefixes (a Mooncake-like reuse)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for rid in range(n):
        t += rng.expovariate(rate)
        i = rng.randint(*isl)
        hash_ids: tuple[int, ...] = ()
        if shared:
            base = rng.randrange(shared) * 100
            hash_ids = tuple(base + b for b in range(-(-i // 64)))
            if rng.random() < 0.5:  # a fresh suffix block after the shared prefix
                hash_ids = hash_ids[:1] + tuple(10_000 + rid * 10 + b for b in range(9))
        out.append((rid, t, i, rng.randint(*osl), hash_ids))
    return out


def run(config: SimConfig, reqs, *, macro: bool, samples=()):
    """Feed arrivals in time order (advancing to each first), then drain; returns the
    finished records by rid, the engine, and the loads read at the `samples` times."""
    eng = VirtualEngine(config, block_tokens=64, macro=macro, record_token_times=True)
    events = sorted([(at, 0, r) for r in reqs for at in [r[1]]] + [(s, 1, None) for s in samples])
    loads = []
    for at, kind, r in events:
        eng.advance_to(at)
        if kind == 0:
            rid, at, isl, osl, hash_ids = r
            eng.add(rid, isl, osl, at, hash_ids)
        else:
            loads.append(eng.load())
    eng.advance_to(math.inf)
    return {f.rid: f for f in eng.drain_finished()}, eng, loads


def assert_same(a, b):
    assert a.keys() == b.keys()
    for rid in a:
        x, y = a[rid], b[rid]
        assert (x.osl, x.cached_tokens, x.preemptions) == (y.osl, y.cached_tokens, y.preemptions)
        assert len(x.token_times) == len(y.token_times) == x.osl
        for s, t in zip(x.token_times, y.token_times, strict=True):
            assert s == pytest.approx(t, rel=1e-9, abs=1e-9)


def test_macro_steps_give_the_same_token_times_as_single_steps_8b():
    config = presets.config_for("llama-3.1-8b-h100", enable_prefix_caching=False)
    reqs = workload(300, rate=20.0, seed=1)
    single, eng1, _ = run(config, reqs, macro=False)
    macro, eng2, _ = run(config, reqs, macro=True)
    assert len(single) == 300
    assert_same(single, macro)
    # The point of it: most decode steps were jumped over, in far fewer runs.
    assert eng2.scheduler.stats.steps == eng1.scheduler.stats.steps
    assert eng2.macro_steps > 0
    assert eng2.macro_steps < eng1.scheduler.stats.steps / 5


def test_same_times_with_prefix_reuse_preemption_and_a_blocked_queue():
    # A small cache (64 blocks of 16 tokens = 1024 tokens) and long outputs: sequences
    # outgrow it (preemption), and the queue's head waits for blocks while the rest
    # decode (the blocked-head case the macro step must respect).
    config = replace(
        presets.config_for("tiny"), kv_capacity_tokens=64 * 16, max_model_len=1024,
        max_num_seqs=6, max_num_batched_tokens=128, attention_ms_per_ktoken=0.5,
    )  # fmt: skip
    reqs = workload(120, rate=30.0, seed=2, isl=(10, 300), osl=(1, 200), shared=4)
    single, eng1, loads1 = run(config, reqs, macro=False, samples=[0.5 * i for i in range(40)])
    macro, eng2, loads2 = run(config, reqs, macro=True, samples=[0.5 * i for i in range(40)])
    assert eng1.scheduler.stats.preemptions > 0
    assert eng1.scheduler.stats.prefix_cache_hits > 0
    assert_same(single, macro)
    assert eng2.macro_steps > 0
    # The load read at sample instants is the same too (KV use counts the same blocks).
    assert [(x.waiting, x.running, x.in_flight_tokens) for x in loads1] == [
        (y.waiting, y.running, y.in_flight_tokens) for y in loads2
    ]
    assert [x.kv_usage for x in loads1] == pytest.approx([y.kv_usage for y in loads2])


def test_a_lone_request_matches_the_step_cost_model_by_hand():
    # tiny: step = 2 ms base + max(0, 0.01 ms x prefill + 0.1 ms x decodes); no attention.
    # 100-token prompt: first step 2 + 1.0 = 3.0 ms (token 1); then 4 decode steps of
    # 2 + 0.1 = 2.1 ms each: tokens at 3.0, 5.1, 7.2, 9.3, 11.4 ms after arrival at 1 s.
    eng = VirtualEngine(presets.config_for("tiny"), record_token_times=True)
    eng.add(7, 100, 5, at=1.0)
    eng.advance_to(math.inf)
    (f,) = eng.drain_finished()
    assert f.rid == 7
    want = [1.0 + ms / 1000 for ms in (3.0, 5.1, 7.2, 9.3, 11.4)]
    assert list(f.token_times) == pytest.approx(want)
    assert f.ttft_s == pytest.approx(0.003)
    assert f.itl_s == pytest.approx(0.0021)  # (11.4 - 3.0) / 4 ms
    assert eng.macro_steps == 1  # the 4 decode steps in one jump


def test_advance_to_stops_at_the_first_step_starting_at_or_after_t():
    eng = VirtualEngine(presets.config_for("tiny"))
    eng.add(0, 100, 50, at=0.0)
    eng.advance_to(0.010)  # steps start at 0, 3.0, 5.1, 7.2, 9.3 ms; the last ends 11.4
    assert eng.clock == pytest.approx(0.0114)
    assert eng.load().running == 1
    assert eng.next_event_time() == pytest.approx(0.0114)
    eng.advance_to(math.inf)
    assert eng.idle and eng.next_event_time() == math.inf


def test_prompts_share_exactly_the_blocks_their_hash_ids_share():
    a = prompt_tokens(1, 150, (5, 6, 7), block_tokens=64)
    b = prompt_tokens(2, 100, (5, 6), block_tokens=64)
    c = prompt_tokens(3, 80, (), block_tokens=64)
    assert a[:100] == b  # blocks 5 and 6 (64 + 36 tokens of block 6)
    assert a[0] == HASH_BASE + 5 * 64
    assert len(a) == 150 and len(set(a)) == 150
    assert not set(c) & set(a)  # a request without hash ids shares nothing


def test_bad_requests_are_refused_with_the_reason():
    eng = VirtualEngine(presets.config_for("tiny"))  # max_model_len 1024
    with pytest.raises(ValueError, match="exceed the model's length 1024"):
        eng.add(1, 1000, 100, at=0.0)
    with pytest.raises(ValueError, match="isl and osl must be >= 1"):
        eng.add(2, 0, 10, at=0.0)
