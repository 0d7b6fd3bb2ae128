"""config/prefix-aware.yaml, "sticky until saturated": the affinity filter's live-load gate
on hand-made endpoint sets, and the whole config spreading equal endpoints in a burst."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config_file
from epp.config.params import parse_params
from epp.datastore import Datastore, Endpoint, EndpointSnapshot
from epp.director import Director
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from tests.helpers import completion, plugin, snap, with_metrics

CONFIG = Path(__file__).resolve().parents[2] / "config" / "prefix-aware.yaml"

# 1,000 tok/s makes 1 token = 1 ms, so the arithmetic below reads in tokens.
LIVE = {
    "loadSignal": "live",
    "peakPrefillThroughput": 1000,
    "maxTTFTPenaltyMs": 5000,
    "queuedRequestTokens": 500,
}


def live_filter():
    return plugin("prefix-cache-affinity-filter", LIVE)


def matched(total: int = 10, **blocks: int) -> CycleState:
    """A cycle whose prefix producer found `blocks[name]` of `total` blocks on each endpoint."""
    state = CycleState()
    info = PrefixMatchInfo(
        total_blocks=total, block_size_tokens=16, matched=dict(blocks), cached_blocks=blocks
    )
    state.write(PREFIX_MATCH_KEY, info)
    return state


def names(endpoints: list[EndpointSnapshot]) -> list[str]:
    return [e.name for e in endpoints]


def busy(
    name: str, prefill: int = 0, decode: int = 0, queue: int = 0, requests: int = 0
) -> EndpointSnapshot:
    s = snap(name, inflight_tokens=prefill + decode, inflight_prefill_tokens=prefill)
    s = dataclasses.replace(s, inflight_requests=requests)
    return with_metrics(s, waiting_queue_size=queue)


def test_live_load_counts_prompt_decode_and_every_request():
    f = live_filter()
    # 1,000 prompt + 3,000 expected output + 2 queued × 500 = 5,000 tokens = 5,000 ms.
    assert f.load_tokens(busy("a", prefill=1000, decode=3000, queue=2)) == 5000
    assert f.ttft_ms(busy("a", prefill=1000, decode=3000, queue=2)) == 5000.0
    # 3 requests in flight from this EPP weigh 500 each too: 5,000 + 1,500.
    assert f.load_tokens(busy("a", prefill=1000, decode=3000, queue=2, requests=3)) == 6500
    # llm-d's signal sees only the 1,000 prompt tokens.
    prefill_only = plugin("prefix-cache-affinity-filter", {"peakPrefillThroughput": 1000})
    assert prefill_only.load_tokens(busy("a", prefill=1000, decode=3000, queue=2)) == 1000


def test_hit_below_threshold_is_not_sticky():
    # 7 of 10 blocks = 0.7 < 0.8: nobody sticky, everyone kept for the scorers.
    eps = [busy("a"), busy("b"), busy("c")]
    assert names(live_filter().filter(matched(a=7), completion(), eps)) == ["a", "b", "c"]


def test_hit_above_threshold_sticks_while_below_saturation():
    f = live_filter()
    # a holds 9/10, b 8/10 (= 0.8, sticky), c 2/10. a has 4,000 tokens of decode ahead of
    # it, c none: 4,000 ms − 0 = 4,000 ≤ 5,000, so both cached endpoints stay.
    eps = [busy("a", decode=4000), busy("b", decode=4500), busy("c")]
    assert names(f.filter(matched(a=9, b=8, c=2), completion(), eps)) == ["a", "b"]


def test_sticky_endpoint_past_saturation_opens_to_everyone():
    f = live_filter()
    # a alone is cached; 3,000 prompt + 2,500 output = 5,500 ms vs idle b: 5,500 > 5,000.
    eps = [busy("a", prefill=3000, decode=2500), busy("b")]
    assert names(f.filter(matched(a=10), completion(), eps)) == ["a", "b"]
    # llm-d's prefill signal counts only the 3,000 prompt tokens: it would still stick.
    old = plugin(
        "prefix-cache-affinity-filter", {"peakPrefillThroughput": 1000, "maxTTFTPenaltyMs": 5000}
    )
    assert names(old.filter(matched(a=10), completion(), eps)) == ["a"]


def test_scraped_queue_alone_can_saturate():
    f = live_filter()
    # Nothing in flight from this EPP, but a's server reports 11 waiting: 11 × 500 = 5,500.
    eps = [busy("a", queue=11), busy("b")]
    assert names(f.filter(matched(a=10), completion(), eps)) == ["a", "b"]
    eps = [busy("a", queue=10), busy("b")]  # 5,000: not more than the penalty
    assert names(f.filter(matched(a=10), completion(), eps)) == ["a"]


def test_all_saturated_stays_sticky():
    f = live_filter()
    # Every endpoint equally loaded (20,000 tokens): no better place, keep the cached one.
    eps = [busy("a", decode=20_000), busy("b", decode=20_000), busy("c", decode=20_000)]
    assert names(f.filter(matched(a=10), completion(), eps)) == ["a"]
    # All cached and all saturated: nothing to compare against, all kept.
    assert names(f.filter(matched(a=10, b=10, c=10), completion(), eps)) == ["a", "b", "c"]


def test_none_cached_keeps_everyone():
    eps = [busy("a", decode=9000), busy("b")]
    assert names(live_filter().filter(matched(), completion(), eps)) == ["a", "b"]
    assert names(live_filter().filter(CycleState(), completion(), eps)) == ["a", "b"]


def test_queued_request_tokens_needs_the_live_signal():
    spec = PLUGIN_TYPES.lookup("prefix-cache-affinity-filter")
    with pytest.raises(ConfigError, match="queuedRequestTokens is read only with loadSignal"):
        parse_params(spec.params, {"queuedRequestTokens": 2048})
    with pytest.raises(ConfigError, match="loadSignal"):
        parse_params(spec.params, {"loadSignal": "kv"})


def test_cached_long_prompts_in_flight_keep_the_server_sticky():
    # Long context (8,000 cached + 500 new tokens) at 15,928 tok/s, penalty 250 ms =
    # 3,982 tokens, 1,024 per request. a (cached) has 2 requests in flight, each holding
    # its 500 uncached tokens + 50 output: 2 × (550 + 1,024) = 3,148 ≤ 3,982: stays
    # sticky. Counting whole prompts (2 × 8,550 = 17,100) would send the next request to
    # a cold server that must prefill all 8,500 tokens.
    f = plugin(
        "prefix-cache-affinity-filter",
        {"loadSignal": "live", "queuedRequestTokens": 1024, "maxTTFTPenaltyMs": 250},
    )
    eps = [busy("a", prefill=1000, decode=100, requests=2), busy("b")]
    assert names(f.filter(matched(a=10), completion(), eps)) == ["a"]
    # A third such request tips it: 3 × 1,574 = 4,722 > 3,982.
    eps = [busy("a", prefill=1500, decode=150, requests=3), busy("b")]
    assert names(f.filter(matched(a=10), completion(), eps)) == ["a", "b"]


def test_a_routed_request_holds_only_its_uncached_prompt():
    ds, d = director(2, seed=0)
    prompt = "a long shared document " * 500 + "question one"  # ~2,878 tokens (chars / 4)
    first = d.route(completion(prompt, max_tokens=10), None)
    (hold,) = first.held
    # Nothing cached anywhere yet: the whole prompt is prefill work.
    assert hold.prompt_tokens == completion(prompt, max_tokens=10).prompt_tokens_estimate
    # (2,878 + 10 + 1,024 < 3,982 would stick anyway; the release makes it plain.)
    # Its first token came back, so its server now owes 10 output tokens + 1,024 for the
    # request: under the 3,982-token gate, so the next request with that prefix sticks.
    d.first_token(first)
    second = d.route(completion(prompt + " and two", max_tokens=10), None)
    (hold2,) = second.held
    assert hold2.name == hold.name  # sticky: the prefix is there
    # The approximate index says the picked server holds every full 16-token block of
    # the first prompt: what is left is the tail, less than a few blocks.
    assert 0 < hold2.prompt_tokens < 64, hold2
    tokens = ds.inflight(hold.name)[1]
    assert tokens == hold2.prompt_tokens + 2 * 10  # the first's prompt was given back


# ---- the shipped config --------------------------------------------------------------


def director(n: int, seed: int) -> tuple[Datastore, Director]:
    cfg = load_config_file(CONFIG, Handle(rng=random.Random(seed)))
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(f"s{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)])
    return ds, Director(ds, cfg.scheduler, cfg.pre_request)


def test_shipped_config_is_the_filter_then_token_load_then_prefix():
    cfg = load_config_file(CONFIG)
    (profile,) = cfg.scheduler.profiles.values()
    assert [f.type_name for f in profile.filters] == ["prefix-cache-affinity-filter"]
    assert [(s.scorer.type_name, s.weight) for s in profile.scorers] == [
        ("token-load-scorer", 1.0),
        ("prefix-scorer", 1e-7),
    ]
    filt = profile.filters[0]
    assert filt.include_request and filt.cached_penalty_factor == 2 and filt.live
    assert filt.max_penalty_ms == 250
    assert profile.scorers[0].scorer.per_request == 128
    assert filt.eviction and profile.scorers[0].scorer.eviction  # both price evictions


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_burst_with_one_prefix_spreads_evenly(seed: int):
    ds, d = director(4, seed)
    prompt = "shared system prompt " * 400 + "question"  # 8,408 characters: 2,102 tokens
    # 200 requests, none finishing. The first on a server holds its whole prompt (2,102
    # tokens, uncached) + 16 output; every later one there is cached (131 blocks of 64
    # characters = 2,096 tokens) and holds its 6-token tail + 16. The gate (250 ms at
    # 15,928 tok/s = 3,982 tokens) compares a's live load + 1,024 per request + 6 with a
    # cold server's 2,102: the 5th request finds 2,118 + 3 × 22 + 4 × 1,024 + 6 = 6,286,
    # 4,184 more than 2,102, and opens it. token-load then weighs a (2,184 + 4 × 128 + 6 =
    # 2,702) against a cold server (2,102): the cold one. Every server that takes one
    # becomes sticky too, and token-load fills the least loaded: 50 each, ±1 for the random
    # order of ties.
    picks = Counter(
        d.route(completion(prompt, max_tokens=16), None).destinations[0] for _ in range(200)
    )
    assert len(picks) == 4 and max(picks.values()) - min(picks.values()) <= 2, picks
    assert (
        ds.inflight("s0")[0] + ds.inflight("s1")[0] + ds.inflight("s2")[0] + ds.inflight("s3")[0]
        == 200
    )


def test_exact_ties_do_not_fall_to_the_same_endpoint():
    # Four idle, uncached endpoints, each request released before the next: every pick is an
    # exact tie (load 0, no prefix), so only the picker's random draw decides. Unique prompts
    # so no prefix forms. 400 picks: 100 expected per endpoint, σ ≈ 8.7; a fixed tie-break
    # would give 400 to one.
    _, d = director(4, seed=3)
    picks: Counter[str] = Counter()
    for i in range(400):
        decision = d.route(completion(f"{i} unique {i * 7919}", max_tokens=4), None)
        picks[decision.destinations[0]] += 1
        d.release(decision)
    assert len(picks) == 4 and min(picks.values()) >= 60, picks


# ---- the request's own uncached prompt, and the per-request load -----------------------

PROMPT = "abc " * 1000  # 4,000 characters = 1,000 tokens (characters / 4)


def cached(**tokens: int) -> CycleState:
    """A cycle where each named endpoint caches `tokens[name]` leading prompt tokens
    (multiples of 16: whole blocks); the prompt is 63 blocks (1,000 tokens)."""
    state = CycleState()
    blocks = {n: t // 16 for n, t in tokens.items()}
    info = PrefixMatchInfo(
        total_blocks=63, block_size_tokens=16, matched=dict(blocks), cached_blocks=blocks
    )
    state.write(PREFIX_MATCH_KEY, info)
    return state


def test_token_load_adds_what_this_request_would_prefill_there():
    scorer = plugin("token-load-scorer", {"queueThresholdTokens": 10_000})
    # a caches 800 of the 1,000 tokens and has 500 in flight: 500 + 200 = 700.
    # b caches nothing and is idle: 0 + 1,000 = 1,000. a scores higher though busier.
    a, b = snap("a", inflight_tokens=500), snap("b")
    scores = scorer.score(cached(a=800), completion(PROMPT), [a, b])
    assert scores == [pytest.approx(1 - 700 / 10_000), pytest.approx(1 - 1000 / 10_000)]
    # Without a prefix producer the prompt costs everyone the same: only in-flight counts.
    assert scorer.score(CycleState(), completion(PROMPT), [a, b]) == [0.95, 1.0]


def test_token_load_per_request_tokens_weigh_every_request_in_flight():
    scorer = plugin("token-load-scorer", {"queueThresholdTokens": 10_000, "perRequestTokens": 1024})
    # a: 300 tokens in 3 requests = 300 + 3 × 1,024 = 3,372; b: 2,000 tokens in 1 = 3,024.
    a = dataclasses.replace(snap("a", inflight_tokens=300), inflight_requests=3)
    b = dataclasses.replace(snap("b", inflight_tokens=2000), inflight_requests=1)
    assert scorer.score(CycleState(), completion(), [a, b]) == [
        pytest.approx(1 - 3372 / 10_000),
        pytest.approx(1 - 3024 / 10_000),
    ]


def gate(include: bool):
    params = {**LIVE, "maxTTFTPenaltyMs": 300, "includeRequest": include}
    return plugin("prefix-cache-affinity-filter", params)


def test_gate_counts_the_prefill_a_cold_endpoint_would_pay():
    # a caches 992 of the 1,000 tokens (62 blocks) and owes 600 tokens of live load (one
    # request: 100 + 500 per request); b is cold and idle. 1 token = 1 ms here.
    eps = [busy("a", decode=100, requests=1), busy("b")]
    # In-flight only (llm-d's released rule): 600 − 0 = 600 > 300 → everyone kept.
    assert names(gate(False).filter(cached(a=992), completion(PROMPT), eps)) == ["a", "b"]
    # With the request: a = 600 + 8 uncached = 608, b = 0 + 1,000 = 1,000: a is the faster
    # first token by 392 ms, so it stays sticky.
    assert names(gate(True).filter(cached(a=992), completion(PROMPT), eps)) == ["a"]
    # a with 4 such requests: 100 + 4 × 500 + 8 = 2,108 vs 1,000: 1,108 > 300 → opens.
    eps = [busy("a", decode=100, requests=4), busy("b")]
    assert names(gate(True).filter(cached(a=992), completion(PROMPT), eps)) == ["a", "b"]


def test_gate_with_the_request_on_a_short_prompt_is_the_load_gate():
    # A 16-token prompt saves at most 16 ms by sticking: the gate is what it was. a holds
    # it (1 block) and owes 400; b owes nothing and would prefill 16: 400 − 16 = 384 > 300.
    eps = [busy("a", decode=400, requests=0), busy("b")]
    short = completion("abcd" * 16)  # 64 characters = 16 tokens
    assert names(gate(True).filter(matched(total=1, a=1), short, eps)) == ["a", "b"]


def test_cached_penalty_factor_caps_what_a_short_prompt_may_queue_for():
    # A 48-token prompt (192 characters, 3 blocks), all cached on a: sticking saves 48 ms
    # of prefill, so with cachedPenaltyFactor 1 the gate tolerates at most 48 ms, not 300.
    state = CycleState()
    info = PrefixMatchInfo(
        total_blocks=3, block_size_tokens=16, matched={"a": 3}, cached_blocks={"a": 3}
    )
    state.write(PREFIX_MATCH_KEY, info)
    short = completion("abcd" * 48)
    capped = plugin(
        "prefix-cache-affinity-filter",
        {**LIVE, "maxTTFTPenaltyMs": 300, "includeRequest": True, "cachedPenaltyFactor": 1},
    )
    # a owes 50 (+ 0 uncached), b nothing (+ 48 to prefill): 2 ms ≤ 48 → sticky.
    assert names(capped.filter(state, short, [busy("a", decode=50), busy("b")])) == ["a"]
    # a owes 120: 120 − 48 = 72 ms > 48 → everyone; the flat 300 ms penalty would stick.
    eps = [busy("a", decode=120), busy("b")]
    assert names(capped.filter(state, short, eps)) == ["a", "b"]
    assert names(gate(True).filter(state, short, eps)) == ["a"]
    # A long cached prefix keeps the full penalty: 992 cached tokens cap at 300, not 992.
    eps = [busy("a", decode=100, requests=1), busy("b")]  # 600 + 8 vs 1,000: sticky
    assert names(capped.filter(cached(a=992), completion(PROMPT), eps)) == ["a"]
    eps = [busy("a", decode=100, requests=3), busy("b")]  # 1,600 + 8 − 1,000 = 608 > 300
    assert names(capped.filter(cached(a=992), completion(PROMPT), eps)) == ["a", "b"]


def test_cached_penalty_factor_scales_the_cap():
    # The same 48 cached tokens at factor 2: the cap is 96 ms. a owes 120: 72 ≤ 96 → sticky.
    state = CycleState()
    info = PrefixMatchInfo(
        total_blocks=3, block_size_tokens=16, matched={"a": 3}, cached_blocks={"a": 3}
    )
    state.write(PREFIX_MATCH_KEY, info)
    f = plugin(
        "prefix-cache-affinity-filter",
        {**LIVE, "maxTTFTPenaltyMs": 300, "includeRequest": True, "cachedPenaltyFactor": 2},
    )
    short = completion("abcd" * 48)
    assert names(f.filter(state, short, [busy("a", decode=120), busy("b")])) == ["a"]
    # a owes 150: 150 − 48 = 102 > 96 → everyone.
    assert names(f.filter(state, short, [busy("a", decode=150), busy("b")])) == ["a", "b"]


# ---- evictionCost: a prefill into a full cache evicts what later requests would hit ----


def filled(fill: dict[str, float], prompt_tokens: int = 1000, **tokens: int) -> CycleState:
    """`cached(**tokens)` whose producer counted `prompt_tokens` and reports each
    endpoint's cache `fill` (unnamed endpoints: 0)."""
    state = CycleState()
    blocks = {n: t // 16 for n, t in tokens.items()}
    info = PrefixMatchInfo(
        total_blocks=63, block_size_tokens=16, matched=dict(blocks), cached_blocks=blocks,
        prompt_tokens=prompt_tokens, occupancy=lambda ns: [fill.get(n, 0.0) for n in ns],
    )  # fmt: skip
    state.write(PREFIX_MATCH_KEY, info)
    return state


def evicting_gate(eviction: bool):
    params = {**LIVE, "includeRequest": True, "cachedPenaltyFactor": 0.5}
    return plugin("prefix-cache-affinity-filter", {**params, "evictionCost": eviction})


def test_eviction_cost_keeps_a_group_off_a_full_cold_server():
    # Real vLLM's case (docs/BENCHMARKS.md): a holds 992 of the 1,000-token prompt and has
    # two requests in flight, one still prefilling 900 tokens; b is idle and cold. a =
    # 900 + 2 × 500 + 8 uncached = 1,908, b = 1,000: 908 > the cap (0.5 × 992 = 496) →
    # the gate opens and b, idle, takes the group: a second copy of its prefix.
    eps = [busy("a", prefill=900, requests=2), busy("b")]
    state = filled({"a": 1.0, "b": 1.0}, a=992)
    assert names(evicting_gate(False).filter(state, completion(PROMPT), eps)) == ["a", "b"]
    # With evictionCost b's 1,000 tokens evict as many cached ones there: 2,000, and a
    # (1,908, its 8 tokens also into a full cache: 1,916) is the cheaper placement: sticky.
    assert names(evicting_gate(True).filter(state, completion(PROMPT), eps)) == ["a"]
    # b half full: 1,500; 1,916 − 1,500 = 416 ≤ 496 → still sticky.
    state = filled({"a": 1.0, "b": 0.5}, a=992)
    assert names(evicting_gate(True).filter(state, completion(PROMPT), eps)) == ["a"]
    # b with room to spare evicts nothing: the gate is what it was, and opens.
    state = filled({"a": 1.0}, a=992)
    assert names(evicting_gate(True).filter(state, completion(PROMPT), eps)) == ["a", "b"]


def test_eviction_cost_needs_include_request():
    spec = PLUGIN_TYPES.lookup("prefix-cache-affinity-filter")
    with pytest.raises(ConfigError, match="evictionCost weighs the request's own prompt"):
        parse_params(spec.params, {"evictionCost": True})


def test_token_load_eviction_cost_weighs_each_endpoints_fill():
    params = {"queueThresholdTokens": 10_000, "evictionCost": True}
    scorer = plugin("token-load-scorer", params)
    # a caches 800 of 1,000 tokens, 500 in flight, full: 500 + 200 × 2 = 900; b cold and
    # full: 1,000 × 2 = 2,000; c cold with room: 1,000.
    a, b, c = snap("a", inflight_tokens=500), snap("b"), snap("c")
    state = filled({"a": 1.0, "b": 1.0}, a=800)
    assert scorer.score(state, completion(PROMPT), [a, b, c]) == [
        pytest.approx(1 - 900 / 10_000),
        pytest.approx(1 - 2000 / 10_000),
        pytest.approx(1 - 1000 / 10_000),
    ]
    plain = plugin("token-load-scorer", {"queueThresholdTokens": 10_000})
    assert plain.score(state, completion(PROMPT), [a, b, c]) == [
        pytest.approx(1 - 700 / 10_000),
        pytest.approx(1 - 1000 / 10_000),
        pytest.approx(1 - 1000 / 10_000),
    ]


def test_the_counted_prompt_replaces_the_character_estimate():
    # The producer counted 1,200 tokens (a chat template, a real tokenizer) where the
    # characters say 1,000: a cold endpoint owes the 1,200 it will prefill.
    scorer = plugin("token-load-scorer", {"queueThresholdTokens": 10_000})
    state = filled({}, prompt_tokens=1200, a=800)
    assert scorer.score(state, completion(PROMPT), [snap("a"), snap("b")]) == [
        pytest.approx(1 - 400 / 10_000),
        pytest.approx(1 - 1200 / 10_000),
    ]
