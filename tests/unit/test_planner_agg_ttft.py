"""The aggregated replica's TTFT model (`epp.planner.core.agg_ttft`), each formula on a case
worked out by hand.

Profile (tests/planner_helpers.py): batch-1 TTFT = ISL/40 ms (25 ms at 1000, 75 ms at
3000, 400 ms at 16 000, its last point); decode ITL = 5 + 20·KV ms (5 ms at no load).
"""

from __future__ import annotations

import math

import pytest

from epp.planner.core.agg_ttft import (
    aggregated_ttft,
    chunks,
    mixture_quantile,
    mixture_share,
    regime,
    ttft1_ms,
)
from tests.planner_helpers import profile


def test_chunks_are_the_steps_a_prompt_takes_under_the_token_budget():
    assert [chunks(u, 8192) for u in (0, 100, 8192, 8193, 20_000)] == [1, 1, 1, 2, 3]


def test_batch1_ttft_follows_the_profile_inside_and_its_last_segment_beyond():
    # inside: 3000 / 40 = 75 ms. Beyond 16 000: the last segment (8000 -> 16 000 tokens,
    # 200 -> 400 ms) has slope 0.025 ms/token: 20 000 -> 400 + 4000 x 0.025 = 500 ms (the
    # profile's own lookup clamps at 400).
    got = ttft1_ms(profile(), [3000, 20_000])
    assert got.tolist() == pytest.approx([75.0, 500.0])
    assert profile().prefill.ttft(20_000) == pytest.approx(400.0)


def test_step_regime_stretches_the_step_and_biases_the_one_an_arrival_meets():
    # 2 prompts/s of work 100 and 300 ms: E[w] = 0.2 s, rho = 0.4; E[w^2] = 0.05 s^2.
    # mean step 10 / 0.6 = 16.667 ms; length-biased 16.667 + 2 x 0.05 / (1 - 0.16) s =
    # 16.667 + 119.048 = 135.714 ms; wait (0.5 + 0.4) x 135.714 = 122.143 ms.
    r = regime(2.0, [100.0, 300.0], itl_ms=10.0, base_ms=5.0)
    assert r.rho == pytest.approx(0.4)
    assert r.mean_step_ms == pytest.approx(10 / 0.6)
    assert r.biased_step_ms == pytest.approx(10 / 0.6 + 0.1 / 0.84 * 1000)
    assert r.wait_ms == pytest.approx(0.9 * (10 / 0.6 + 0.1 / 0.84 * 1000))
    assert r.stable


def test_step_regime_without_prompts_waits_half_a_step_and_saturated_is_unstable():
    idle = regime(0.0, [100.0], itl_ms=10.0, base_ms=5.0)
    assert (idle.rho, idle.mean_step_ms, idle.wait_ms) == (0.0, 10.0, 5.0)
    full = regime(10.0, [100.0], itl_ms=10.0, base_ms=5.0)  # rho = 1
    assert not full.stable and math.isinf(full.mean_step_ms)


def test_mixture_share_and_quantile_over_prompts_and_an_exponential_wait():
    # own 100 and 200 ms: with no wait, half within 150; with a 50 ms mean wait, the first
    # within 150 with probability 1 - e^-1, the second never: (1 - e^-1) / 2.
    assert mixture_share([100.0, 200.0], 0.0, 150.0) == 0.5
    assert mixture_share([100.0, 200.0], 50.0, 150.0) == pytest.approx((1 - math.exp(-1)) / 2)
    # one prompt of 100 ms, wait mean 10 ms: the p90 is 100 + 10 ln 10 = 123.03 ms
    assert mixture_quantile([100.0], 10.0, 0.9) == pytest.approx(100 + 10 * math.log(10))
    assert math.isinf(mixture_quantile([100.0], math.inf, 0.9))
    assert mixture_share([100.0], math.inf, 1e9) == 0.0


def test_aggregated_ttft_on_a_replica_with_ten_decodes():
    # 2 prompts/s of 1000 and 3000 tokens (25 and 75 ms at batch 1, one step each), answers
    # of 150 at context 3075. Base step (no load): 5 ms, so their work is 20 and 70 ms.
    # 10 decodes: KV 10 x 3075 / 100 000 = 0.3075 -> grid column 30 -> ITL 5 + 20 x 30/99
    # = 11.061 ms. rho = 2 x 0.045 = 0.09; mean step 11.061 / 0.91; E[w^2] = 0.00265 s^2,
    # length-biased step + 2 x 0.00265 / (1 - 0.0081) s; wait (0.5 + 0.09) x that.
    # Own: 25 + (11.061 - 5) and 75 + (11.061 - 5).
    itl = 5 + 20 * 30 / 99
    m = aggregated_ttft(profile(), 2.0, [1000, 3000], 150, 3075, decodes=10)
    assert m.regime.itl_ms == pytest.approx(itl, rel=1e-3)
    assert m.regime.rho == pytest.approx(0.09, rel=1e-3)
    biased = itl / 0.91 + 2 * 0.00265 / (1 - 0.09**2) * 1000
    assert m.regime.wait_ms == pytest.approx(0.59 * biased, rel=1e-3)
    assert m.own_ms.tolist() == pytest.approx([25 + itl - 5, 75 + itl - 5], rel=1e-3)
    assert m.works_ms.tolist() == pytest.approx([20.0, 70.0], rel=1e-3)
    assert m.mean() == pytest.approx((25 + 75) / 2 + itl - 5 + 0.59 * biased, rel=1e-3)


def test_a_long_prompt_is_chunked_and_each_chunk_step_carries_the_decodes():
    # 20 000 tokens, budget 8192: 3 steps. Batch-1 500 ms (extended), work 500 - 3 x 5 =
    # 485 ms, own 500 + 3 x (ITL - 5): the decodes ride in each of its three steps.
    itl = 5 + 20 * 30 / 99
    m = aggregated_ttft(profile(), 0.5, [20_000], 150, 3075, budget=8192, decodes=10)
    assert m.works_ms.tolist() == pytest.approx([485.0], rel=1e-3)
    assert m.own_ms.tolist() == pytest.approx([500 + 3 * (itl - 5)], rel=1e-3)
    one = aggregated_ttft(profile(), 0.5, [20_000], 150, 3075, budget=32_768, decodes=10)
    assert one.own_ms.tolist() == pytest.approx([500 + (itl - 5)], rel=1e-3)


def test_without_measured_decodes_littles_law_sets_them_and_more_rate_waits_longer():
    # rate x OSL x step: the fixed point has decodes; a higher rate, more of them, a
    # longer step and wait
    low = aggregated_ttft(profile(), 1.0, [1000, 3000], 150, 3075)
    high = aggregated_ttft(profile(), 4.0, [1000, 3000], 150, 3075)
    assert 5.0 < low.regime.itl_ms < high.regime.itl_ms
    assert low.regime.wait_ms < high.regime.wait_ms
    assert low.quantile(0.9) < high.quantile(0.9)
