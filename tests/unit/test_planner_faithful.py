"""Dynamo SLA-v1 reproduced on recorded inputs: the scenarios of Dynamo's
tests/planner/test_replica_calculation.py (reference §8.1), worked out by hand.

Profile (tests/planner_helpers.py): prefill 40 000 tok/s/GPU at every ISL (TTFT 75 ms
at ISL 3000); decode ITL = 5 + 20·KV ms, 10 000 tok/s/GPU. Interval 60 s, constant
predictor (next = this interval), so each step sizes on what it observed.
"""

from __future__ import annotations

import pytest

from epp.planner.core.planner import build_policy
from epp.planner.core.types import Role
from tests.planner_helpers import agg, config, obs, pd, profile

P, D, A = Role.PREFILL, Role.DECODE, Role.AGGREGATED


def dynamo(**settings):
    base = {
        "mode": "dynamo",
        "pool": "disaggregated",
        "adjustment_interval": 60,
        "load_predictor": "constant",
        "itl": 10,
        "no_correction": True,
        "max_gpu_budget": 10,
    }
    return build_policy("dynamo", config(**(base | settings)), profile())


def test_basic_prefill_and_decode():
    # prefill: 10 req × 3000 / 60 s × min(1, 1) = 500 tok/s; / 40 000 / 1 GPU = 0.0125 -> 1
    # decode: ITL 10 ms -> 5 + 20·kv <= 10 -> kv 24/99, 10 000 tok/s/GPU;
    #         10 × 150 / 60 = 25 tok/s / 10 000 = 0.0025 -> 1
    d = dynamo().step(60, obs(completions=10, replicas=pd(1, 1)))
    assert d.targets == {P: 1, D: 1}
    assert d.diagnostics["prefill_thpt_per_gpu"] == pytest.approx(40_000)
    assert d.diagnostics["decode_thpt_per_gpu"] == pytest.approx(10_000)
    assert d.predicted.requests == 10 and d.predicted.horizon_s == 60


def test_high_load():
    # prefill: 6000 × 3000 / 60 = 300 000 tok/s / 40 000 = 7.5 -> 8
    # decode: 6000 × 150 / 60 = 15 000 tok/s / 10 000 = 1.5 -> 2; 8 + 2 = 10 GPUs = budget
    d = dynamo().step(60, obs(completions=6000, replicas=pd(1, 1)))
    assert d.targets == {P: 8, D: 2}


def test_budget_three_gpus_round():
    # wanted P8 D2 = 10 > 3: scale 0.3; P = max(1, round(2.4)) = 2; D = max(1, round(3-2)) = 1
    d = dynamo(max_gpu_budget=3).step(60, obs(completions=6000, replicas=pd(1, 1)))
    assert d.targets == {P: 2, D: 1}
    assert d.diagnostics["dynamo_budget_scale"] == pytest.approx(0.3)


def test_dynamos_round_overshoot_is_caught_by_the_wrapper():
    # min-endpoint 2, budget 4, wanted P8 D2 = 10: scale 0.4; P = max(2, round(3.2)) = 3;
    # D = max(2, round((4 - 3)/1)) = 2 -> 5 GPUs > 4 (SLA-v1's bug, §1.6). The wrapper's
    # fit_budget cuts to the floors P2 D2 = 4.
    d = dynamo(max_gpu_budget=4, min_endpoint=2).step(60, obs(completions=6000, replicas=pd(2, 2)))
    assert d.diagnostics["dynamo_gpus"] == 5
    assert d.targets == {P: 2, D: 2} and d.diagnostics["budget_cut_gpus"] == 1
    assert "max-gpu-budget 4" in d.reason


def test_min_endpoint_two_at_low_load():
    d = dynamo(min_endpoint=2).step(60, obs(completions=10, replicas=pd(2, 2)))
    assert d.targets == {P: 2, D: 2}


def test_multi_gpu_engines():
    # prefill engines 2 GPUs: 7.5 / 2 = 3.75 -> 4 (8 GPUs); decode 1.5 -> 2; 10 GPUs <= 12
    d = dynamo(prefill_engine_num_gpu=2, max_gpu_budget=12).step(
        60, obs(completions=6000, replicas=pd(1, 1))
    )
    assert d.targets == {P: 4, D: 2}


def test_correction_factors_and_the_min_one_clamp():
    pol = dynamo(no_correction=False, itl=20)
    # p = 150 / ttft(3000) = 150 / 75 = 2.0; clamped: min(1, 2) = 1 -> P stays 8
    # Little: 6000 / 2 decode × 4 s / 60 s = 200 per replica; context 3000 + 75 = 3075;
    #   kv = 200 × 3075 / 100 000 = 6.15 -> column 99 (clipped) -> expected ITL 25 ms;
    #   observed 50 -> d = 2.0; corrected ITL target 20 / 2 = 10 ms -> still kv 24/99.
    d = pol.step(60, obs(completions=6000, ttft=150, itl=50, duration=4, replicas=pd(1, 2)))
    assert pol.mode.p_correction == pytest.approx(2.0)
    assert pol.mode.d_correction == pytest.approx(2.0)
    assert d.targets[P] == 8  # queueing never adds prefill replicas (#10528)
    # p below 1 (prefix cache): TTFT 37.5 / 75 = 0.5 -> 7.5 × 0.5 = 3.75 -> 4
    pol = dynamo(no_correction=False, itl=20)
    d = pol.step(60, obs(completions=6000, ttft=37.5, itl=50, duration=4, replicas=pd(1, 2)))
    assert pol.mode.p_correction == pytest.approx(0.5) and d.targets[P] == 4


def test_no_traffic_skips_the_interval_but_feeds_the_predictors():
    pol = dynamo()
    d = pol.step(60, obs(completions=6000, replicas=pd(1, 1)))
    assert d.targets == {P: 8, D: 2}
    # zero completions: means are NaN -> skip; replicas stay as they are (#6985)
    d = pol.step(120, obs(120, completions=0, replicas=pd(8, 2)))
    assert d.targets == {P: 8, D: 2} and "skipping adjustment" in d.reason
    # ...but the predictor saw the 0 (fed before the check): it now forecasts 0
    assert pol.mode.predictors.predict(1).requests == 0


def test_no_decode_replica_skips_like_a_failed_correction():
    pol = dynamo(no_correction=False)
    d = pol.step(60, obs(completions=10, replicas=pd(1, 0)))
    assert "correction failed" in d.reason and d.targets == {P: 1, D: 1}  # floors


def test_unreachable_itl_is_not_checked():
    # ITL target 4 ms < the 5 ms floor: Dynamo takes the lowest-KV cell anyway
    d = dynamo(itl=4).step(60, obs(completions=10, replicas=pd(1, 1)))
    assert d.diagnostics["decode_itl_met"] == 0.0 and d.targets[D] == 1


def test_aggregated_pool_uses_the_decode_formula_only():
    # 6000 × 150 / 60 = 15 000 tok/s / 10 000 = 1.5 -> 2 (prefill load ignored)
    pol = build_policy(
        "dynamo",
        config(
            mode="dynamo",
            adjustment_interval=60,
            load_predictor="constant",
            itl=10,
            no_correction=True,
        ),
        profile(),
    )
    d = pol.step(60, obs(completions=6000, replicas=agg(1)))
    assert d.targets == {A: 2}
