"""A request's ITL in an aggregated replica (`epp.planner.core.agg_itl`): the prompts batched
into its own steps, a compound Poisson sum, on cases worked out by hand."""

from __future__ import annotations

import math

import pytest
from scipy.special import ndtr

from epp.planner.core.agg_itl import LARGE_LAMBDA, DecodeSteps, quantile, share, within


def test_one_token_answers_have_no_itl_and_count_as_within():
    assert within(DecodeSteps(10.0, 0.1, 1.0, [50.0]), 1.0, [1, 1]).tolist() == [1.0, 1.0]


def test_without_prompts_a_request_is_within_iff_the_bare_step_is():
    assert within(DecodeSteps(10.0, 0.0, 0.0, [50.0]), 12.0, [10]).tolist() == [1.0]
    assert within(DecodeSteps(10.0, 0.0, 0.0, [50.0]), 9.0, [10]).tolist() == [0.0]


def test_a_short_answer_meets_at_most_the_prompts_its_slack_absorbs():
    # OSL 10: 9 gaps of a 10 ms step; 1 prompt/s of 50 ms work (rho 0.05). Expected
    # prompts during its decode: 1 x 9 x 0.010 / 0.95 = 0.09474.
    # limit 14 ms: slack 9 x 4 = 36 ms < 50: within only with no prompt, e^-0.09474.
    # limit 16 ms: slack 54 ms: no prompt or one (two take 100 ms): e^-lam (1 + lam).
    lam = 9 * 0.010 / 0.95
    assert within(DecodeSteps(10.0, 0.05, 1.0, [50.0]), 14.0, [10])[0] == pytest.approx(
        math.exp(-lam)
    )
    got = within(DecodeSteps(10.0, 0.05, 1.0, [50.0]), 16.0, [10])[0]
    assert got == pytest.approx(math.exp(-lam) * (1 + lam))


def test_the_one_prompt_term_reads_the_sampled_works():
    # works 20 and 80 ms, slack 54: one prompt is absorbed half the time; two prompts
    # (normal sum: mean 100, sd sqrt(2 x 900) = 42.43) with probability ndtr(-46/42.43)
    lam = 9 * 0.010 / 0.95
    p = [math.exp(-lam) * lam**k / math.factorial(k) for k in range(4)]
    two = ndtr((54 - 100) / math.sqrt(2 * 900))
    three = ndtr((54 - 150) / math.sqrt(3 * 900))
    got = within(DecodeSteps(10.0, 0.05, 1.0, [20.0, 80.0]), 16.0, [10])[0]
    assert got == pytest.approx(p[0] + p[1] * 0.5 + p[2] * two + p[3] * three, rel=1e-4)


def test_a_long_answer_averages_the_prompts_out_normally():
    # OSL 3001: 3000 gaps of 10 ms, 1 prompt/s of 50 ms (rho 0.05): lam = 31.6 >
    # LARGE_LAMBDA, S ~ normal(lam x 50, sqrt(lam x 2500)); limit 10.6 ms: slack 1800 ms
    lam = 3000 * 0.010 / 0.95
    assert lam > LARGE_LAMBDA
    want = ndtr((1800 - lam * 50) / math.sqrt(lam * 2500))
    assert within(DecodeSteps(10.0, 0.05, 1.0, [50.0]), 10.6, [3001])[0] == pytest.approx(want)


def test_share_averages_requests_and_quantile_inverts_it():
    works, osls = [20.0, 80.0, 300.0], [1, 5, 40, 200, 1000]
    assert share(DecodeSteps(10.0, 0.1, 2.0, works), 16.0, osls) == pytest.approx(
        within(DecodeSteps(10.0, 0.1, 2.0, works), 16.0, osls).mean()
    )
    q90 = quantile(DecodeSteps(10.0, 0.1, 2.0, works), 0.9, osls)
    multi = [o for o in osls if o >= 2]
    assert share(DecodeSteps(10.0, 0.1, 2.0, works), q90, multi) >= 0.9
    assert share(DecodeSteps(10.0, 0.1, 2.0, works), q90 * 0.99, multi) < 0.9
    assert math.isnan(quantile(DecodeSteps(10.0, 0.1, 2.0, works), 0.9, [1, 1]))
