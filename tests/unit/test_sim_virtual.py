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
from epp.sim.kvcache import KVCache
from epp.sim.sequence import SimRequest
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


def run(config: SimConfig, reqs, *, macro: bool, samples=(), **options):
    """Feed arrivals in time order (advancing to each first), then drain; returns the
    finished records by rid, the engine, and the loads read at the `samples` times."""
    eng = VirtualEngine(config, block_tokens=64, macro=macro, record_token_times=True, **options)
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


def test_same_times_with_a_long_prefill_threshold():
    # Long prompts chunked thin share their steps with decodes: the macro step must not
    # jump while one is in the batch, and the blocked-head check must cap its chunk too.
    config = presets.config_for("llama-3.1-8b-h100", long_prefill_token_threshold=96)
    reqs = workload(200, rate=15.0, seed=3, isl=(20, 1500), osl=(1, 120))
    single, eng1, _ = run(config, reqs, macro=False)
    macro, eng2, _ = run(config, reqs, macro=True)
    assert_same(single, macro)
    assert eng2.scheduler.stats.steps == eng1.scheduler.stats.steps
    assert eng2.macro_steps > 0
    off, _, _ = run(presets.config_for("llama-3.1-8b-h100"), reqs, macro=True)
    long = [rid for rid, _, isl, _, _ in reqs if isl > 1000]
    # long prompts that shared the engine were chunked thin: they waited longer
    assert sum(single[r].first_token > off[r].first_token for r in long) > len(long) / 2


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


def test_naming_blocks_after_the_trace_ids_caches_exactly_what_hashing_tokens_does():
    # Same workload, prompt blocks hashed from their tokens vs named after the trace's
    # hash ids: the same hits, preemptions and token times.
    config = replace(presets.config_for("tiny"), kv_capacity_tokens=96 * 16, max_model_len=1024)
    reqs = workload(150, rate=25.0, seed=3, isl=(5, 500), osl=(1, 60), shared=3)
    named, eng1, _ = run(config, reqs, macro=True, trace_hashes=True)
    hashed, eng2, _ = run(config, reqs, macro=True, trace_hashes=False)
    assert eng1.scheduler.stats.prefix_cache_hits == eng2.scheduler.stats.prefix_cache_hits > 0
    assert eng1.kv.evictions == eng2.kv.evictions > 0
    assert_same(named, hashed)


def test_counting_blocks_without_caching_is_the_kv_cache_without_caching():
    # A small cache so sequences get preempted and the queue's head waits for blocks.
    config = replace(
        presets.config_for("tiny"), kv_capacity_tokens=48 * 16, max_model_len=768,
        enable_prefix_caching=False,
    )  # fmt: skip
    reqs = workload(150, rate=30.0, seed=4, isl=(10, 300), osl=(1, 200))
    samples = [0.25 * i for i in range(30)]
    counted, eng1, loads1 = run(config, reqs, macro=True, samples=samples)
    cached, eng2, loads2 = run(config, reqs, macro=True, samples=samples, count_blocks=False)
    assert type(eng1.kv).__name__ == "BlockCounter" and type(eng2.kv).__name__ == "KVCache"
    assert eng1.scheduler.stats.preemptions == eng2.scheduler.stats.preemptions > 0
    assert_same(counted, cached)
    assert loads1 == loads2


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


def test_a_request_arriving_mid_run_joins_the_step_after_the_started_ones():
    # tiny: request 0's prefill step ends at 3.0 ms, then decode steps of 2.1 ms start
    # at 3.0, 5.1, 7.2, 9.3 ms (the one starting at 9.3 ends at 11.4). Request 1 arrives
    # at 10 ms and joins the step at 11.4 ms: 2 + 0.01 x 100 + 0.1 x 1 decode = 3.1 ms,
    # so its first token is at 14.5 ms (a TTFT of 4.5 ms).
    eng = VirtualEngine(presets.config_for("tiny"), record_token_times=True)
    eng.add(0, 100, 50, at=0.0)
    eng.advance_to(0.010)
    # Mid-run: the load is exact without carrying the run out. 100 + 50 tokens hold
    # ceil(149 / 16) = 10 blocks at the end; after 4 decode steps it holds tokens
    # 0..103 computed = ceil(104 / 16) = 7 blocks of tiny's 128; 46 outputs left.
    load = eng.load()
    assert (load.running, load.waiting) == (1, 0)
    assert load.kv_usage == pytest.approx(7 / 128)
    assert load.in_flight_tokens == 50 - 5  # 1 token from the prefill step, 4 decoded
    assert eng.next_event_time() == pytest.approx(0.003 + 49 * 0.0021)  # its last token
    eng.add(1, 100, 2, at=0.010)
    eng.advance_to(math.inf)
    done = {f.rid: f for f in eng.drain_finished()}
    assert done[1].ttft_s == pytest.approx(0.0045)
    assert done[0].token_times[:6] == pytest.approx([0.003, 0.0051, 0.0072, 0.0093, 0.0114,
                                                     0.0145])  # fmt: skip
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


def test_a_request_whose_hashes_are_known_still_computes_its_last_token():
    # 8 tokens in blocks of 4: both blocks are full and cached, but a hit may cover at
    # most (8 - 1) // 4 = 1 block, so the last token is computed for the logits. (A
    # preempted request, or one whose block names come from a trace, already has every
    # full block's hash when it is looked up.)
    kv = KVCache(8, 4)
    req = SimRequest(list(range(8)), 1)
    assert kv.allocate(req, 8)
    kv.cache_full_blocks(req, 8)
    again = SimRequest(list(range(8)), 1)
    kv.request_block_hashes(again, 8)  # both hashes known up front
    assert len(kv.find_cached_prefix(again)) == 1


def test_load_read_often_inside_runs_is_the_single_stepped_load():
    # load() keeps the queues' part until they change and looks a run's new blocks up
    # by bisection: read every 7 ms (many reads per decode run, across block boundaries
    # of 16 tokens), it must equal the single-stepped engine's load, and the lookup
    # must equal `_new_blocks` summed request by request.
    config = presets.config_for("llama-3.1-8b-h100", enable_prefix_caching=True)
    reqs = workload(150, rate=25.0, seed=5, osl=(20, 300), shared=3)
    samples = [0.007 * i for i in range(1000)]
    _, _, single = run(config, reqs, macro=False, samples=samples)
    _, _, macro = run(config, reqs, macro=True, samples=samples)
    assert [(x.waiting, x.running, x.in_flight_tokens) for x in single] == [
        (y.waiting, y.running, y.in_flight_tokens) for y in macro
    ]
    assert [x.kv_usage for x in single] == pytest.approx([y.kv_usage for y in macro])

    eng = VirtualEngine(config, block_tokens=64)
    checked = 0
    for rid, at, isl, osl, ids in reqs:
        eng.advance_to(at)
        if eng._run is not None:
            for m in range(eng._run.steps + 1):
                assert eng._run_new_blocks(eng._run, m) == eng._new_blocks(m)
                checked += 1
        eng.add(rid, isl, osl, at, ids)
    assert checked > 100


def test_reading_an_engine_not_yet_due_equals_advancing_it_first():
    # Issue 15 item 3: a pool advances an engine only once `due_after()` has passed and
    # reads the others at the arrival (`load(at)`, `gauges(at)`). Against an engine
    # advanced to every read time first: the same load to the bit, read every 7 ms
    # (inside decode runs, across block boundaries), and the remembered step count
    # equals `started_before`'s.
    config = presets.config_for("llama-3.1-8b-h100", enable_prefix_caching=True)
    reqs = workload(150, rate=25.0, seed=5, osl=(20, 300), shared=3)
    events = sorted([(r[1], 0, r) for r in reqs] + [(0.007 * i, 1, None) for i in range(1000)])
    ref, lazy = VirtualEngine(config, block_tokens=64), VirtualEngine(config, block_tokens=64)
    skipped = 0
    for at, kind, r in events:
        ref.advance_to(at)
        if lazy.due_after() < at:
            lazy.advance_to(at)
        else:
            skipped += 1
        if kind == 0:
            rid, at, isl, osl, ids = r
            ref.add(rid, isl, osl, at, ids)
            lazy.add(rid, isl, osl, at, ids)
            continue
        want = ref.load()
        # gauges first: after a change it reads the queues without load()'s cached part
        assert lazy.gauges(at) == (want.waiting, want.running, want.kv_usage)
        assert lazy.load(at) == want
        run = lazy._run
        if run is not None:
            assert lazy._started_before(run, at) == run.started_before(at)
    assert skipped > 500  # most reads found the engine inside a run not yet due
