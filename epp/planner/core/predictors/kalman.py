"""Kalman predictor: a local-linear-trend filter in numpy (Dynamo SLA-v1
`KalmanPredictor`, #5554, which used filterpy; reference dynamo-planner.md §2.4).

State `x = [level, trend]`, `F = [[1, 1], [0, 1]]`, `H = [[1, 0]]`, `P0 = 1000·I`,
`R = max(1e-9, r)`, `Q = diag(max(1e-12, q_level), max(1e-12, q_trend))`; defaults
q_level 1.0, q_trend 0.1, r 10.0, min_points 5. The first value sets `x = [z, 0]`;
each later value runs predict then update (what Dynamo's cached-predict dance amounts
to). Optional log1p: the filter runs on `log1p(value)`, forecasts go back by `expm1`.

Fixed against SLA-v1: `min_points` is honoured (SLA-v1 stored it but forecast from
the second point), forecasts are clamped at 0 in both modes (#14493), forecasting
does not mutate the filter (so calling `predict` twice, or for several horizons, is
safe), and `predict_upper` uses the forecast variance `(F^h P F^h' + ΣQ)[0,0] + R`
under a normal model.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from epp.planner.core.predictors.base import BufferedPredictor

_F = np.array([[1.0, 1.0], [0.0, 1.0]])
_H = np.array([1.0, 0.0])


class KalmanPredictor(BufferedPredictor):
    def __init__(
        self,
        *,
        q_level: float = 1.0,
        q_trend: float = 0.1,
        r: float = 10.0,
        min_points: int = 5,
        log1p: bool = False,
    ) -> None:
        super().__init__(window=1)  # the state carries the history
        if min_points < 1:
            raise ValueError(f"kalman-min-points must be >= 1, got {min_points}")
        self.min_points = min_points
        self._log1p = log1p
        self._q = np.diag([max(1e-12, q_level), max(1e-12, q_trend)])
        self._r = max(1e-9, r)
        self._x: np.ndarray | None = None
        self._p = 1000.0 * np.eye(2)

    def _observe(self, value: float) -> None:
        z = math.log1p(value) if self._log1p else value
        if self._x is None:
            self._x = np.array([z, 0.0])
            return
        x = _F @ self._x
        p = _F @ self._p @ _F.T + self._q
        s = float(_H @ p @ _H) + self._r
        k = (p @ _H) / s
        self._x = x + k * (z - float(_H @ x))
        self._p = p - np.outer(k, _H @ p)

    def _moments(self, horizon: int) -> tuple[float, float]:
        """Mean and variance of the observation `horizon` steps ahead, model space."""
        assert self._x is not None
        x, p = self._x, self._p
        for _ in range(horizon):
            x = _F @ x
            p = _F @ p @ _F.T + self._q
        return float(x[0]), float(p[0, 0]) + self._r

    def _back(self, z: float) -> float:
        return math.expm1(z) if self._log1p else z

    def _forecast(self, horizon: int) -> float:
        return self._back(self._moments(horizon)[0])

    def _forecast_upper(self, horizon: int, q: float) -> float:
        mean, var = self._moments(horizon)
        return self._back(mean + NormalDist().inv_cdf(q) * math.sqrt(var))
