"""The Prometheus text reader: edge cases with exact samples, and a real-size vLLM page."""

from __future__ import annotations

import math

import pytest

from epp.datalayer.metric_maps import VLLM, extract
from epp.datalayer.promtext import Sample, parse, parse_line

# ---------------------------------------------------------------------------
# A vLLM /metrics page, shaped like vLLM 0.9/0.10 (V1 engine, data-parallel size 2)
# as served by prometheus_client: HELP/TYPE lines, `engine`/`model_name` labels,
# counters with `_total` + `_created`, info gauges, LoRA info with an old series left
# behind, and the histograms that make up most of the page.
# ---------------------------------------------------------------------------
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

VLLM_HEAD = f"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 21871.0
python_gc_objects_collected_total{{generation="1"}} 4415.0
python_gc_objects_collected_total{{generation="2"}} 1311.0
# HELP python_info Python platform information
# TYPE python_info gauge
python_info{{implementation="CPython",major="3",minor="12",patchlevel="9",version="3.12.9"}} 1.0
# HELP process_virtual_memory_bytes Virtual memory size in bytes.
# TYPE process_virtual_memory_bytes gauge
process_virtual_memory_bytes 6.2331232256e+010
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.74123412309e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 3.0
vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 1.0
vllm:num_requests_waiting{{engine="1",model_name="{MODEL}"}} 4.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.5
vllm:gpu_cache_usage_perc{{engine="1",model_name="{MODEL}"}} 0.5
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.2
vllm:kv_cache_usage_perc{{engine="1",model_name="{MODEL}"}} 0.4
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="{MODEL}"}} 183472.0
vllm:prefix_cache_queries_total{{engine="1",model_name="{MODEL}"}} 179112.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{{engine="0",model_name="{MODEL}"}} 1.7412341312e+09
vllm:prefix_cache_queries_created{{engine="1",model_name="{MODEL}"}} 1.7412341312e+09
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} 0.0
vllm:num_preemptions_total{{engine="1",model_name="{MODEL}"}} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{MODEL}"}} 911.0
vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} 42.0
vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}} 3.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{{max_lora="4",running_lora_adapters="sql-lora",\
waiting_lora_adapters=""}} 1.741234100e+09
vllm:lora_requests_info{{max_lora="4",running_lora_adapters="sql-lora, tweet-lora",\
waiting_lora_adapters="chat-lora,"}} 1.741234190e+09
vllm:lora_requests_info{{max_lora="4",running_lora_adapters="",\
waiting_lora_adapters=""}} 1.741234000e+09
# HELP vllm:cache_config_info Information of the LLMEngine's CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",calculate_kv_scales="False",\
cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",\
is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27724",\
num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",sliding_window="None",\
swap_space="4",swap_space_bytes="4294967296"}} 1.0
vllm:cache_config_info{{block_size="16",cache_dtype="auto",calculate_kv_scales="False",\
cpu_offload_gb="0",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",\
is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27724",\
num_gpu_blocks_override="None",prefix_caching_hash_algo="builtin",sliding_window="None",\
swap_space="4",swap_space_bytes="4294967296"}} 1.0
"""

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0]
TTFT_BUCKETS += [2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
TPOT_BUCKETS += [5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0]
LATENCY_BUCKETS += [50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKEN_BUCKETS = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]
TOKEN_BUCKETS += [5000.0, 10000.0, 20000.0, 50000.0, 100000.0]
ITER_BUCKETS = [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0]
ITER_BUCKETS += [8192.0, 16384.0]
HTTP_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0]
HTTP_BUCKETS += [3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0]

VLLM_HISTOGRAMS = [
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITER_BUCKETS),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token.", TTFT_BUCKETS),
    ("vllm:time_per_output_token_seconds", "Histogram of time per output token.", TPOT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.", TPOT_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency.", LATENCY_BUCKETS),
    ("vllm:request_queue_time_seconds", "Time spent in WAITING phase.", LATENCY_BUCKETS),
    ("vllm:request_inference_time_seconds", "Time spent in RUNNING phase.", LATENCY_BUCKETS),
    ("vllm:request_prefill_time_seconds", "Time spent in PREFILL phase.", LATENCY_BUCKETS),
    ("vllm:request_decode_time_seconds", "Time spent in DECODE phase.", LATENCY_BUCKETS),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", "Number of generation tokens.", TOKEN_BUCKETS),
    ("vllm:request_params_max_tokens", "The max_tokens request parameter.", TOKEN_BUCKETS),
    ("vllm:request_max_num_generation_tokens", "Max generation tokens.", TOKEN_BUCKETS),
    ("vllm:request_params_n", "The n request parameter.", [1.0, 2.0, 5.0, 10.0, 20.0]),
]


def _histogram(name: str, doc: str, buckets: list[float], label_sets: list[str]) -> str:
    lines = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for labels in label_sets:
        sep = "," if labels else ""
        count = 0
        for i, le in enumerate(buckets):
            count += i
            lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {float(count)}')
        lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {float(count)}')
        lines.append(f"{name}_count{{{labels}}} {float(count)}")
        lines.append(f"{name}_sum{{{labels}}} {count * 0.731}")
    base = name.removesuffix("_total")
    lines.append(f"# HELP {base}_created {doc}")
    lines.append(f"# TYPE {base}_created gauge")
    lines += [f"{base}_created{{{labels}}} 1.7412341312e+09" for labels in label_sets]
    return "\n".join(lines) + "\n"


def vllm_page(histogram_engines: tuple[str, ...] = ("0",)) -> str:
    """~50 KB, the size of a real single-engine vLLM page (about 85 KB with two)."""
    engines = [f'engine="{e}",model_name="{MODEL}"' for e in histogram_engines]
    parts = [VLLM_HEAD]
    parts += [_histogram(n, d, b, engines) for n, d, b in VLLM_HISTOGRAMS]
    handlers = [f'handler="{h}",method="POST"' for h in ("/v1/completions", "/v1/chat/completions")]
    handlers += ['handler="/metrics",method="GET"', 'handler="/v1/models",method="GET"']
    parts.append(
        _histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels.",
            [0.01 * i for i in range(1, 30)] + HTTP_BUCKETS,
            [""],
        )
    )
    parts.append(
        _histogram("http_request_duration_seconds", "Latency by handler.", HTTP_BUCKETS, handlers)
    )
    return "".join(parts)


# ---------------------------------------------------------------------------
# Edge cases, one family each, exact samples.
# ---------------------------------------------------------------------------
def test_comments_help_type_and_blank_lines_are_skipped() -> None:
    text = "# HELP a A gauge.\n# TYPE a gauge\n\n   \n# a 5\na 1\n\n"
    assert parse(text, {"a"}) == {"a": [Sample("a", {}, 1.0)]}


def test_no_labels_and_empty_label_set() -> None:
    text = "a 1\na{} 2\n"
    assert parse(text, {"a"})["a"] == [Sample("a", {}, 1.0), Sample("a", {}, 2.0)]


def test_labels_with_escapes() -> None:
    text = r'a{q="say \"hi\"",b="back\\slash",n="line1\nline2",o="odd\t"} 3' + "\n"
    assert parse(text, {"a"})["a"] == [
        Sample(
            "a",
            {"q": 'say "hi"', "b": "back\\slash", "n": "line1\nline2", "o": "odd\\t"},
            3.0,
        )
    ]


def test_label_values_with_commas_and_braces() -> None:
    text = 'a{x="1,2}",y="{z=3}",w="a\\"},b"} 4\n'
    assert parse(text, {"a"})["a"] == [Sample("a", {"x": "1,2}", "y": "{z=3}", "w": 'a"},b'}, 4.0)]


def test_trailing_comma_and_spaces_in_label_set() -> None:
    text = 'a{ x = "1" , y="2", } 5\n'
    assert parse(text, {"a"})["a"] == [Sample("a", {"x": "1", "y": "2"}, 5.0)]


def test_special_values() -> None:
    got = parse("a NaN\na +Inf\na -Inf\na 1e3\na -0.5\n", {"a"})["a"]
    assert math.isnan(got[0].value)
    assert [s.value for s in got[1:]] == [math.inf, -math.inf, 1000.0, -0.5]


def test_timestamp_after_value_is_accepted_and_dropped() -> None:
    text = 'a{x="1"} 7 1712345678000\na 8 -1\na 9 12.5\n'
    # A timestamp must be an integer (ms); `12.5` makes the line invalid.
    assert parse(text, {"a"})["a"] == [Sample("a", {"x": "1"}, 7.0), Sample("a", {}, 8.0)]


def test_counter_total_and_created_lines_belong_to_the_family() -> None:
    text = (
        "# TYPE c_total counter\nc_total 10\n"
        "# TYPE c_created gauge\nc_created 1.7e9\n"
        "c_other 5\nc 1\n"
    )
    assert parse(text, {"c"})["c"] == [
        Sample("c_total", {}, 10.0),
        Sample("c_created", {}, 1.7e9),
        Sample("c", {}, 1.0),
    ]
    # Asking for the exact sample name gets exactly those lines.
    assert parse(text, {"c_total"}) == {"c_total": [Sample("c_total", {}, 10.0)]}
    # Both asked: the exact name wins, no line is counted twice.
    both = parse(text, {"c", "c_total"})
    assert both["c_total"] == [Sample("c_total", {}, 10.0)]
    assert [s.name for s in both["c"]] == ["c_created", "c"]


def test_histogram_lines_belong_to_the_family() -> None:
    text = 'h_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_count 2\nh_sum 3.5\n'
    got = parse(text, {"h"})["h"]
    assert [(s.name, s.labels, s.value) for s in got] == [
        ("h_bucket", {"le": "1"}, 1.0),
        ("h_bucket", {"le": "+Inf"}, 2.0),
        ("h_count", {}, 2.0),
        ("h_sum", {}, 3.5),
    ]


def test_unwanted_and_prefix_sharing_names_are_not_returned() -> None:
    text = (
        "vllm:num_requests_waiting_by_reason 9\n"
        "xvllm:num_requests_waiting 8\n"
        'other{a="vllm:num_requests_waiting 7"} 1\n'
        "# HELP vllm:num_requests_waiting 6\n"
        "vllm:num_requests_waiting 5\n"
    )
    assert parse(text, {"vllm:num_requests_waiting"}) == {
        "vllm:num_requests_waiting": [Sample("vllm:num_requests_waiting", {}, 5.0)]
    }
    assert parse(text, set()) == {}
    assert parse(text, {"absent"}) == {}


@pytest.mark.parametrize(
    "line",
    [
        "a",
        "a ",
        "a{",
        'a{x="1"',
        'a{x="1"}',
        'a{x="1"}5',
        "a{x=1} 5",
        'a{x="unterminated} 5',
        'a{="v"} 5',
        'a{x="1" y="2"} 5',
        "a one",
        "a 1 2 3",
        "a 1 ts",
        'a{x="1\\',
        "a{x} 5",
        "a\x00 5",
    ],
)
def test_garbage_lines_are_skipped(line: str) -> None:
    text = f"a 1\n{line}\na 2\n"
    assert parse(text, {"a"})["a"] == [Sample("a", {}, 1.0), Sample("a", {}, 2.0)]
    assert parse_line(line) is None


def test_garbage_never_raises() -> None:
    junk = '\x00\xff{}"\\,=# \n\t\r' * 50
    for text in (junk, "a" + junk, "a{" * 100, "a{" + "\\" * 100):
        parse(text, {"a", "b"})


def test_bytes_crlf_leading_blanks_and_no_final_newline() -> None:
    text = b'  a{x="\xc3\xa9"} 1\r\n\ta 2'
    assert parse(text, {"a"})["a"] == [Sample("a", {"x": "é"}, 1.0), Sample("a", {}, 2.0)]


# ---------------------------------------------------------------------------
# The real-size page.
# ---------------------------------------------------------------------------
def test_vllm_page_is_real_size() -> None:
    assert 30_000 < len(vllm_page()) < 60_000


def test_vllm_page_gauges_exact() -> None:
    got = parse(vllm_page(), VLLM.families)
    eng = [{"engine": e, "model_name": MODEL} for e in ("0", "1")]
    assert got["vllm:num_requests_running"] == [
        Sample("vllm:num_requests_running", eng[0], 3.0),
        Sample("vllm:num_requests_running", eng[1], 2.0),
    ]
    assert got["vllm:num_requests_waiting"] == [
        Sample("vllm:num_requests_waiting", eng[0], 1.0),
        Sample("vllm:num_requests_waiting", eng[1], 4.0),
    ]
    assert [s.value for s in got["vllm:kv_cache_usage_perc"]] == [0.2, 0.4]
    assert [s.value for s in got["vllm:gpu_cache_usage_perc"]] == [0.5, 0.5]
    lora = got["vllm:lora_requests_info"]
    assert [s.labels["running_lora_adapters"] for s in lora] == [
        "sql-lora",
        "sql-lora, tweet-lora",
        "",
    ]
    cache = got["vllm:cache_config_info"]
    assert len(cache) == 2
    assert cache[0].labels["block_size"] == "16"
    assert cache[1].labels["engine"] == "1"
    assert cache[0].labels["swap_space_bytes"] == "4294967296"
    assert set(got) == VLLM.families


def test_vllm_page_histogram_and_counter_families() -> None:
    page = vllm_page()
    ttft = parse(page, {"vllm:time_to_first_token_seconds"})["vllm:time_to_first_token_seconds"]
    # 22 finite buckets + Inf + count + sum + `_created`
    assert len(ttft) == len(TTFT_BUCKETS) + 4
    assert ttft[0] == Sample(
        "vllm:time_to_first_token_seconds_bucket",
        {"engine": "0", "model_name": MODEL, "le": "0.001"},
        0.0,
    )
    # A histogram whose own name ends in `_total`.
    it = parse(page, {"vllm:iteration_tokens_total"})["vllm:iteration_tokens_total"]
    assert {s.name for s in it} == {
        "vllm:iteration_tokens_total_bucket",
        "vllm:iteration_tokens_total_count",
        "vllm:iteration_tokens_total_sum",
    }
    succ = parse(page, {"vllm:request_success"})["vllm:request_success"]
    assert [(s.labels["finished_reason"], s.value) for s in succ] == [
        ("stop", 911.0),
        ("length", 42.0),
        ("abort", 3.0),
    ]


def test_vllm_page_extracts() -> None:
    m = extract("vllm", parse(vllm_page(), VLLM.families), now=12.5)
    assert m.waiting_queue_size == 5  # 1 + 4, summed over engines
    assert m.running_requests == 5  # 3 + 2
    assert m.kv_cache_usage == pytest.approx(0.3)  # mean of 0.2 and 0.4; new name wins
    assert m.active_models == frozenset({"sql-lora", "tweet-lora"})  # latest series
    assert m.waiting_models == frozenset({"chat-lora"})
    assert m.max_active_models == 4
    assert m.cache_block_size == 16
    assert m.cache_num_blocks == 27724
    assert m.update_time == 12.5


def test_agrees_with_prometheus_client_parser() -> None:
    """Cross-check against the reference parser on the whole page."""
    parser = pytest.importorskip("prometheus_client.parser")
    page = vllm_page()
    ref = {}
    for fam in parser.text_string_to_metric_families(page):
        for s in fam.samples:
            ref.setdefault(s.name, []).append((s.labels, s.value))
    names = set(ref)
    got = parse(page, names)
    for name in names:
        mine = [(s.labels, s.value) for s in got[name] if s.name == name]
        assert mine == ref[name], name


# ---------------------------------------------------------------------------
# The two-step reader (issue 13 §6): a names-only scan, then each line read alone and
# cached. It must give what reading every line with `parse_line` gives.
# ---------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from epp.datalayer import promtext  # noqa: E402


def reference(text: str, wanted: set[str]) -> dict[str, list[Sample]]:
    """Every line through `parse_line`, kept if its name is a wanted family (exact, or
    a wanted name plus a suffix; an exact match wins)."""
    out: dict[str, list[Sample]] = {}
    for line in text.split("\n"):
        s = parse_line(line)
        if s is None:
            continue
        if s.name in wanted:
            family = s.name
        else:
            bases = [s.name[: -len(x)] for x in promtext.SUFFIXES if s.name.endswith(x)]
            matches = [b for b in bases if b in wanted]
            if not matches:
                continue
            family = max(matches, key=len)
        out.setdefault(family, []).append(s)
    return out


NAMES = ["vllm:a", "vllm:ab", "vllm:a_total", "vllm:b", "sglang:q", "x"]
line_st = st.builds(
    lambda blank, name, suffix, labels, value: f"{blank}{name}{suffix}{labels} {value}",
    st.sampled_from(["", "", " ", "\t"]),
    st.sampled_from([*NAMES, "vllm:c", "vllm:", "# HELP vllm:a x", "#"]),
    st.sampled_from(["", "", "_total", "_bucket", "_sum", "_x"]),
    st.sampled_from(["", "{}", '{a="1"}', '{a="x\\"y",b="2",}', '{a="1"', "{=}"]),
    st.sampled_from(["1", "2.5", "NaN", "+Inf", "-1e3", "x", "3 1700000000"]),
)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(line_st, max_size=12),
    wanted=st.sets(st.sampled_from(NAMES), min_size=1),
    crlf=st.booleans(),
)
def test_the_page_reader_equals_reading_every_line(lines, wanted, crlf) -> None:
    text = ("\r\n" if crlf else "\n").join(lines)
    want = comparable(reference(text, wanted))
    assert comparable(parse(text.encode(), wanted)) == want
    assert comparable(parse(text.encode(), wanted)) == want  # again, from the line cache


def comparable(got: dict[str, list[Sample]]) -> dict[str, list[tuple[str, dict, str]]]:
    return {f: [(s.name, s.labels, repr(s.value)) for s in ss] for f, ss in got.items()}  # NaN


def test_cached_lines_give_the_caller_its_own_labels_and_changed_lines_are_reread() -> None:
    page = 'vllm:num_requests_waiting{m="a"} 1\n'
    first = parse(page.encode(), {"vllm:num_requests_waiting"})
    first["vllm:num_requests_waiting"][0].labels["m"] = "changed by a caller"
    again = parse(page.encode(), {"vllm:num_requests_waiting"})
    assert again["vllm:num_requests_waiting"][0].labels == {"m": "a"}
    changed = parse(page.replace(" 1", " 7").encode(), {"vllm:num_requests_waiting"})
    assert changed["vllm:num_requests_waiting"][0].value == 7.0


def test_long_lines_are_read_but_not_kept() -> None:
    wanted = frozenset({"vllm:lora_requests_info"})
    long_value = "x" * (promtext._CACHE_LINE_CHARS + 1)
    page = f'vllm:lora_requests_info{{running_lora_adapters="{long_value}"}} 1\n'
    got = parse(page.encode(), wanted)
    assert got["vllm:lora_requests_info"][0].labels["running_lora_adapters"] == long_value
    finder = promtext._finder(wanted)
    assert finder is not None and all(len(k) <= promtext._CACHE_LINE_CHARS for k in finder.cache)


@given(st.sets(st.text(alphabet="ab:_", min_size=1, max_size=5), min_size=1, max_size=6))
def test_the_trie_alternation_matches_exactly_the_names(words) -> None:
    import re

    rx = re.compile(promtext._trie_regex(words))
    for probe in {*words, *(w + "a" for w in words), *(w[:-1] for w in words), "b:a"}:
        assert (rx.fullmatch(probe) is not None) == (probe in words), probe
