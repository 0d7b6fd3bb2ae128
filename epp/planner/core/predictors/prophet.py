"""Prophet predictor (Dynamo SLA-v1 `ProphetPredictor`, reference dynamo-planner.md
§2.5). Optional: `pip install 'epp[prophet]'` (Prophet brings cmdstan, ~100 MB);
imported only when `load-predictor: prophet` is chosen, and its absence is a
ConfigError naming the extra.

As Dynamo: at least 5 points (constant fallback before), a window of the last
`prophet-window-size` (50) values, a fresh `Prophet()` with default settings fitted on
every new value, optional log1p space, never negative. Timestamps are synthetic,
`2024-01-01 + step · interval_s`, so daily/weekly seasonality is in real time.

Fixed against SLA-v1: the forecast is at `(last_step + horizon) · interval_s`; SLA-v1
put it at `curr_step` *seconds*, i.e. in the past of its own history. One fit serves
every `predict`/`predict_upper` call until the next value. `predict_upper` is Prophet's
`yhat_upper` at `interval_width = 2q - 1`: Prophet draws it by Monte-Carlo, so it varies
slightly from run to run; the point forecast is deterministic.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from epp.config.errors import ConfigError
from epp.planner.core.predictors.base import BufferedPredictor

EPOCH = "2024-01-01"


def _import_prophet() -> tuple[Any, Any]:
    try:
        import cmdstanpy
        import pandas as pd
        from prophet import Prophet
    except ImportError as e:
        raise ConfigError(
            "load-predictor",
            f"prophet needs the optional extra: pip install 'epp[prophet]' ({e})",
        ) from None
    cmdstanpy.disable_logging()  # one INFO line per fit otherwise
    return Prophet, pd


class ProphetPredictor(BufferedPredictor):
    min_points = 5

    def __init__(self, *, log1p: bool = False, window: int = 50, interval_s: float = 180.0):
        if window < self.min_points:
            raise ValueError(f"prophet-window-size must be >= {self.min_points}, got {window}")
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        super().__init__(window=window)
        self._prophet, self._pd = _import_prophet()
        self._log = log1p
        self._interval_s = interval_s
        self._model: Any = None

    def _observe(self, value: float) -> None:
        self._model = None  # refit on the next forecast

    def _steps(self) -> range:
        """Step index of each buffered value (counting every value ever accepted)."""
        return range(self._count - len(self._buffer), self._count)

    def _ds(self, steps: Any) -> Any:
        return self._pd.Timestamp(EPOCH) + self._pd.to_timedelta(
            [s * self._interval_s for s in steps], unit="s"
        )

    def _fit(self) -> Any:
        if self._model is None:
            y = [math.log1p(v) if self._log else v for v in self._buffer]
            frame = self._pd.DataFrame({"ds": self._ds(self._steps()), "y": y})
            model = self._prophet()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pandas deprecations inside Prophet
                model.fit(frame)
            self._model = model
        return self._model

    def _predict_row(self, horizon: int, q: float | None) -> tuple[float, float]:
        try:
            model = self._fit()
            model.interval_width = 0.8 if q is None else 2 * q - 1
            future = self._pd.DataFrame({"ds": self._ds([self._count - 1 + horizon])})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                row = model.predict(future).iloc[0]
            mean, upper = float(row["yhat"]), float(row["yhat_upper"])
        except (ValueError, RuntimeError, KeyError):
            return self.last(), self.last()
        back = math.expm1 if self._log else float
        return back(mean), back(upper)

    def _forecast(self, horizon: int) -> float:
        return self._predict_row(horizon, None)[0]

    def _forecast_upper(self, horizon: int, q: float) -> float:
        return self._predict_row(horizon, q)[1]
