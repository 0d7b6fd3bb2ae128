"""The approximate prefix index: exact scores on hand-made prompts and routing results.

Prompts use `blockSizeTokens: 1`, i.e. 4-character blocks, so "aaaabbbbcccc" is three
blocks and every expected score can be read off the prompt.
"""

from __future__ import annotations

import random

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config_text
from epp.datastore import Endpoint
from epp.observability import REGISTRY
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.prefix.approx_index import ApproxPrefixIndex
from plugins.prefix.hashing import chain_bytes, chain_seed, chain_tokens, token_bytes
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from tests.helpers import completion, snap, with_metrics

A, B, C = snap("a"), snap("b"), snap("c")
EPS = [A, B, C]


def producer(params: dict | None = None, handle: Handle | None = None):
    from epp.config.params import parse_params

    spec = PLUGIN_TYPES.lookup("approx-prefix-cache-producer")
    assert spec is not None
    p = {"blockSizeTokens": 1, **(params or {})}
    return spec.build(
        "approx", parse_params(spec.params, p), handle or Handle(rng=random.Random(0))
    )


def match(prod, request, endpoints=EPS) -> PrefixMatchInfo:
    assert prod.produces == PREFIX_MATCH_KEY
    return prod.produce(CycleState(), request, endpoints)


def route(prod, request, picks: dict[str, list], primary: str = "default", endpoints=EPS):
    """produce, then pre_request as if the profiles in `picks` chose those targets."""
    state = CycleState()
    state.write(prod.produces, prod.produce(state, request, endpoints))
    results = {name: (ProfileResult(t) if t is not None else None) for name, t in picks.items()}
    prod.pre_request(request, SchedulingResult(results, primary, cycle_state=state))
    return state.read(PREFIX_MATCH_KEY)


def scores(info: PrefixMatchInfo, endpoints=EPS) -> list[float]:
    return [info.score(e.name) for e in endpoints]


# ---- hashing ------------------------------------------------------------------------
def test_hash_chain_is_xxh64_of_block_then_previous_hash_le():
    import struct

    import xxhash

    seed = chain_seed("m")
    assert seed == xxhash.xxh64_intdigest(b"m")
    assert chain_seed("m", "salt") == xxhash.xxh64_intdigest(b"msalt")
    h0 = xxhash.xxh64_intdigest(b"aaaa" + struct.pack("<Q", seed))
    h1 = xxhash.xxh64_intdigest(b"bb" + struct.pack("<Q", h0))
    assert chain_bytes(b"aaaabb", 4, seed) == [h0, h1]
    assert chain_bytes(b"aaaabb", 4, seed, partial=False) == [h0]
    assert chain_bytes(b"aaa", 4, seed) == []
    assert chain_bytes(b"aaaabbbbcccc", 4, seed, max_blocks=2) == chain_bytes(b"aaaabbbb", 4, seed)


def test_token_blocks_are_little_endian_uint32():
    assert token_bytes([1, 258]) == b"\x01\x00\x00\x00\x02\x01\x00\x00"
    seed = chain_seed("m")
    assert chain_tokens([1, 2, 3], 2, seed) == chain_bytes(token_bytes([1, 2]), 8, seed)
    assert len(chain_tokens([1, 2, 3], 2, seed, partial=True)) == 2


# ---- matching -------------------------------------------------------------------------
def test_chains_that_diverge_mid_prompt_score_shared_blocks_over_total():
    prod = producer()
    first = completion("aaaabbbbccccddddeeee")  # 5 blocks
    assert scores(route(prod, first, {"default": [A]})) == [0.0, 0.0, 0.0]
    diverging = completion("aaaabbbbccccXXXXYYYY")  # shares 3 of 5 blocks
    info = match(prod, diverging)
    assert info.total_blocks == 5
    assert scores(info) == [0.6, 0.0, 0.0]
    assert dict(info.cached_blocks) == {"a": 3}
    assert scores(match(prod, first)) == [1.0, 0.0, 0.0]


def test_partial_trailing_block_counts_in_the_total():
    prod = producer()
    route(prod, completion("aaaabbbbccccddddee"), {"default": [B]})  # 4 blocks + 2 chars
    info = match(prod, completion("aaaabbbbccccddddee"))
    assert (info.total_blocks, scores(info)) == (5, [0.0, 1.0, 0.0])
    info = match(prod, completion("aaaabbbbccccddddeX"))
    assert (info.total_blocks, scores(info)) == (5, [0.0, 0.8, 0.0])


def test_prompt_shorter_than_one_block_scores_zero_everywhere():
    prod = producer()
    route(prod, completion("abc"), {"default": [A]})
    info = match(prod, completion("abc"))
    assert info.total_blocks == 0
    assert scores(info) == [0.0, 0.0, 0.0]
    assert prod.index.size == 0


def test_seeded_by_target_model_and_cache_salt():
    prod = producer()
    route(prod, completion("aaaabbbb", model="m1"), {"default": [A]})
    assert scores(match(prod, completion("aaaabbbb", model="m1"))) == [1.0, 0.0, 0.0]
    assert scores(match(prod, completion("aaaabbbb", model="m2"))) == [0.0, 0.0, 0.0]
    salted = completion("aaaabbbb", model="m1", cache_salt="tenant-1")
    assert scores(match(prod, salted)) == [0.0, 0.0, 0.0]
    route(prod, salted, {"default": [C]})
    assert scores(match(prod, salted)) == [0.0, 0.0, 1.0]


def test_max_prefix_blocks_and_tokens_cap_the_match():
    prod = producer({"maxPrefixBlocksToMatch": 2})
    route(prod, completion("aaaabbbbccccdddd"), {"default": [A]})
    info = match(prod, completion("aaaabbbbZZZZZZZZ"))
    assert (info.total_blocks, scores(info)) == (2, [1.0, 0.0, 0.0])
    assert prod.index.size == 2
    prod = producer({"maxPrefixTokensToMatch": 3})  # 3 tokens / 1 per block = 3 blocks
    assert match(prod, completion("aaaabbbbccccdddd")).total_blocks == 3


def test_greedy_walk_counts_leading_blocks_up_to_the_first_globally_unknown_block():
    # Upstream's approximation: +1 for every endpoint in each visited block's set; the
    # walk stops only where NO endpoint has the block. "a" holds blocks 0 and 2, "b"
    # block 1: "a" counts 2 although its own consecutive prefix is 1 block.
    index = ApproxPrefixIndex(10)
    index.add("a", [10, 30])
    index.add("b", [20])
    assert index.match([10, 20, 30]) == {"a": 2, "b": 1}
    assert index.match([10, 99, 30]) == {"a": 1}
    assert index.match([99, 10]) == {}


def test_lru_eviction_drops_the_oldest_and_updates_the_hash_endpoint_set():
    prod = producer({"lruCapacityPerServer": 2})
    reqs = [completion(t) for t in ("aaaa", "bbbb", "cccc")]
    hashes = [prod.hashes(r, 1)[0] for r in reqs]
    route(prod, reqs[0], {"default": [A]})
    route(prod, reqs[0], {"default": [B]})
    assert prod.index.endpoints_of(hashes[0]) == {"a", "b"}
    route(prod, reqs[1], {"default": [A]})
    route(prod, reqs[2], {"default": [A]})  # capacity 2: "aaaa" leaves a's LRU
    assert prod.index.endpoints_of(hashes[0]) == {"b"}
    assert prod.index.endpoints_of(hashes[1]) == {"a"}
    assert prod.index.endpoints_of(hashes[2]) == {"a"}
    assert scores(match(prod, reqs[0])) == [0.0, 1.0, 0.0]
    route(prod, reqs[1], {"default": [B]})
    route(prod, reqs[2], {"default": [B]})
    assert prod.index.endpoints_of(hashes[0]) == set()
    assert prod.index.distinct_hashes == 2  # the empty set was dropped
    assert prod.index.size == 4


def test_a_long_prompt_keeps_its_leading_blocks_when_over_capacity():
    prod = producer({"lruCapacityPerServer": 2})
    route(prod, completion("aaaabbbbcccc"), {"default": [A]})
    assert scores(match(prod, completion("aaaabbbbcccc"))) == [pytest.approx(2 / 3), 0.0, 0.0]


def test_auto_tune_takes_capacity_and_block_size_from_cache_config_info():
    prod = producer({"lruCapacityPerServer": 100})
    a = with_metrics(A, cache_num_blocks=2, cache_block_size=2)  # 8-character blocks
    info = route(prod, completion("aaaaaaaabbbbbbbbcccccccc"), {"default": [a]}, endpoints=[a])
    assert (info.total_blocks, info.block_size_tokens) == (3, 2)
    assert prod.index.capacity("a") == 2
    assert prod.index.endpoint_size("a") == 2
    fixed = producer({"lruCapacityPerServer": 100, "autoTune": False})
    info = route(fixed, completion("aaaaaaaabbbbbbbbcccccccc"), {"default": [a]}, endpoints=[a])
    assert (info.total_blocks, fixed.index.capacity("a")) == (6, 100)


def test_auto_tune_counts_the_cpu_offload_tier_in_the_capacity():
    prod = producer({"lruCapacityPerServer": 100})
    a = with_metrics(A, cache_num_blocks=2, cache_offload_blocks=1, cache_block_size=2)
    route(prod, completion("aaaaaaaabbbbbbbbcccccccc"), {"default": [a]}, endpoints=[a])
    assert (prod.index.capacity("a"), prod.index.endpoint_size("a")) == (3, 3)


def test_token_blocks_with_a_tokenizer():
    prod = producer({"tokenizer": "simple", "blockSizeTokens": 2})
    route(prod, completion("one two three four five"), {"default": [A]})  # 5 tokens, 3 blocks
    info = match(prod, completion("one two three four six"))
    assert (info.total_blocks, scores(info)) == (3, [pytest.approx(2 / 3), 0.0, 0.0])


def test_prompts_of_token_ids_are_hashed_as_ids_not_as_their_placeholder_text():
    prod = producer({"blockSizeTokens": 2})
    route(prod, completion([1, 2, 3, 4, 5]), {"default": [A]})
    info = match(prod, completion([1, 2, 3, 4, 9]))
    assert (info.total_blocks, scores(info)) == (3, [pytest.approx(2 / 3), 0.0, 0.0])
    assert scores(match(prod, completion([7, 8, 9, 10, 11]))) == [0.0, 0.0, 0.0]
    assert scores(match(prod, completion([[1, 2, 3, 4, 5]]))) == [1.0, 0.0, 0.0]
    assert match(prod, completion([[1, 2, 3, 4], [1, 2, 3, 4]])).total_blocks == 0


def test_deprecated_hash_block_size_is_characters_per_block():
    prod = producer({"hashBlockSize": 8, "blockSizeTokens": 16})
    assert match(prod, completion("aaaaaaaabbbbbbbb")).total_blocks == 2
    with pytest.raises(ConfigError, match="not both"):
        load_config_text(
            "plugins:\n- type: approx-prefix-cache-producer\n"
            "  parameters: {hashBlockSize: 8, blockSizeTokens: 4}\n"
        )


def test_missing_tokenizer_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"plugins\[0\]\.parameters: tokenizer"):
        load_config_text(
            "plugins:\n- type: approx-prefix-cache-producer\n"
            f"  parameters: {{tokenizer: {tmp_path / 'none.json'}}}\n"
        )


# ---- learning -------------------------------------------------------------------------
def test_pre_request_learns_primary_and_every_other_profiles_first_target():
    prod = producer()
    req = completion("aaaabbbb")
    route(prod, req, {"decode": [A, C], "prefill": [B], "skipped": None}, primary="decode")
    assert sorted(prod.index.endpoints) == ["a", "b"]  # not the fallback "c"
    assert scores(match(prod, req)) == [1.0, 1.0, 0.0]


def test_pre_request_without_produce_does_nothing():
    prod = producer()
    prod.pre_request(completion("aaaabbbb"), SchedulingResult({"d": ProfileResult([A])}, "d"))
    assert prod.index.size == 0


async def test_endpoints_leaving_the_pool_are_pruned():
    listeners = []
    pool = [Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)]

    def subscribe(fn):
        listeners.append(fn)
        return lambda: listeners.remove(fn)

    handle = Handle(pool=lambda: list(pool), on_pool_change=subscribe)
    prod = producer(handle=handle)
    await prod.start()
    req = completion("aaaabbbb")
    route(prod, req, {"default": [A]})
    route(prod, req, {"default": [B]})
    h0 = prod.hashes(req, 1)[0]
    assert prod.index.endpoints_of(h0) == {"a", "b"}
    pool.pop(0)
    for fn in listeners:
        fn()
    assert prod.index.endpoints == ["b"]
    assert prod.index.endpoints_of(h0) == {"b"}
    assert prod.index.size == 2
    assert scores(match(prod, req)) == [0.0, 1.0, 0.0]
    await prod.stop()
    assert listeners == []


def test_hit_ratio_hit_bytes_and_size_metrics():
    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    prod = producer()
    req = completion("aaaabbbbccccdddd")  # 4 blocks of 4 characters
    before = {
        k: sample(f"inference_extension_prefix_indexer_{k}")
        for k in ("hit_ratio_count", "hit_ratio_sum", "hit_bytes_sum")
    }
    route(prod, req, {"default": [A]})  # cold: ratio 0
    route(prod, completion("aaaabbbbXXXXYYYY"), {"default": [A]})  # 2 of 4: 0.5
    route(prod, req, {"default": [A]})  # all 4: 1.0
    assert sample("inference_extension_prefix_indexer_hit_ratio_count") == (
        before["hit_ratio_count"] + 3
    )
    assert sample("inference_extension_prefix_indexer_hit_ratio_sum") == pytest.approx(
        before["hit_ratio_sum"] + 1.5
    )
    assert sample("inference_extension_prefix_indexer_hit_bytes_sum") == pytest.approx(
        before["hit_bytes_sum"] + 8 + 16
    )
    one = "inference_extension_prefix_indexer_hit_ratio_bucket"
    assert REGISTRY.get_sample_value(one, {"le": "0.0"}) >= 1  # the cold request
    assert sample("inference_extension_prefix_indexer_size") == 6 == prod.index.size


# ---- the scorer and the config wiring -----------------------------------------------
def test_prefix_scorer_reads_the_match_info_and_defaults_to_zero():
    from tests.helpers import plugin

    scorer = plugin("prefix-cache-scorer")
    assert scorer.type_name == "prefix-scorer"
    state = CycleState()
    assert scorer.score(state, completion(), EPS) == [0.0, 0.0, 0.0]
    info = PrefixMatchInfo(total_blocks=4, block_size_tokens=16, matched={"a": 1, "c": 4})
    state.write(PREFIX_MATCH_KEY, info)
    assert scorer.score(state, completion(), EPS) == [0.25, 0.0, 1.0]
    assert scorer.score(state, completion(), []) == []


def test_scorer_parameters_configure_the_auto_created_producer_and_routing_sticks():
    cfg = load_config_text(
        "plugins:\n- type: prefix-cache-scorer\n"
        "  parameters: {blockSizeTokens: 1, lruCapacityPerServer: 7}\n"
    )
    (prod,) = cfg.scheduler.producers
    assert prod.type_name == "approx-prefix-cache-producer"
    assert (prod.params.block_size_tokens, prod.index.default_capacity) == (1, 7)
    req = completion("aaaabbbbccccdddd")
    first = cfg.scheduler.schedule(req, EPS)
    for hook in cfg.pre_request:
        hook.pre_request(req, first)
    for _ in range(5):
        again = cfg.scheduler.schedule(completion("aaaabbbbccccZZZZ"), EPS)
        assert again.targets[0].name == first.targets[0].name


def test_scorer_parameters_beside_an_explicit_producer_fail_loudly():
    for text in (
        "plugins:\n- type: approx-prefix-cache-producer\n"
        "- type: prefix-scorer\n  parameters: {blockSizeTokens: 4}\n",
        "plugins:\n- type: prefix-scorer\n  parameters: {blockSizeTokens: 4}\n"
        "- type: approx-prefix-cache-producer\n  parameters: {blockSizeTokens: 8}\n",
    ):
        with pytest.raises(ConfigError, match="would ignore"):
            load_config_text(text)
    # Equal parameters on both, or none on the scorer, are fine.
    load_config_text(
        "plugins:\n- type: approx-prefix-cache-producer\n  parameters: {blockSizeTokens: 4}\n"
        "- type: prefix-scorer\n  parameters: {blockSizeTokens: 4}\n"
        "- type: prefix-cache-scorer\n  name: second\n"
    )


def test_occupancy_is_the_indexed_blocks_over_each_endpoints_capacity():
    prod = producer({"lruCapacityPerServer": 100})
    a = with_metrics(A, cache_num_blocks=4, cache_block_size=2)  # autoTune: 4 blocks
    b = with_metrics(B, cache_block_size=2)  # num_gpu_blocks unknown: capacity 100
    route(prod, completion("aaaaaaaabbbbbbbbcccccccc"), {"default": [a]}, endpoints=[a, b])
    route(prod, completion("aaaaaaaabbbbbbbbcccccccc"), {"default": [b]}, endpoints=[a, b])
    info = match(prod, completion("zzzzzzzz"), endpoints=[a, b, C])
    assert info.fill("a") == pytest.approx(3 / 4)
    assert info.fill("b") == pytest.approx(3 / 100)
    assert info.fill("c") == 0.0  # never routed to: room to spare
    # A fourth and fifth block fill a; the LRU keeps it at its 4 blocks: full, not over.
    route(prod, completion("ddddddddeeeeeeee"), {"default": [a]}, endpoints=[a, b])
    assert match(prod, completion("zzzzzzzz"), endpoints=[a]).fill("a") == 1.0
