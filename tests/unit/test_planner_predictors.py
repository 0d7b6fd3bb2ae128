"""Load predictors on synthetic series (issue 8: constant, ramp, step, sine, zeros), the
shared input rules (NaN, leading zeros, never negative), log1p mode, upper quantiles,
parameters and warm-up. Expected values are worked out in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from epp.config.errors import ConfigError
from epp.config.params import parse_params
from epp.planner.core.predictors import (
    LoadPredictors,
    PredictorParams,
    build_load_predictors,
    build_predictor,
    warm_up,
)
from epp.planner.core.predictors.arima import ArimaPredictor, search_order
from epp.planner.core.predictors.constant import ConstantPredictor
from epp.planner.core.predictors.kalman import KalmanPredictor
from epp.planner.offline.traces import IntervalLoad

ALL = ("constant", "kalman", "arima")  # prophet: tests/unit/test_planner_prophet.py


def fed(name: str, values, **kw) -> object:
    p = build_predictor(PredictorParams(load_predictor=name, **kw), interval_s=60.0)
    for v in values:
        p.add(v)
    return p


# -- shared rules ---------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_constant_series_forecasts_the_constant(name):
    p = fed(name, [7.0] * 12)
    assert p.predict() == pytest.approx(7.0, abs=0.05)
    assert p.predict(5) == pytest.approx(7.0, abs=0.1)


@pytest.mark.parametrize("name", ALL)
def test_no_data_forecasts_zero(name):
    p = fed(name, [])
    assert p.predict() == 0.0
    assert p.predict_upper() == 0.0


@pytest.mark.parametrize("name", ALL)
def test_leading_zeros_and_nans_are_skipped_until_traffic(name):
    # 0, NaN(=0), 0 are all leading zeros: dropped. Then 4 values of 10.
    p = fed(name, [0, math.nan, 0, 10, 10, 10, 10])
    assert len(p) >= 1
    # Fewer than 5 accepted points (4): every model is in its constant fallback.
    assert p.predict() == 10.0


def test_zeros_after_traffic_are_kept_and_reset_idle_skip_skips_again():
    p = ConstantPredictor()
    p.add(5)
    p.add(0)  # a quiet interval after traffic: kept
    assert p.predict() == 0.0
    p.add(3)
    p.reset_idle_skip()
    p.add(0)  # skipped again
    assert p.predict() == 3.0
    p.add(math.nan)  # NaN is 0: skipped too
    assert p.predict() == 3.0


@pytest.mark.parametrize("name", ALL)
def test_fallback_is_the_last_value_before_min_points(name):
    p = fed(name, [1, 2, 3, 4])  # 4 points < 5 (arima, kalman); constant needs 1
    assert p.predict() == 4.0


def test_negative_input_counts_as_zero():
    p = ConstantPredictor()
    p.add(3)
    p.add(-2)
    assert p.predict() == 0.0


@pytest.mark.parametrize("name", ALL)
def test_never_negative_on_a_falling_series(name):
    # 100, 80, ..., 0: a trend model extrapolates below zero one step on (Dynamo #14493).
    p = fed(name, [100.0 - 20 * i for i in range(6)])
    for h in (1, 3, 10):
        assert p.predict(h) >= 0.0
        assert p.predict_upper(h, 0.9) >= p.predict(h)


@pytest.mark.parametrize("name", ALL)
def test_bad_horizon_and_quantile_are_errors(name):
    p = fed(name, [1.0] * 6)
    with pytest.raises(ValueError, match="horizon"):
        p.predict(0)
    with pytest.raises(ValueError, match="q must be"):
        p.predict_upper(1, 1.0)


def test_infinite_input_is_an_error():
    with pytest.raises(ValueError, match="finite"):
        ConstantPredictor().add(math.inf)


# -- kalman ----------------------------------------------------------------------
def test_kalman_follows_a_ramp_and_extrapolates_the_trend():
    # A clean ramp 10, 12, ..., 48: the local-linear-trend filter locks on to slope 2,
    # so one step after 48 is about 50 and three steps about 54.
    p = fed("kalman", [10 + 2 * i for i in range(20)])
    assert p.predict() == pytest.approx(50.0, abs=0.5)
    assert p.predict(3) == pytest.approx(54.0, abs=1.0)
    assert ConstantPredictor().predict() == 0.0  # (the baseline would say 48)


def test_kalman_honours_min_points():
    # SLA-v1 ignored kalman-min-points: with a ramp 10, 20, 30 the filter alone would
    # extrapolate above 30. With min_points 5 and 3 points it returns the last value.
    p = KalmanPredictor(min_points=5)
    for v in (10, 20, 30):
        p.add(v)
    assert p.predict() == 30.0
    p1 = KalmanPredictor(min_points=1)
    for v in (10, 20, 30):
        p1.add(v)
    assert p1.predict() > 30.0


def test_kalman_step_moves_towards_the_new_level():
    # 20 points at 10 then 5 at 50: the forecast has left 10 and heads for 50.
    p = fed("kalman", [10.0] * 20 + [50.0] * 5)
    assert 40.0 < p.predict() < 60.0


def test_kalman_upper_quantile_widens_with_horizon_and_q():
    p = fed("kalman", [10 + (i % 3) for i in range(15)])
    assert p.predict_upper(1, 0.9) > p.predict(1)
    assert p.predict_upper(1, 0.99) > p.predict_upper(1, 0.9)
    assert p.predict_upper(4, 0.9) - p.predict(4) > p.predict_upper(1, 0.9) - p.predict(1)


def test_kalman_predict_does_not_change_the_state():
    p = fed("kalman", [5, 7, 9, 11, 13, 15])
    first = p.predict()
    p.predict(5)
    p.predict_upper(3, 0.95)
    assert p.predict() == first


def test_kalman_log1p_mode_forecasts_in_value_space():
    # Exponential growth 2^i: in log1p space close to a straight line, so the
    # log1p forecast lands near 2^12 = 4096 (within 20 %), never negative.
    p = fed("kalman", [2.0**i for i in range(12)], load_predictor_log1p=True)
    assert p.predict() == pytest.approx(4096, rel=0.2)


# -- arima -----------------------------------------------------------------------
def test_arima_all_identical_values_forecast_that_value():
    p = ArimaPredictor()
    for _ in range(8):
        p.add(42.0)
    assert p.predict() == 42.0
    assert p.order is None  # no model was fitted


def test_arima_follows_a_ramp():
    # A ramp of slope 2 with a period-3 wiggle (+0.5, -1, +0.5), i = 0..15; the next
    # value (i = 16, 16 % 3 = 1) is 10 + 32 - 1 = 41. The constant fallback would say 40.5.
    wiggle = (0.5, -1.0, 0.5)
    p = fed("arima", [10 + 2 * i + wiggle[i % 3] for i in range(16)])
    assert p.predict() == pytest.approx(41.0, abs=1.0)


def test_arima_on_a_sine_beats_the_last_value():
    # 10 + 5 sin(i/2): an AR(2) reproduces a sampled sine exactly; the last value lags.
    series = [10 + 5 * math.sin(i / 2) for i in range(31)]
    p = fed("arima", series[:-1])
    truth = series[-1]
    assert abs(p.predict() - truth) < abs(series[-2] - truth)


def test_arima_collapse_switches_to_log1p():
    # White noise around 20 (seeded normal draws, rounded) has no AR/MA structure: the
    # raw search picks (0, 0, 0) (checked first), so Dynamo's rule refits in log1p space
    # and stays there.
    noise = [21, 18, 19, 13, 25, 23, 19, 22, 21, 18, 23, 19]
    _, order, had_choice = search_order(np.array(noise, dtype=float))
    assert order == (0, 0, 0) and had_choice
    p = ArimaPredictor()
    for v in noise:
        p.add(v)
    assert p.predict() > 0
    assert p.log_space


def test_arima_guards_against_fitting_big_orders_on_few_points():
    # 5 points at d = 0: (0,0,0) has 2 parameters (mean, variance), 2 x 2 <= 5; an
    # AR(1) has 3, 2 x 3 > 5. So only (0,0,0) is tried, and with no choice offered the
    # collapse rule does not fire (the model stays in raw space).
    p = ArimaPredictor()
    for v in [108, 100, 108, 111, 105]:
        p.add(v)
    # mean (108 + 100 + 108 + 111 + 105) / 5 = 106.4
    assert p.predict() == pytest.approx(106.4, abs=0.5)
    assert p.order == (0, 0, 0) and not p.log_space


def test_arima_log1p_asked_for():
    p = ArimaPredictor(log1p=True)
    for v in [5, 9, 7, 12, 8, 10, 6]:
        p.add(v)
    assert p.log_space
    assert 0 < p.predict() < 30


# -- params, LoadPredictors, warm-up ---------------------------------------------
def test_params_parse_dynamo_flag_names_in_kebab_case():
    raw = {"load-predictor": "kalman", "kalman-q-level": 2, "kalman-min-points": 3}
    p = parse_params(PredictorParams, raw, "planner", style="kebab")
    assert (p.load_predictor, p.kalman_q_level, p.kalman_min_points) == ("kalman", 2.0, 3)


def test_params_reject_an_unknown_model():
    with pytest.raises(ConfigError, match="load-predictor: must be one of"):
        parse_params(PredictorParams, {"load-predictor": "lstm"}, "planner", style="kebab")


def test_built_kalman_takes_its_params():
    # min_points 2: two points are enough to extrapolate 10, 20 -> above 20.
    p = fed("kalman", [10, 20], kalman_min_points=2)
    assert p.predict() > 20


def test_load_predictors_and_warm_up():
    lp = build_load_predictors(PredictorParams(load_predictor="constant"), 60.0)
    buckets = [
        IntervalLoad(0, 0, math.nan, math.nan),  # leading idle: skipped
        IntervalLoad(60, 12, 1000.0, 200.0),
        IntervalLoad(120, 0, math.nan, math.nan),  # idle in the middle: kept as 0
        IntervalLoad(180, 30, 1500.0, 100.0),
    ]
    assert warm_up(lp, buckets) == 4
    got = lp.predict()
    assert (got.requests, got.isl, got.osl) == (30.0, 1500.0, 100.0)
    assert got.rate == pytest.approx(30 / 60)
    lp.add(0, math.nan, math.nan)  # post-deploy idle: skipped after warm-up's reset
    assert lp.predict().requests == 30.0
    assert isinstance(lp, LoadPredictors)


def test_load_predictors_reject_a_bad_interval():
    with pytest.raises(ValueError, match="interval_s"):
        build_load_predictors(PredictorParams(), 0.0)


def test_idle_interval_holds_the_length_forecasts_unless_dynamo_rule():
    # A burst (40 requests, ISL 2000, OSL 300), then a quiet interval (0, NaN, NaN).
    held = build_load_predictors(PredictorParams(load_predictor="constant"), 60.0)
    dynamo = build_load_predictors(
        PredictorParams(load_predictor="constant", hold_idle_lengths=False), 60.0
    )
    for lp in (held, dynamo):
        lp.add(40, 2000.0, 300.0)
        lp.add(0, math.nan, math.nan)
    # Both forecast 0 requests; only the held one still knows what a request looks like.
    assert held.predict().requests == dynamo.predict().requests == 0.0
    assert (held.predict().isl, held.predict().osl) == (2000.0, 300.0)
    assert (dynamo.predict().isl, dynamo.predict().osl) == (0.0, 0.0)
