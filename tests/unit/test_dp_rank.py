"""Data-parallel ranks: per-rank metrics from the `engine` label, the precise index's
per-rank view from KV events' `data_parallel_rank`, and the rank picker's choice."""

from __future__ import annotations

import random

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config_text
from epp.config.params import parse_params
from epp.datalayer.kvevents import KVEventSubscriber
from epp.datalayer.metric_maps import extract, get_engine
from epp.datalayer.promtext import parse
from epp.datastore import RankLoad
from epp.extproc.messages import CLIENT_FORBIDDEN_HEADERS
from epp.headers import DATA_PARALLEL_RANK
from epp.scheduling.registry import PLUGIN_TYPES, Handle
from epp.scheduling.types import CycleState, ProfileResult, SchedulingResult
from plugins.prefix.match_info import PREFIX_MATCH_KEY
from plugins.prefix.precise_index import rank_key
from tests.helpers import completion, snap, with_metrics
from tests.unit.test_kvevents import message, stored_map
from tests.unit.test_prefix_precise import IDS, PROMPT, Clock

DP_PAGE = """\
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
"""


def _extract(text: str):
    emap = get_engine("vllm")
    return extract("vllm", parse(text, emap.families), 1.0)


def test_a_page_with_two_engine_labels_keeps_per_rank_load_and_endpoint_totals():
    m = _extract(DP_PAGE)
    assert (m.waiting_queue_size, m.running_requests) == (4, 6)
    assert abs(m.kv_cache_usage - 0.4) < 1e-9
    assert m.ranks == (RankLoad(0, 1, 4, 0.2), RankLoad(1, 3, 2, 0.6))


def test_a_single_rank_page_has_no_ranks():
    one = "\n".join(line for line in DP_PAGE.splitlines() if 'engine="0"' in line) + "\n"
    assert _extract(one).ranks == ()
    no_label = 'vllm:num_requests_waiting{model_name="m"} 2\n'
    assert _extract(no_label).ranks == ()


def test_the_client_cannot_choose_the_rank():
    assert DATA_PARALLEL_RANK in CLIENT_FORBIDDEN_HEADERS


# ---- picker ---------------------------------------------------------------------------
def _dp_snap(loads: list[tuple[int, int]], stamp: float = 1.0):
    ranks = tuple(RankLoad(i, w, r, 0.0) for i, (w, r) in enumerate(loads))
    return with_metrics(snap("dp", port=8001), ranks=ranks, update_time=stamp)


def _picker(params: dict | None = None, plugins: dict | None = None, clock=None):
    spec = PLUGIN_TYPES.lookup("data-parallel-rank-picker")
    assert spec is not None
    handle = Handle(rng=random.Random(0), clock=clock or Clock(), plugins=plugins or {})
    return spec.build("dp", parse_params(spec.params, params), handle)


def _result(target, state: CycleState | None = None) -> SchedulingResult:
    return SchedulingResult(
        {"default": ProfileResult([target])}, "default", cycle_state=state or CycleState()
    )


def test_a_single_rank_endpoint_gets_no_header():
    picker = _picker()
    result = _result(snap("one"))
    picker.pre_request(completion(), result)
    assert result.headers == {}


def test_without_a_prefix_index_ranks_are_picked_least_loaded_and_bursts_spread():
    picker = _picker()
    target = _dp_snap([(2, 2), (0, 1), (1, 1)])
    picks = []
    for _ in range(6):
        result = _result(target)
        picker.pre_request(completion(), result)
        picks.append(int(result.headers[DATA_PARALLEL_RANK]))
    # loads 4,1,2: rank 1, then 1 and 2 alternate up to rank 0's 4, then all three share
    assert picks[:3] == [1, 1, 2]
    assert sorted(picks).count(0) >= 1
    # a new scrape resets what this EPP counted since the last one
    result = _result(_dp_snap([(2, 2), (0, 1), (1, 1)], stamp=2.0))
    picker.pre_request(completion(), result)
    assert result.headers[DATA_PARALLEL_RANK] == "1"


def _precise(clock):
    spec = PLUGIN_TYPES.lookup("precise-prefix-cache-producer")
    assert spec is not None
    target = snap("dp", port=8001)
    handle = Handle(rng=random.Random(0), clock=clock, pool=lambda: [target.endpoint])
    prod = spec.build("precise", parse_params(spec.params, {"blockSizeTokens": 4}), handle)
    prod.receiver = KVEventSubscriber(prod.index.on_batch, pool=handle.pool)
    prod.receiver._refresh_pods()
    return prod


def test_the_rank_holding_the_prefix_wins_unless_it_is_far_busier():
    clock = Clock()
    prod = _precise(clock)
    # rank 1 stores the prompt's blocks (its KV events carry data_parallel_rank=1)
    frames = message("kv@dp@m", 0, [stored_map([11, 12, 13], None, IDS, 4)], rank=1)
    assert prod.receiver.handle_frames(frames)
    assert prod.index.ranked is not None
    assert prod.index.ranked.size(rank_key("dp", 1)) == 3
    assert prod.index.ranked.size(rank_key("dp", 0)) == 0
    picker = _picker(plugins={"precise": prod}, clock=clock)
    request = completion(PROMPT, model="m")

    def pick(loads):
        state = CycleState()
        target = _dp_snap(loads, stamp=clock.now)
        state.write(PREFIX_MATCH_KEY, prod.produce(state, request, [target]))
        result = _result(target, state)
        picker.pre_request(request, result)
        return result.headers[DATA_PARALLEL_RANK]

    assert pick([(0, 0), (2, 3)]) == "1"  # affinity beats a small load gap
    clock.now += 1
    assert pick([(0, 0), (9, 9)]) == "0"  # but not a gap above maxLoadImbalance (8)


def test_a_pick_is_remembered_for_the_next_request_before_any_event():
    clock = Clock()
    prod = _precise(clock)
    # a rank above 0 was seen once, so the endpoint is known to be data-parallel
    picker = _picker(plugins={"precise": prod}, clock=clock)
    request = completion(PROMPT, model="m")
    got = []
    for _ in range(3):
        state = CycleState()
        target = _dp_snap([(0, 0), (0, 0), (0, 0), (0, 0)], stamp=clock.now)
        state.write(PREFIX_MATCH_KEY, prod.produce(state, request, [target]))
        result = _result(target, state)
        picker.pre_request(request, result)
        got.append(result.headers[DATA_PARALLEL_RANK])
    assert got == ["0", "0", "0"]  # the speculative entry keeps the repeat on its rank
    other = completion("x0 x1 x2 x3 x4 x5 x6 x7", model="m")
    state = CycleState()
    target = _dp_snap([(0, 0), (0, 0), (0, 0), (0, 0)], stamp=clock.now)
    state.write(PREFIX_MATCH_KEY, prod.produce(state, other, [target]))
    result = _result(target, state)
    picker.pre_request(other, result)
    assert result.headers[DATA_PARALLEL_RANK] != "0"  # another prompt goes elsewhere


def test_a_dropped_endpoint_forgets_its_ranks():
    clock = Clock()
    prod = _precise(clock)
    prod.receiver.handle_frames(message("kv@dp@m", 0, [stored_map([11], None, IDS[:4], 4)], rank=2))
    prod.index.retain(["other"])
    assert prod.index.ranked.size(rank_key("dp", 2)) == 0


def test_a_wrong_prefix_producer_name_fails_at_config_load_naming_the_field():
    text = """
plugins:
- type: precise-prefix-cache-producer
  name: kv
- type: data-parallel-rank-picker
  parameters: {prefixProducer: kv-typo}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: max-score-picker}]
"""
    with pytest.raises(ConfigError) as e:
        load_config_text(text)
    assert "plugins[1].parameters" in str(e.value)
    assert "'kv-typo' is not a configured precise-prefix-cache-producer" in str(e.value)
    # the right name loads
    load_config_text(text.replace("kv-typo", "kv"))
