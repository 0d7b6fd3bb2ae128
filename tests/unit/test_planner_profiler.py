"""`epp profile`'s pure parts: Dynamo's grids, the arrays, the recommendation and its
lines, the steady-part ITL, and the virtual-time profile of a preset (exact step
arithmetic: no clock involved)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from epp.cli import main
from epp.planner.profiler.driver import Sla, profile
from epp.planner.profiler.measure import median, steady_decode
from epp.planner.profiler.plan import (
    DecodeLoad,
    EndpointLimits,
    PlanError,
    SweepSettings,
    decode_grid,
    make_plan,
    num_request_range,
    prefill_isl_grid,
)
from epp.planner.profiler.results import (
    DECODE_ARRAYS,
    PREFILL_ARRAYS,
    Candidate,
    DecodeResult,
    Endpoint,
    PrefillResult,
    decode_arrays,
    decode_kv_bounds,
    json_ready,
    long_prefill_threshold,
    pick_decode,
    pick_prefill,
    prefill_arrays,
    prefill_queue_bounds,
    recommend,
)
from epp.planner.profiler.virtual import VirtualTarget

# ------------------------------------------------------------------ plan


def test_num_request_range_follows_dynamo():
    # 10 fit, 6 points: step (10-1)/5 = 1.8 -> 1 + int(0, 1.8, 3.6, 5.4, 7.2, 9.0)
    assert num_request_range(10, 6) == [1, 2, 4, 6, 8, 10]
    # fewer than 6 fit: every count
    assert num_request_range(5, 6) == [1, 2, 3, 4, 5]
    # capped at 2000: step 1999/5 = 399.8 -> 1 + int(0, 399.8, 799.6, 1199.4, 1599.2, 1999)
    assert num_request_range(3000, 6) == [1, 400, 800, 1200, 1600, 2000]
    # attention DP 2: 10 // 2 = 5 per rank < 6 -> multiples of 2
    assert num_request_range(10, 6, attn_dp=2) == [2, 4, 6, 8, 10]
    assert num_request_range(3000, 6, cap=10) == [1, 2, 4, 6, 8, 10]


def test_prefill_grid_is_dynamos_range():
    # 16384 - 512 = 15872; step (15872 - 100) // 16 = 985; 100 + 16*985 = 15860 < 15872
    grid = prefill_isl_grid(16384, 16)
    assert grid == list(range(100, 15872, 985))
    assert (len(grid), grid[-1]) == (17, 15860)
    with pytest.raises(PlanError, match="max-context-length 612"):
        prefill_isl_grid(612)  # 612 - 512 = 100: nothing above ISL 100


def test_decode_grid_is_isl_by_in_flight():
    # top 16384 - 500 = 15884, step 15884 // 6 = 2647: ISL 100, 2747, ..., 13335
    loads = decode_grid(16384, 442_368, 6, 500)
    assert sorted({x.isl for x in loads}) == [100, 2747, 5394, 8041, 10688, 13335]
    # ISL 100: 442368 // 600 = 737 fit -> step 736/5 = 147.2
    assert [x.num_request for x in loads if x.isl == 100] == [1, 148, 295, 442, 589, 737]
    # ISL 13335: 442368 // 13835 = 31 -> step 30/5 = 6
    assert [x.num_request for x in loads if x.isl == 13335] == [1, 7, 13, 19, 25, 31]


def test_decode_grid_stops_at_the_first_isl_that_does_not_fit():
    # step 3500 // 2 = 1750: ISL 100 (2000 // 600 = 3 fit -> [1, 3]), ISL 1850 (0 fit)
    assert decode_grid(4000, 2000, 2, 500) == [DecodeLoad(100, 500, 1), DecodeLoad(100, 500, 3)]
    with pytest.raises(PlanError, match="cannot hold one request"):
        decode_grid(4000, 500, 2, 500)


def test_decode_load_is_dynamos_x_and_y():
    load = DecodeLoad(3000, 500, 10)
    assert load.context_length == 3250  # 3000 + 500/2
    assert load.kv_usage(442_368) == pytest.approx(3250 * 10 / 442_368)


def test_make_plan_caps_context_at_the_server_and_checks_the_target():
    plan = make_plan(SweepSettings(isl=300, osl=100), EndpointLimits(2048, 1024))
    assert plan.max_context_length == 1024  # min(16384, max_model_len)
    assert plan.prefill_isls[0] == 100 and plan.prefill_isls[-1] < 1024 - 512
    # 2048 // (300 + 100) = 5 fit, fewer than 6 points: all of them
    assert [x.num_request for x in plan.comparison_decode] == [1, 2, 3, 4, 5]
    with pytest.raises(PlanError, match="max_model_len 1024"):
        make_plan(SweepSettings(isl=3000, osl=500), EndpointLimits(2048, 1024))
    with pytest.raises(PlanError, match="--repeats"):
        make_plan(SweepSettings(repeats=0), EndpointLimits(10**6, 10**5))


# ------------------------------------------------------------------ results


def test_prefill_throughput_per_gpu():
    # 3000 tokens in 150 ms on 2 GPUs: 3000 / 150 * 1000 / 2 = 10000 tokens/s/GPU
    assert PrefillResult(3000, 150.0, 2).thpt_per_gpu == pytest.approx(10_000)


def test_arrays_have_dynamos_names_and_shapes():
    p = prefill_arrays([PrefillResult(100, 10.0), PrefillResult(200, 16.0)])
    assert tuple(p) == PREFILL_ARRAYS
    assert p["prefill_thpt_per_gpu"].tolist() == [10_000.0, 12_500.0]  # 100/10e-3, 200/16e-3
    loads = [DecodeLoad(100, 500, 1), DecodeLoad(100, 500, 4)]
    d = decode_arrays([DecodeResult(x, 5.0, 200.0 * x.num_request) for x in loads], 1000)
    assert tuple(d) == DECODE_ARRAYS
    assert d["x_kv_usage"].tolist() == [0.35, 1.4]  # 350 * 1 / 1000, 350 * 4 / 1000
    assert d["y_context_length"].tolist() == [350.0, 350.0]
    assert d["max_kv_tokens"].shape == (1,)
    assert json_ready(d)["max_kv_tokens"] == 1000  # a scalar in the JSON fallback
    json.dumps(json_ready(d))


def _cand(name: str, gpus: int, ttft: float, decode: list[tuple[int, float, float]]) -> Candidate:
    loads = [DecodeResult(DecodeLoad(3000, 500, n), itl, thpt) for n, itl, thpt in decode]
    return Candidate(Endpoint(name, gpus), 442_368, PrefillResult(3000, ttft, gpus), tuple(loads))


def test_prefill_pick_best_throughput_within_sla_else_lowest_ttft():
    a = _cand("a", 1, 40.0, [(1, 9.0, 100.0)])  # 3000/40*1000 = 75000 tok/s/GPU
    b = _cand("b", 4, 20.0, [(1, 5.0, 50.0)])  # 3000/20*1000/4 = 37500
    assert pick_prefill([a, b], 50.0).candidate is a  # both meet: a is cheaper per GPU
    assert pick_prefill([a, b], 30.0).candidate is b  # only b meets
    none = pick_prefill([a, b], 10.0)
    assert (none.candidate, none.meets_sla) == (b, False)  # Dynamo's fallback: min TTFT


def test_decode_pick_scans_every_endpoint_and_concurrency():
    a = _cand("a", 1, 40.0, [(1, 9.0, 110.0), (32, 14.0, 2300.0), (64, 22.0, 2900.0)])
    b = _cand("b", 2, 20.0, [(1, 6.0, 80.0), (64, 12.0, 2500.0)])
    pick = pick_decode([a, b], 15.0)  # a@32 (2300) vs b@64 (2500): b@64
    assert (pick.candidate, pick.num_request, pick.latency_ms) == (b, 64, 12.0)
    pick = pick_decode([a, b], 4.0)
    assert (pick.candidate, pick.latency_ms, pick.meets_sla) == (b, 6.0, False)


def test_threshold_formulas_reproduce_the_seed():
    # seed 002: TTFT 48.37 ms against a 50 ms SLA -> "0.24/0.10"
    q = prefill_queue_bounds(50.0, 48.37)
    assert q.upper == pytest.approx(50 * 1.2 / 48.37 - 1)  # 0.2405
    assert q.lower == 0.1  # 50 * 0.8 / 48.37 - 1 < 0 -> floor 0.1
    # one stream of 3000 + 500/2 in 1e6 tokens: util 0.00325 -> 0.20/0.10
    kv = decode_kv_bounds(1, 3000, 500, 1_000_000)
    assert kv.upper == pytest.approx(0.20325) and kv.lower == 0.1
    # 100 streams: util 0.325 -> 0.525/0.125; 400 streams: 1.3 -> capped at 1
    assert decode_kv_bounds(100, 3000, 500, 1_000_000).lower == pytest.approx(0.125)
    assert decode_kv_bounds(400, 3000, 500, 1_000_000).upper == 1.0


def test_recommendation_lines_in_the_seeds_words():
    tp4 = Candidate(
        Endpoint("http://x", 4),
        1_000_000,
        PrefillResult(3000, 48.37, 4),
        (DecodeResult(DecodeLoad(3000, 500, 1), 4.83, 51.22),),
    )
    rec = recommend([tp4], ttft_ms=50, itl_ms=10, isl=3000, osl=500)
    lines = rec.lines()
    # 3000 / 48.37 * 1000 / 4 = 15505.48
    assert lines[:4] == [
        "Suggested prefill TP:4 (TTFT 48.37 ms, throughput 15505.48 tokens/s/GPU)",
        "Suggested planner upper/lower bound for prefill queue size: 0.24/0.10",
        "Suggested decode TP:4 (ITL 4.83 ms, throughput 51.22 tokens/s/GPU)",
        "Suggested planner upper/lower bound for decode kv cache utilization: 0.20/0.10",
    ]
    assert "--prefill-queue-scale-up-threshold 0.24" in lines[4]
    assert rec.meets_sla
    strict = recommend([tp4], ttft_ms=40, itl_ms=10, isl=3000, osl=500)
    assert not strict.meets_sla
    assert strict.lines()[0].startswith("No engine configuration satisfies the TTFT requirement")


# ------------------------------------------------------------------ measure


def test_steady_decode_uses_the_part_where_all_streams_decode():
    # window: last first token 0.5 s .. first last token 3.0 s
    # stream 1 inside: 1, 2, 3 (2 gaps, 2 s); stream 2: 0.5, 1.5, 2.5 (2 gaps, 2 s)
    t = steady_decode([[0, 1, 2, 3], [0.5, 1.5, 2.5, 3.5]])
    assert t.steady and t.itl_ms == pytest.approx(1000.0)
    assert t.tokens_per_s == pytest.approx(4 / 2.5)
    # never together: whole streams, 3 gaps over 3 s, 3 tokens over a 7 s span
    t = steady_decode([[0, 1], [5, 6, 7]])
    assert not t.steady and t.itl_ms == pytest.approx(1000.0)
    assert t.tokens_per_s == pytest.approx(3 / 7)
    with pytest.raises(ValueError, match="two tokens"):
        steady_decode([[1.0]])
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5


# ------------------------------------------------------------------ virtual time


def test_virtual_prefill_is_the_step_arithmetic():
    t = VirtualTarget.for_preset("tiny")
    # tiny: chunks of 256 then 44; each step 2 ms + 0.01 ms per prompt token:
    # (2 + 2.56) + (2 + 0.44) = 7.0 ms
    assert asyncio.run(t.prefill(300, 5)).ttft_ms == pytest.approx(7.0)


def test_virtual_decode_is_the_step_arithmetic():
    t = VirtualTarget.for_preset("tiny")
    timing = asyncio.run(t.decode(DecodeLoad(100, 50, 3)))
    # 3 decoding sequences: 2 ms + 0.1 ms * (1 + 1 * (3 - 1)) = 2.3 ms a step
    assert timing.steady and timing.itl_ms == pytest.approx(2.3)
    assert timing.tokens_per_s == pytest.approx(3 / 0.0023)


def test_virtual_profile_of_a_preset():
    target = VirtualTarget.for_preset("tiny")
    settings = SweepSettings.quick(isl=300, osl=100)
    report = asyncio.run(profile([target], settings, Sla(ttft_ms=50, itl_ms=10)))
    assert [p.isl for p in report.prefill] == prefill_isl_grid(1024, 4)
    ttft = [p.ttft_ms for p in report.prefill]
    assert ttft == sorted(ttft)  # longer prompts, more tokens per step: never faster
    assert report.decode_max_kv_tokens == 128 * 16
    by_ctx: dict[float, list[float]] = {}
    for p in report.decode:
        by_ctx.setdefault(p.load.context_length, []).append(p.itl_ms)
    for itls in by_ctx.values():
        assert itls == sorted(itls)  # more streams, longer steps
    assert report.recommendation.meets_sla


def test_long_prefill_threshold_fits_a_chunk_in_the_itl_share():
    # TTFT = 10 ms + 0.1 ms per token: a step within 0.75 x 50 ms = 37.5 ms holds 275 tokens
    points = [PrefillResult(isl, 10.0 + 0.1 * isl) for isl in (100, 1000, 4000)]
    assert long_prefill_threshold(points, itl_ms=50.0, share=0.75) == 275
    assert long_prefill_threshold(points, itl_ms=50.0, share=0.5) == 150
    assert long_prefill_threshold(points, itl_ms=12.0) is None  # one token's step overruns
    assert long_prefill_threshold(points[:1], itl_ms=50.0) is None  # no slope from one ISL


def test_cli_virtual_writes_dynamos_files(tmp_path, capsys):
    out = tmp_path / "p"
    argv = ["profile", "--virtual-preset", "tiny", "--quick", "--isl", "300", "--osl", "100"]
    rc = main([*argv, "--ttft", "50", "--itl", "10", "-o", str(out), "--no-progress"])
    assert rc == 0
    stdout = capsys.readouterr().out
    assert "Suggested planner upper/lower bound for prefill queue size:" in stdout
    summary = json.loads((out / "summary.json").read_text())
    tokens = summary["engine_flags"]["long-prefill-token-threshold"]
    assert f"Suggested engine flags: --long-prefill-token-threshold {tokens}" in stdout
    with np.load(out / "selected_prefill_interpolation" / "raw_data.npz") as z:
        assert set(z.files) == set(PREFILL_ARRAYS)
    with np.load(out / "selected_decode_interpolation" / "raw_data.npz") as z:
        assert set(z.files) == set(DECODE_ARRAYS)
        n = len(z["z_itl"])
        assert all(z[k].shape == (n,) for k in DECODE_ARRAYS if k != "max_kv_tokens")
    decode_json = json.loads((out / "decode_raw_data.json").read_text())
    assert decode_json["max_kv_tokens"] == 2048
    # An SLA nothing meets: the data are still written, exit 2 says so.
    rc = main([*argv, "--ttft", "0.5", "--itl", "10", "-o", str(out / "strict"), "--no-plots"])
    assert rc == 2
    assert (out / "strict" / "selected_prefill_interpolation" / "raw_data.npz").exists()
    assert "No engine configuration satisfies the TTFT requirement" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give --url"),
        (["--url", "ftp://x"], "not an http(s) URL"),
        (["--url", "http://a", "--url", "http://b", "--gpus", "1", "--gpus", "2", "--gpus", "4"],
         "--gpus given 3 times"),
        (["--virtual-preset", "nope"], "unknown preset"),
        (["--virtual-preset", "tiny", "--itl", "0"], "--ttft and --itl must be > 0"),
        (["--virtual-preset", "tiny"], "exceeds the server's max_model_len 1024"),
        (["--virtual-preset", "tiny", "--time-scale", "20"], "--time-scale and --seed apply"),
    ],
)  # fmt: skip
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    rc = main(["profile", *argv, "-o", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert message in err and err.startswith("epp profile:") and "Traceback" not in err
