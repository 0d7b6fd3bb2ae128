"""Engine metric maps: vLLM and SGLang names, fallbacks, LoRA, aggregation, errors."""

from __future__ import annotations

import pytest

from epp.datalayer.metric_maps import (
    ENGINES,
    SGLANG,
    VLLM,
    MetricsExtractError,
    MetricSpec,
    engine_for,
    extract,
    get_engine,
)
from epp.datalayer.promtext import parse
from epp.datastore import Endpoint, EndpointMetrics, RankLoad


def _extract(engine: str, text: str, now: float = 1.0, previous: EndpointMetrics | None = None):
    emap = get_engine(engine)
    return extract(engine, parse(text, emap.families), now, previous)


VLLM_OLD = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:num_requests_running{model_name="m"} 7.0
vllm:gpu_cache_usage_perc{model_name="m"} 0.61
vllm:cache_config_info{block_size="32",num_gpu_blocks="1000"} 1.0
"""


def test_vllm_older_gpu_cache_name_is_the_fallback() -> None:
    m = _extract("vllm", VLLM_OLD, now=3.5)
    assert m == EndpointMetrics(
        waiting_queue_size=2,
        running_requests=7,
        kv_cache_usage=0.61,
        cache_block_size=32,
        cache_num_blocks=1000,
        update_time=3.5,
    )


def test_vllm_cpu_offload_blocks_are_read_when_numeric() -> None:
    text = VLLM_OLD.replace('num_gpu_blocks="1000"', 'num_gpu_blocks="1000",num_cpu_blocks="4000"')
    assert _extract("vllm", text).cache_offload_blocks == 4000
    none = VLLM_OLD.replace('num_gpu_blocks="1000"', 'num_gpu_blocks="1000",num_cpu_blocks="None"')
    assert _extract("vllm", none).cache_offload_blocks == 0  # vLLM's "None": no offload tier


def test_vllm_new_kv_name_wins_over_the_old_one() -> None:
    text = VLLM_OLD + 'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
    assert _extract("vllm", text).kv_cache_usage == 0.25


def test_lora_latest_series_wins_and_lists_are_trimmed() -> None:
    text = (
        "vllm:num_requests_waiting 0\n"
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",'
        'waiting_lora_adapters=""} 100\n'
        'vllm:lora_requests_info{max_lora="3",running_lora_adapters=" a , b,, ",'
        'waiting_lora_adapters="c,"} 300\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="mid",'
        'waiting_lora_adapters="x"} 200\n'
    )
    m = _extract("vllm", text)
    assert m.active_models == frozenset({"a", "b"})
    assert m.waiting_models == frozenset({"c"})
    assert m.max_active_models == 3


def test_lora_empty_lists_and_bad_max() -> None:
    text = (
        "vllm:num_requests_waiting 0\n"
        'vllm:lora_requests_info{max_lora="x",running_lora_adapters="",'
        'waiting_lora_adapters=""} 5\n'
    )
    prev = EndpointMetrics(max_active_models=4, active_models=frozenset({"gone"}))
    m = _extract("vllm", text, previous=prev)
    assert m.active_models == frozenset()
    assert m.waiting_models == frozenset()
    assert m.max_active_models == 4  # unreadable: the previous value stays


def test_data_parallel_series_are_summed_and_kv_averaged() -> None:
    text = "".join(
        f'vllm:num_requests_waiting{{engine="{e}"}} {w}\n'
        f'vllm:num_requests_running{{engine="{e}"}} {r}\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}"}} {kv}\n'
        for e, w, r, kv in [(0, 1, 2, 0.1), (1, 3, 4, 0.5), (2, 0, 0, 0.9)]
    )
    m = _extract("vllm", text)
    assert (m.waiting_queue_size, m.running_requests) == (4, 6)
    assert m.kv_cache_usage == pytest.approx(0.5)


def test_nan_samples_are_ignored_and_kv_is_clamped() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0"} NaN\n'
        'vllm:num_requests_waiting{engine="1"} 2\n'
        "vllm:kv_cache_usage_perc 1.7\n"
    )
    m = _extract("vllm", text)
    assert m.waiting_queue_size == 2
    assert m.kv_cache_usage == 1.0


def test_partial_page_keeps_previous_values() -> None:
    prev = EndpointMetrics(
        waiting_queue_size=9,
        running_requests=8,
        kv_cache_usage=0.7,
        cache_block_size=16,
        cache_num_blocks=5,
        update_time=1.0,
    )
    m = _extract("vllm", "vllm:num_requests_waiting 3\n", now=2.0, previous=prev)
    assert m == EndpointMetrics(
        waiting_queue_size=3,
        running_requests=8,
        kv_cache_usage=0.7,
        cache_block_size=16,
        cache_num_blocks=5,
        update_time=2.0,
    )


def test_no_core_family_raises_listing_the_missing_ones() -> None:
    with pytest.raises(MetricsExtractError) as info:
        _extract("vllm", 'sglang:num_queue_reqs 1\nvllm:cache_config_info{block_size="16"} 1\n')
    text = str(info.value)
    for fam in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    ):
        assert fam in text
    assert isinstance(info.value, ValueError)


_R = 'engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"'
SGLANG_PAGE = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{dp_rank="0",{_R}}} 5.0
sglang:num_running_reqs{{dp_rank="1",{_R}}} 6.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{dp_rank="0",{_R}}} 2.0
sglang:num_queue_reqs{{dp_rank="1",{_R}}} 0.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{dp_rank="0",{_R}}} 0.2
sglang:token_usage{{dp_rank="1",{_R}}} 0.3
# HELP sglang:cache_config_info Information of the cache config.
# TYPE sglang:cache_config_info gauge
sglang:cache_config_info{{model_name="qwen",num_pages="180000",page_size="1"}} 1.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="qwen"}} 8.128902e+06
"""


def test_sglang() -> None:
    m = _extract("sglang", SGLANG_PAGE, now=4.0)
    assert m == EndpointMetrics(
        waiting_queue_size=2,
        running_requests=11,
        kv_cache_usage=pytest.approx(0.25),  # type: ignore[arg-type]
        cache_block_size=1,
        cache_num_blocks=180000,
        update_time=4.0,
        # two `dp_rank` series: per-rank load kept for the data-parallel rank picker
        ranks=(RankLoad(0, 2, 5, 0.2), RankLoad(1, 0, 6, 0.3)),
    )
    assert "sglang:lora_requests_info" not in SGLANG.families


def test_sglang_page_read_as_vllm_fails_clearly() -> None:
    with pytest.raises(MetricsExtractError, match="no vllm metrics"):
        _extract("vllm", SGLANG_PAGE)


def test_triton_matchers_select_series() -> None:
    text = (
        'nv_trt_llm_request_metrics{model="e",request_type="waiting",version="1"} 4\n'
        'nv_trt_llm_request_metrics{model="e",request_type="scheduled",version="1"} 6\n'
        'nv_trt_llm_request_metrics{model="e",request_type="active",version="1"} 60\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"} 0.4\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"} 64\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"} 900\n'
    )
    m = _extract("triton-tensorrt-llm", text)
    assert (m.waiting_queue_size, m.running_requests, m.kv_cache_usage) == (4, 6, 0.4)
    assert (m.cache_block_size, m.cache_num_blocks) == (64, 900)


def test_metric_spec_parse() -> None:
    assert MetricSpec.parse("") is None
    assert MetricSpec.parse("a") == MetricSpec("a")
    spec = MetricSpec.parse('fam{request_type="waiting", b=x}')
    assert spec == MetricSpec("fam", (("request_type", "waiting"), ("b", "x")))
    assert str(spec) == 'fam{request_type="waiting",b="x"}'
    with pytest.raises(ValueError, match="closing"):
        MetricSpec.parse("fam{a=b")
    with pytest.raises(ValueError, match="label=value"):
        MetricSpec.parse("fam{ab}")


def test_engine_for_labels_and_default() -> None:
    def ep(**labels: str) -> Endpoint:
        return Endpoint("e", "10.0.0.1", 8000, labels)

    assert engine_for(ep()) == "vllm"
    assert engine_for(ep(**{"llm-d.ai/engine-type": "sglang"})) == "sglang"
    both = {"inference.networking.k8s.io/engine-type": "SGLang", "llm-d.ai/engine-type": "vllm"}
    assert engine_for(ep(**both)) == "sglang"  # upstream's label first; case-insensitive
    assert engine_for(ep(), default="sglang") == "sglang"
    assert engine_for(ep(x="y"), label_keys=("x",)) == "y"


def test_unknown_engine_lists_known_ones() -> None:
    with pytest.raises(MetricsExtractError, match=r"known engines: .*sglang.*vllm"):
        get_engine("tgi")
    assert get_engine("VLLM") is VLLM
    assert set(ENGINES) >= {"vllm", "sglang"}
