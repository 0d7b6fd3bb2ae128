"""Load predictors: forecast next intervals' request count, mean ISL and mean OSL.

PURE. The SLA modes (this project's and the Dynamo-faithful one) hold a
`LoadPredictors` (one model per quantity, as Dynamo's planner holds three) built by
`build_load_predictors(params, interval_s)`, feed it one value per interval with
`add(requests, isl, osl)` and read `predict(horizon)` / `predict_upper(horizon, q)`.

Models (`load-predictor`): `constant` (last value), `kalman` (local linear trend,
numpy), `arima` (statsmodels; a small AIC search), `prophet` (optional extra
`epp[prophet]`, imported only when chosen). Parameter names are Dynamo SLA-v1's flags
without `--` (reference dynamo-planner.md §7.1), kebab-case in the planner file.

Default: `constant`, not Dynamo's `arima`. Dynamo #14238 asks whether ARIMA was ever
validated against `constant`; the benchmark (docs/BENCHMARKS.md@a73a134 "Planner: load
predictors") answers no better: on the Azure trace constant is the most accurate at 60
and 180 s intervals, on Mooncake every model is within 2 points of MAPE of it, on a
bursty trace none foresees a burst (about a fifth of intervals are under-predicted by
every model), and ARIMA costs ~10^5 times more per step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from epp.config.params import param
from epp.planner.core.predictors.base import BufferedPredictor, Predictor
from epp.planner.core.predictors.constant import ConstantPredictor
from epp.planner.core.types import PredictedLoad

PREDICTOR_NAMES = ("constant", "arima", "kalman", "prophet")


@dataclass(frozen=True)
class PredictorParams:
    load_predictor: str = param(
        "constant",
        choices=PREDICTOR_NAMES,
        doc="constant | arima | kalman | prophet (Dynamo's default is arima; see "
        "docs/BENCHMARKS.md 'Planner: load predictors' for why constant)",
    )
    load_predictor_log1p: bool = param(
        False, doc="model log1p(value) instead of the value (arima, kalman, prophet)"
    )
    prophet_window_size: int = param(
        50, min=5, doc="prophet refits on the last N intervals each step (bounds its cost)"
    )
    arima_window_size: int = param(
        100,
        min=5,
        doc="arima fits on the last N intervals (not a Dynamo flag: pmdarima's update "
        "grew without bound)",
    )
    kalman_q_level: float = param(1.0, min=0.0, doc="process noise of the level")
    kalman_q_trend: float = param(0.1, min=0.0, doc="process noise of the trend")
    kalman_r: float = param(10.0, min=0.0, doc="measurement noise")
    kalman_min_points: int = param(
        5, min=1, doc="kalman forecasts the last value until it has this many points"
    )
    hold_idle_lengths: bool = param(
        True,
        doc="an interval without requests leaves the ISL/OSL models alone (false: feed 0, "
        "as Dynamo does; then a burst after a quiet minute is forecast with ISL 0)",
    )


def build_predictor(params: PredictorParams, *, interval_s: float = 180.0) -> Predictor:
    """One model as `params.load_predictor` names it. `interval_s` (the adjustment
    interval) gives Prophet its timestamps, so its daily/weekly seasonality is in real
    time; the other models count intervals."""
    name = params.load_predictor
    log1p = params.load_predictor_log1p
    if name == "constant":
        return ConstantPredictor()
    if name == "kalman":
        from epp.planner.core.predictors.kalman import KalmanPredictor

        return KalmanPredictor(
            q_level=params.kalman_q_level,
            q_trend=params.kalman_q_trend,
            r=params.kalman_r,
            min_points=params.kalman_min_points,
            log1p=log1p,
        )
    if name == "arima":
        from epp.planner.core.predictors.arima import ArimaPredictor

        return ArimaPredictor(log1p=log1p, window=params.arima_window_size)
    if name == "prophet":
        from epp.planner.core.predictors.prophet import ProphetPredictor

        return ProphetPredictor(
            log1p=log1p, window=params.prophet_window_size, interval_s=interval_s
        )
    raise ValueError(f"load-predictor must be one of {', '.join(PREDICTOR_NAMES)}; got {name!r}")


@dataclass(frozen=True, slots=True)
class LoadPredictors:
    """The three forecasts the SLA formulas need, one model each (Dynamo SLA-v1
    creates three predictors of the same class, reference §1.1)."""

    requests: Predictor
    isl: Predictor
    osl: Predictor
    interval_s: float
    hold_idle_lengths: bool = True

    def add(self, requests: float, isl: float, osl: float) -> None:
        """One interval: its request count and mean ISL/OSL (NaN when it had no
        request). With `hold_idle_lengths`, an interval without requests (count 0 or
        NaN lengths) is not fed to the ISL/OSL models: no request is no evidence about
        lengths. Dynamo feeds NaN as 0 (reference §1.2), so after a quiet interval it
        forecasts ISL 0 and sizes prefill for nothing; on the bursty trace that puts
        the ISL forecast's MAPE at 44 % against 6 % (docs/BENCHMARKS.md)."""
        self.requests.add(requests)
        idle = not requests or math.isnan(isl) or math.isnan(osl)
        if self.hold_idle_lengths and idle:
            return
        self.isl.add(isl)
        self.osl.add(osl)

    def predict(self, horizon: int = 1) -> PredictedLoad:
        return PredictedLoad(
            requests=self.requests.predict(horizon),
            isl=self.isl.predict(horizon),
            osl=self.osl.predict(horizon),
            horizon_s=self.interval_s,
        )

    def predict_upper(self, horizon: int = 1, q: float = 0.9) -> PredictedLoad:
        """Each quantity at its own upper quantile `q` (a conservative combination)."""
        return PredictedLoad(
            requests=self.requests.predict_upper(horizon, q),
            isl=self.isl.predict_upper(horizon, q),
            osl=self.osl.predict_upper(horizon, q),
            horizon_s=self.interval_s,
        )

    def reset_idle_skip(self) -> None:
        self.requests.reset_idle_skip()
        self.isl.reset_idle_skip()
        self.osl.reset_idle_skip()


def build_load_predictors(params: PredictorParams, interval_s: float) -> LoadPredictors:
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s}")
    return LoadPredictors(
        requests=build_predictor(params, interval_s=interval_s),
        isl=build_predictor(params, interval_s=interval_s),
        osl=build_predictor(params, interval_s=interval_s),
        interval_s=interval_s,
        hold_idle_lengths=params.hold_idle_lengths,
    )


class IntervalValues(Protocol):
    """What warm-up reads from one bucket (`epp.planner.offline.traces.IntervalLoad`)."""

    count: int
    mean_isl: float
    mean_osl: float


def warm_up(predictors: LoadPredictors, buckets: Iterable[IntervalValues]) -> int:
    """Feed a trace's per-interval load (`traces.bucket(arrivals, interval_s)`, with
    the same interval as the planner's), then `reset_idle_skip()` so the idle
    intervals right after deployment are skipped again (Dynamo SLA-v1 warm-up,
    reference §2.6). Returns the number of intervals fed."""
    n = 0
    for b in buckets:
        predictors.add(b.count, b.mean_isl, b.mean_osl)
        n += 1
    predictors.reset_idle_skip()
    return n


__all__ = [
    "PREDICTOR_NAMES",
    "BufferedPredictor",
    "ConstantPredictor",
    "LoadPredictors",
    "Predictor",
    "PredictorParams",
    "build_load_predictors",
    "build_predictor",
    "warm_up",
]
