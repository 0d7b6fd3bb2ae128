"""The Prophet load predictor (optional extra `epp[prophet]`; in the dev extras so this
runs): the future timestamp Dynamo SLA-v1 got wrong, the fallback, and the error when
the extra is missing."""

from __future__ import annotations

import sys

import pytest

from epp.config.errors import ConfigError
from epp.planner.core.predictors import PredictorParams, build_predictor


def prophet_fed(values, **kw):
    p = build_predictor(PredictorParams(load_predictor="prophet", **kw), interval_s=60.0)
    for v in values:
        p.add(v)
    return p


def test_prophet_forecasts_the_next_intervals_of_a_ramp():
    # 10, 11, ..., 39 one minute apart: Prophet's piecewise-linear trend gives 40 one
    # interval on and 42 three on. SLA-v1 put the future at `curr_step` seconds (30 s
    # after the start, inside the history), which would have forecast about 10.
    p = prophet_fed([10.0 + i for i in range(30)])
    assert p.predict() == pytest.approx(40.0, abs=1.0)
    assert p.predict(3) == pytest.approx(42.0, abs=1.5)
    assert p.predict_upper(1, 0.9) >= p.predict()


def test_prophet_falls_back_to_the_last_value_and_keeps_its_window():
    assert prophet_fed([3, 4, 5, 6]).predict() == 6.0  # 4 < 5 points
    p = prophet_fed([1.0] * 40 + [float(v) for v in range(100, 110)], prophet_window_size=10)
    assert len(p) == 10  # only the last 10 values are fitted: the ramp 100..109
    assert p.predict() == pytest.approx(110.0, abs=2.0)


def test_prophet_never_negative():
    p = prophet_fed([100.0 - 20 * i for i in range(6)])  # 100 .. 0, trend -20/interval
    assert p.predict() == 0.0


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "prophet", None)  # `import prophet` now fails
    with pytest.raises(ConfigError, match=r"pip install 'epp\[prophet\]'"):
        build_predictor(PredictorParams(load_predictor="prophet"))
