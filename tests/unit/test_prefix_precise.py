"""The precise prefix index and its producer/scorer: exact scores from hand-made KV events.

Prompts are words, so with the simple tokenizer every word is one token: with
`blockSize` 4 in the events, the 12-word PROMPT is exactly three blocks.
"""

from __future__ import annotations

import random

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config_text
from epp.config.params import parse_params
from epp.datalayer.kvevents import KVEventSubscriber
from epp.datastore import Endpoint
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from epp.tokenizer import SimpleTokenizer
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from tests.helpers import completion, snap, with_metrics
from tests.unit.test_kvevents import (
    message,
    removed_array,
    removed_map,
    stored_array,
    stored_map,
)

A, B, C = snap("a", port=8001), snap("b", port=8002), snap("c", port=8003)
EPS = [A, B, C]
POOL = [e.endpoint for e in EPS]
PROMPT = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11"
IDS = SimpleTokenizer().encode(PROMPT)
assert len(IDS) == 12


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def producer(params: dict | None = None, clock: Clock | None = None, pool=POOL):
    spec = PLUGIN_TYPES.lookup("precise-prefix-cache-producer")
    assert spec is not None
    handle = Handle(rng=random.Random(0), clock=clock or Clock(), pool=lambda: list(pool))
    prod = spec.build("precise", parse_params(spec.params, params), handle)
    # The subscriber's receive path, without sockets: messages go straight to the index.
    prod.receiver = KVEventSubscriber(prod.index.on_batch, pool=handle.pool)
    prod.receiver._refresh_pods()
    return prod


def send(prod, endpoint: str, events: list, seq: int = 0, model: str = "m") -> None:
    assert prod.receiver.handle_frames(message(f"kv@{endpoint}@{model}", seq, events))


def match(prod, request=None, endpoints=EPS) -> PrefixMatchInfo:
    assert prod.produces == PREFIX_MATCH_KEY
    return prod.produce(CycleState(), request or completion(PROMPT, model="m"), endpoints)


def scores(info: PrefixMatchInfo, endpoints=EPS) -> list[float]:
    return [pytest.approx(info.score(e.name)) for e in endpoints]


# ---- events → scores ------------------------------------------------------------------
def test_both_wire_formats_index_the_same_blocks():
    prod = producer()
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    send(prod, "b", [stored_map([21, 22], None, IDS[:8], 4)])
    info = match(prod)
    assert (info.total_blocks, info.block_size_tokens) == (3, 4)
    assert scores(info) == [1.0, 2 / 3, 0.0]
    assert dict(info.cached_blocks) == {"a": 3, "b": 2}


def test_a_chain_continues_from_its_parent_engine_hash_in_order_only():
    prod = producer()
    send(prod, "a", [stored_array([11, 12], None, IDS[:8], 4)], seq=0)
    send(prod, "a", [stored_map([13], 12, IDS[8:], 4)], seq=1)
    assert scores(match(prod)) == [1.0, 0.0, 0.0]
    # Out of order for "b": the child arrives before its parent and cannot be placed.
    send(prod, "b", [stored_map([23], 22, IDS[8:], 4)], seq=0)
    send(prod, "b", [stored_array([21, 22], None, IDS[:8], 4)], seq=1)
    assert scores(match(prod)) == [1.0, 2 / 3, 0.0]
    assert prod.index.stats["orphan_block"] == 1


def test_events_of_one_message_apply_in_order():
    prod = producer()
    send(
        prod,
        "a",
        [
            stored_array([11, 12, 13], None, IDS, 4),
            removed_array([11]),
            stored_array([11], None, IDS[:4], 4),
        ],
    )
    assert scores(match(prod)) == [1.0, 0.0, 0.0]


def test_removal_by_engine_hash_cuts_the_prefix_there():
    prod = producer()
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    send(prod, "a", [removed_map([12])], seq=1)
    info = match(prod)
    assert scores(info) == [1 / 3, 0.0, 0.0]
    assert prod.index.size("a") == 2 and prod.index.engine_map_size("a") == 2
    send(prod, "a", [removed_array([999])], seq=2)  # unknown hashes are ignored
    assert prod.index.size("a") == 2


def test_all_blocks_cleared_resets_only_that_endpoint():
    prod = producer()
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    send(prod, "b", [stored_array([21, 22, 23], None, IDS, 4)])
    send(prod, "a", [["AllBlocksCleared"]], seq=1)
    assert scores(match(prod)) == [0.0, 1.0, 0.0]
    assert prod.index.engine_map_size("a") == 0
    # The endpoint keeps its block size and learns again from scratch.
    send(prod, "a", [stored_array([11], None, IDS[:4], 4)], seq=2)
    assert scores(match(prod)) == [1 / 3, 1.0, 0.0]


def test_cpu_tier_weighs_0_8_and_the_best_tier_wins():
    prod = producer()
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4, "CPU")])
    info = match(prod)
    assert scores(info) == [0.8, 0.0, 0.0]
    assert dict(info.matched) == {"a": pytest.approx(2.4)}
    assert dict(info.cached_blocks) == {"a": 3}  # unweighted
    send(prod, "a", [stored_array([11], None, IDS[:4], 4, "GPU")], seq=1)
    assert scores(match(prod)) == [(1.0 + 0.8 + 0.8) / 3, 0.0, 0.0]
    send(prod, "a", [removed_array([11], "GPU")], seq=2)  # still offloaded on CPU
    assert scores(match(prod)) == [0.8, 0.0, 0.0]
    send(prod, "a", [removed_array([11], "CPU")], seq=3)
    assert scores(match(prod)) == [0.0, 0.0, 0.0]


def test_offload_store_without_tokens_adds_a_tier_to_known_blocks():
    prod = producer()
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    send(prod, "a", [["BlockStored", [11, 12, 77], None, [], 4, None, "CPU"]], seq=1)
    assert prod.index.stats["unknown_block"] == 1
    send(prod, "a", [removed_array([11, 12, 13], "GPU")], seq=2)
    assert scores(match(prod)) == [2 * 0.8 / 3, 0.0, 0.0]


def test_partial_trailing_block_is_not_counted_and_short_prompts_score_zero():
    prod = producer()
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    info = match(prod, completion(PROMPT + " w12 w13", model="m"))
    assert (info.total_blocks, scores(info)) == (3, [1.0, 0.0, 0.0])
    info = match(prod, completion("w0 w1 w2", model="m"))
    assert (info.total_blocks, scores(info)) == (0, [0.0, 0.0, 0.0])


def test_seed_is_the_model_then_lora_name_and_cache_salt():
    prod = producer()
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)], model="other")
    assert scores(match(prod)) == [0.0, 0.0, 0.0]  # same tokens, another model
    assert scores(match(prod, completion(PROMPT, model="other"))) == [1.0, 0.0, 0.0]
    lora = ["BlockStored", [21, 22, 23], None, IDS, 4, 1, "GPU", "adapter-1"]
    send(prod, "b", [lora], model="base")
    assert scores(match(prod, completion(PROMPT, model="adapter-1"))) == [0.0, 1.0, 0.0]
    salted = stored_map([31, 32, 33], None, IDS, 4, extra_keys=[["tenant"], None, None])
    send(prod, "c", [salted])
    assert scores(match(prod, completion(PROMPT, model="m", cache_salt="tenant"))) == [
        0.0,
        0.0,
        1.0,
    ]
    assert scores(match(prod)) == [0.0, 0.0, 0.0]  # unsalted request: no match


def test_multimodal_keys_in_the_first_block_never_match_a_text_request():
    prod = producer()
    mm = stored_map([11, 12, 13], None, IDS, 4, extra_keys=[["img-hash", "tenant"], None, None])
    send(prod, "a", [mm])
    assert scores(match(prod)) == [0.0, 0.0, 0.0]
    assert scores(match(prod, completion(PROMPT, model="m", cache_salt="tenant"))) == [
        0.0,
        0.0,
        0.0,
    ]


def test_a_prompt_of_token_ids_needs_no_tokenizer():
    prod = producer()
    send(prod, "b", [stored_array([21, 22, 23], None, IDS, 4)])
    assert scores(match(prod, completion(IDS, model="m"))) == [0.0, 1.0, 0.0]
    assert scores(match(prod, completion([*IDS[:8], 1, 2, 3, 4], model="m"))) == [
        0.0,
        2 / 3,
        0.0,
    ]


def test_unusable_stores_are_dropped_and_counted():
    prod = producer()
    send(prod, "a", [stored_array([11, 12], None, IDS, 4)])  # 12 tokens ≠ 2 × 4
    send(prod, "a", [stored_array([11], None, IDS[:4], 0)], seq=1)
    window = stored_map([11], None, IDS[:4], 4, kv_cache_spec_kind="sliding_window")
    send(prod, "a", [window], seq=2)
    assert prod.index.size("a") == 0
    assert prod.index.stats["unsupported_block"] == 2
    assert prod.index.stats["not_full_attention"] == 1


def test_cap_per_endpoint_keeps_the_leading_blocks_and_the_engine_map_bounded():
    prod = producer({"maxBlocksPerEndpoint": 2})
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    assert (prod.index.size("a"), prod.index.engine_map_size("a")) == (2, 2)
    assert scores(match(prod)) == [2 / 3, 0.0, 0.0]
    for i in range(50):  # many distinct prompts: memory stays at the cap
        send(prod, "a", [stored_array([1000 + i], None, [i, i, i, i], 4)], seq=1 + i)
    assert (prod.index.size("a"), prod.index.engine_map_size("a")) == (2, 2)


def test_block_size_comes_from_events_then_metrics_then_the_parameter():
    prod = producer({"blockSizeTokens": 6})
    assert match(prod).block_size_tokens == 6
    b = with_metrics(B, cache_block_size=3)
    assert match(prod, endpoints=[b]).block_size_tokens == 3
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    info = match(prod, endpoints=[A, b, with_metrics(C, cache_block_size=3)])
    # Two candidates use 3-token blocks, so the info is in those: 12 tokens = 4 blocks,
    # and a's 3 blocks of 4 tokens are the same share of the prompt.
    assert (info.total_blocks, info.block_size_tokens) == (4, 3)
    assert info.score("a") == pytest.approx(1.0)
    assert dict(info.cached_blocks) == {"a": 4}


# ---- speculative entries --------------------------------------------------------------
def pick(prod, request, targets: dict[str, list]) -> None:
    state = CycleState()
    state.write(prod.produces, prod.produce(state, request, EPS))
    first = next(iter(targets))
    result = SchedulingResult({k: ProfileResult(v) for k, v in targets.items()}, first)
    result.cycle_state = state
    prod.pre_request(request, result)


def test_speculative_entries_cover_the_gap_then_expire():
    clock = Clock()
    prod = producer({"blockSizeTokens": 4}, clock)
    req = completion(PROMPT, model="m")
    pick(prod, req, {"decode": [B, C], "prefill": [A]})
    assert scores(match(prod)) == [1.0, 1.0, 0.0]  # primary and prefill, not fallback
    clock.now += 1.9
    assert scores(match(prod)) == [1.0, 1.0, 0.0]
    clock.now += 0.2  # past the 2 s TTL
    assert scores(match(prod)) == [0.0, 0.0, 0.0]
    assert prod.index.size("a") == prod.index.size("b") == 0  # expired entries are gone


def test_a_confirming_event_outlives_the_ttl():
    clock = Clock()
    prod = producer({"blockSizeTokens": 4, "speculativeTTL": "500ms"}, clock)
    pick(prod, completion(PROMPT, model="m"), {"default": [A]})
    send(prod, "a", [stored_array([11, 12], None, IDS[:8], 4)])
    clock.now += 1.0
    assert scores(match(prod)) == [2 / 3, 0.0, 0.0]


def test_speculative_indexing_can_be_turned_off():
    prod = producer({"blockSizeTokens": 4, "speculativeIndexing": False})
    pick(prod, completion(PROMPT, model="m"), {"default": [A]})
    assert scores(match(prod)) == [0.0, 0.0, 0.0]


# ---- pool, scorer and config ------------------------------------------------------------
async def test_endpoints_leaving_the_pool_are_forgotten():
    pool = list(POOL)
    listeners: list = []
    spec = PLUGIN_TYPES.lookup("precise-prefix-cache-producer")
    assert spec is not None

    def subscribe(fn):
        listeners.append(fn)
        return lambda: listeners.remove(fn)

    handle = Handle(pool=lambda: list(pool), on_pool_change=subscribe)
    params = parse_params(spec.params, {"endpoint": "tcp://127.0.0.1:*"})
    prod = spec.build("precise", params, handle)
    await prod.start()
    try:
        prod.index.apply("a", "m", [])
        prod.index.add_speculative("a", [1, 2], 2.0)
        prod.index.add_speculative("b", [1, 2], 2.0)
        pool.pop(0)
        for fn in list(listeners):
            fn()
        assert prod.index.endpoints == ["b"]
    finally:
        await prod.stop()
    assert listeners == []


def test_precise_scorer_reads_its_producer():
    from tests.helpers import plugin

    scorer = plugin("precise-prefix-cache-scorer")
    state = CycleState()
    assert scorer.score(state, completion(), EPS) == [0.0, 0.0, 0.0]
    state.write(
        PREFIX_MATCH_KEY,
        PrefixMatchInfo(total_blocks=5, block_size_tokens=16, matched={"b": 4.0}),
    )
    assert scorer.score(state, completion(), EPS) == [0.0, 0.8, 0.0]  # 4 / 5 blocks


def test_two_producers_of_the_prefix_match_key_are_refused():
    both = (
        "plugins:\n- type: approx-prefix-cache-producer\n"
        "- type: precise-prefix-cache-producer\n  parameters: {mode: connect}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config_text(both)
    assert e.value.path == "plugins[1]"
    assert "precise-prefix-cache-producer" in str(e.value)
    assert "approx-prefix-cache-producer" in str(e.value) and "'prefix-match'" in str(e.value)
    # The same clash when the loader creates the approximate producer for prefix-scorer.
    with pytest.raises(ConfigError, match=r"\(created for prefix-scorer/prefix-scorer\)"):
        load_config_text(
            "plugins:\n- type: precise-prefix-cache-producer\n  parameters: {mode: connect}\n"
            "- type: prefix-scorer\n"
        )


def test_precise_scorer_parameters_configure_its_producer_or_fail_loudly():
    cfg = load_config_text(
        "plugins:\n- type: precise-prefix-cache-scorer\n"
        "  parameters: {mode: connect, publisherPort: 6000, speculativeTTL: 1.5}\n"
    )
    (prod,) = cfg.scheduler.producers
    assert prod.type_name == "precise-prefix-cache-producer"
    assert (prod.params.mode, prod.params.publisher_port, prod.ttl) == ("connect", 6000, 1.5)
    with pytest.raises(ConfigError, match="would ignore"):
        load_config_text(
            "plugins:\n- type: precise-prefix-cache-producer\n"
            "- type: precise-prefix-cache-scorer\n  parameters: {mode: connect}\n"
        )
    with pytest.raises(ConfigError, match="speculativeTTL must be"):
        load_config_text(
            "plugins:\n- type: precise-prefix-cache-producer\n"
            "  parameters: {speculativeTTL: soon}\n"
        )
    with pytest.raises(ConfigError, match="must be one of bind, connect"):
        load_config_text(
            "plugins:\n- type: precise-prefix-cache-producer\n  parameters: {mode: both}\n"
        )


def test_endpoint_objects_in_pool_are_resolved_by_host_port():
    assert POOL[0] == Endpoint("a", A.endpoint.address, 8001)
    prod = producer()
    assert prod.receiver.handle_frames(message(f"kv@{A.hostport}@m", 0, []))


def test_occupancy_is_the_blocks_events_report_over_the_servers_kv_blocks():
    prod = producer({"maxBlocksPerEndpoint": 100})
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4)])
    a = with_metrics(A, cache_num_blocks=6)  # vllm:cache_config_info num_gpu_blocks
    info = match(prod, endpoints=[a, B, C])
    assert info.fill("a") == pytest.approx(3 / 6)
    assert info.fill("b") == 0.0  # no events yet: nothing to evict
    # Without num_gpu_blocks the cap bounds it: 3 of maxBlocksPerEndpoint 100.
    assert match(prod).fill("a") == pytest.approx(3 / 100)


def test_tier_weights_are_configurable_per_medium_and_an_unnamed_medium_weighs_the_lowest():
    tiers = [
        {"name": "gpu", "weight": 1.0},
        {"name": "cpu", "weight": 0.5},
        {"name": "disk", "weight": 0.2},
    ]
    prod = producer({"kvCacheBackendConfigs": tiers})
    send(prod, "a", [stored_array([11, 12, 13], None, IDS, 4, "CPU")])
    send(prod, "b", [stored_array([21, 22, 23], None, IDS, 4, "DISK")])
    send(prod, "c", [stored_array([31, 32, 33], None, IDS, 4, "nvme-pool")])  # not named
    assert scores(match(prod)) == [0.5, 0.2, 0.2]
    # a block on disk and on CPU weighs its best tier; a GPU copy wins over both
    send(prod, "b", [["BlockStored", [21], None, [], 4, None, "cpu"]], seq=1)
    assert scores(match(prod))[1] == pytest.approx((0.5 + 0.2 + 0.2) / 3)
    send(prod, "b", [["BlockStored", [22], None, [], 4, None, "GPU"]], seq=2)
    assert scores(match(prod))[1] == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    # removing the disk copy leaves the others; removing the last tier forgets the block
    send(prod, "b", [removed_array([23], "disk")], seq=3)
    assert scores(match(prod))[1] == pytest.approx((0.5 + 1.0) / 3)


def test_the_default_tier_weights_are_upstreams_and_bad_entries_name_themselves():
    assert producer().params.tier_weights == {"gpu": 1.0, "cpu": 0.8}
    for bad, text in (
        ([{"weight": 1.0}], "needs a name"),
        ([{"name": "gpu", "weight": -1}], "weight must be a number"),
        ([{"name": "gpu", "weight": "high"}], "weight must be a number"),
    ):
        with pytest.raises((ValueError, ConfigError), match=text):
            producer({"kvCacheBackendConfigs": bad})
