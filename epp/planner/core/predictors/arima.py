"""ARIMA predictor on statsmodels (Dynamo SLA-v1 `ARIMAPredictor` used pmdarima's
`auto_arima`; reference dynamo-planner.md §2.3).

Kept from Dynamo: at least 5 points (the constant fallback before), all-identical
values forecast that value (a fitted model can forecast 0 on constant data), optional
log1p space, and the collapse rule: if the search picks `(0,d,0)` in raw space (no AR
or MA term: a mean or a random walk), it searches again on `log1p(values)` and stays in
log space if that fits. Any model failure forecasts the last value. Never negative.

Different from pmdarima's `auto_arima` (not a dependency here: unmaintained, pins old
numpy), and why:
- order search: `d` by repeated KPSS tests (alpha 0.05, `d <= 2`, as pmdarima's default
  `test='kpss'`), then an exhaustive AIC grid over `p, q in {0, 1, 2}` instead of
  pmdarima's stepwise walk up to 5; AIC is only compared at one `d`, where it is
  comparable. Intercept for `d = 0`, drift for `d = 1`, none for `d = 2` (pmdarima's
  `with_intercept='auto'`).
- sample-size guard: an order is tried only if its estimated parameters (AR + MA +
  trend + variance) are at most half the points left after differencing. On 5 points
  that leaves `(0,d,0)`: an ARMA(2,1) fitted on 5 points forecast 23 requests where
  110 came (Mooncake, 30 s buckets). The collapse rule applies only when the grid
  offered an AR or MA term, otherwise every model would go log at its 5th point.
- each new value refits the chosen order's parameters, warm-started from the last
  ones (what pmdarima's `update` does, a few optimiser steps); the order is searched
  again every `RESEARCH_EVERY` values, or sooner while the history is short (when it
  has doubled since the last search), so it follows a changing trace where Dynamo kept
  the order chosen on its first 5 points forever.
- cost bound: fits use the last `window` values (default 100; pmdarima's `update`
  kept every point forever).
- upper quantile: `get_forecast(h).conf_int`, the model's own prediction interval.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from statsmodels.tsa.arima.model import ARIMA
from statsmodels.tsa.stattools import kpss

from epp.planner.core.predictors.base import BufferedPredictor

RESEARCH_EVERY = 10
MAX_PQ = 2
MAX_D = 2
_TREND = {0: "c", 1: "t", 2: "n"}


class ArimaPredictor(BufferedPredictor):
    min_points = 5

    def __init__(self, *, log1p: bool = False, window: int = 100) -> None:
        if window < self.min_points:
            raise ValueError(f"arima-window-size must be >= {self.min_points}, got {window}")
        super().__init__(window=window)
        self._log = log1p
        self._res = None  # statsmodels ARIMAResults
        self.order: tuple[int, int, int] | None = None
        self._stale = False  # values arrived since the last fit
        self._since_search = 0
        self._searched_at = 0  # points in the buffer at the last search

    @property
    def log_space(self) -> bool:
        """True when the model runs on log1p(values) (asked for, or after a collapse)."""
        return self._log

    def _observe(self, value: float) -> None:
        self._stale = True
        self._since_search += 1

    def _forecast(self, horizon: int) -> float:
        if _all_equal(self._buffer):
            return self._buffer[-1]
        try:
            mean, _ = self._predict(horizon, None)
        except (ValueError, np.linalg.LinAlgError, IndexError):
            return self.last()
        return mean

    def _forecast_upper(self, horizon: int, q: float) -> float:
        if _all_equal(self._buffer):
            return self._buffer[-1]
        try:
            _, upper = self._predict(horizon, q)
        except (ValueError, np.linalg.LinAlgError, IndexError):
            return self.last()
        return upper

    # -- fitting ------------------------------------------------------------------
    def _space(self, values: Sequence[float]) -> np.ndarray:
        a = np.asarray(values, dtype=float)
        return np.log1p(a) if self._log else a

    def _back(self, z: float) -> float:
        return math.expm1(z) if self._log else z

    def _refresh(self) -> None:
        if not self._stale and self._res is not None:
            return
        due = min(RESEARCH_EVERY, max(1, self._searched_at))
        if self._res is None or self._since_search >= due:
            self._search()
        else:
            assert self.order is not None
            self._res = fit(self._space(self._buffer), self.order, self._res.params)
        self._stale = False

    def _search(self) -> None:
        values = list(self._buffer)
        res, order, had_choice = search_order(self._space(values))
        if not self._log and had_choice and order[0] == 0 and order[2] == 0:
            try:
                res, order, _ = search_order(np.log1p(np.asarray(values)))
                self._log = True
            except ValueError:
                pass  # stay raw, as Dynamo does when the log refit fails
        self._res, self.order = res, order
        self._since_search = 0
        self._searched_at = len(values)

    def _predict(self, horizon: int, q: float | None) -> tuple[float, float]:
        self._refresh()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fc = self._res.get_forecast(horizon)
            mean = float(np.asarray(fc.predicted_mean)[-1])
            upper = mean
            if q is not None:
                upper = float(np.asarray(fc.conf_int(alpha=2 * (1 - q)))[-1, 1])
        if not (math.isfinite(mean) and math.isfinite(upper)):
            raise ValueError("non-finite forecast")
        return self._back(mean), self._back(upper)


def choose_d(y: np.ndarray) -> int:
    """Differences until KPSS no longer rejects level stationarity at 5 % (pmdarima's
    `ndiffs(test='kpss')`); a series too short for the test is taken as stationary."""
    d = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while d < MAX_D:
            z = np.diff(y, n=d) if d else y
            if len(z) < 4 or np.ptp(z) == 0:
                break
            try:
                p_value = kpss(z, regression="c", nlags="auto")[1]
            except (ValueError, OverflowError, ZeroDivisionError):
                break
            if p_value >= 0.05:
                break
            d += 1
    return d


def fit(y: np.ndarray, order: tuple[int, int, int], start_params=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ARIMA(y, order=order, trend=_TREND[order[1]]).fit(start_params=start_params)


def n_params(p: int, d: int, q: int) -> int:
    """AR + MA + trend (none at d = 2) + the innovation variance."""
    return p + q + (1 if d < 2 else 0) + 1


def search_order(y: np.ndarray):
    """The lowest-AIC ARIMA(p, d, q), p, q <= MAX_PQ, at the KPSS-chosen d, among the
    orders with at most half as many parameters as differenced points. Returns the
    fitted model, its order and whether any AR/MA order was allowed at all."""
    d = choose_d(y)
    orders = [
        (p, d, q)
        for p in range(MAX_PQ + 1)
        for q in range(MAX_PQ + 1)
        if 2 * n_params(p, d, q) <= len(y) - d
    ]
    best = None
    for order in orders or [(0, d, 0)]:
        try:
            res = fit(y, order)
        except (ValueError, np.linalg.LinAlgError, IndexError):
            continue
        if math.isfinite(res.aic) and (best is None or res.aic < best[0].aic):
            best = (res, order)
    if best is None:
        raise ValueError("no ARIMA order could be fitted")
    return best[0], best[1], len(orders) > 1


def _all_equal(values: Sequence[float]) -> bool:
    return len(values) > 0 and all(v == values[0] for v in values)
