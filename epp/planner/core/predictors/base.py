"""The load-predictor interface, and the one copy of Dynamo's input rules.

A predictor is fed one value per adjustment interval (a request count, a mean ISL, a
mean OSL) and forecasts the value `horizon` intervals ahead. The SLA planner keeps
three of them (`LoadPredictors` in `__init__.py`).

Input rules (Dynamo SLA-v1 `BasePredictor.add_data_point`, reference
dynamo-planner.md §2.1), kept in `BufferedPredictor` so every model shares them:

- NaN becomes 0 (an interval without requests has no mean ISL).
- Leading zeros are skipped: a 0 is dropped until the first non-zero value since the
  last `reset_idle_skip()`, so the idle minutes before traffic starts (or after a
  warm-up) do not drag a forecast to zero. After that, zeros are kept: a quiet
  interval in the middle of traffic is information.
- Until a model has `min_points` values it forecasts the last value (the "constant
  fallback"); with no value at all it forecasts 0.

Beyond Dynamo: a forecast is never negative (Dynamo #14493: raw-mode Kalman went
negative on declining traffic), negative inputs are clamped to 0 (loads are counts and
lengths; Dynamo's ARIMA clamped its raw buffer the same way), and `predict_upper`
gives an upper prediction quantile where the model has one, so the SLA mode can
provision to it rather than to the mean (reference §10).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol, runtime_checkable


@runtime_checkable
class Predictor(Protocol):
    def add(self, value: float) -> None:
        """One interval's value. NaN counts as 0; leading zeros are skipped."""

    def predict(self, horizon: int = 1) -> float:
        """The value `horizon` intervals ahead (1 = the next interval); never negative."""

    def predict_upper(self, horizon: int = 1, q: float = 0.9) -> float:
        """An upper prediction bound: the value the next-`horizon` interval stays at or
        below with probability `q` under the model; never below `predict(horizon)`.
        Models without a spread (constant) return the point forecast."""

    def reset_idle_skip(self) -> None:
        """Skip zeros again until the next non-zero value (after a warm-up)."""


def check_horizon(horizon: int) -> None:
    if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1 (intervals ahead), got {horizon!r}")


def check_quantile(q: float) -> None:
    if not 0.5 <= q < 1.0:
        raise ValueError(f"q must be in [0.5, 1) (an upper quantile), got {q!r}")


class BufferedPredictor:
    """Shared input handling: the NaN / negative / leading-zero rule, a bounded buffer,
    the constant fallback and the never-negative clamp. A model implements
    `_forecast(horizon)` (and optionally `_forecast_upper`, `_observe`)."""

    min_points: int = 1

    def __init__(self, *, window: int | None = None) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._buffer: deque[float] = deque(maxlen=window)
        self._skipping = True
        self._count = 0  # values accepted since creation (the buffer may hold fewer)

    # -- input ------------------------------------------------------------------
    def add(self, value: float) -> None:
        v = float(value)
        if math.isnan(v) or v < 0.0:
            v = 0.0
        if math.isinf(v):
            raise ValueError("a load value must be finite, got inf")
        if v == 0.0 and self._skipping:
            return
        self._skipping = False
        self._buffer.append(v)
        self._count += 1
        self._observe(v)

    def reset_idle_skip(self) -> None:
        self._skipping = True

    # -- output -----------------------------------------------------------------
    def predict(self, horizon: int = 1) -> float:
        check_horizon(horizon)
        if self._count < self.min_points:
            return self.last()
        return _clamp(self._forecast(horizon))

    def predict_upper(self, horizon: int = 1, q: float = 0.9) -> float:
        check_horizon(horizon)
        check_quantile(q)
        if self._count < self.min_points:
            return self.last()
        return max(self.predict(horizon), _clamp(self._forecast_upper(horizon, q)))

    def last(self) -> float:
        """The last value accepted, 0 before any (Dynamo's `get_last_value`)."""
        return self._buffer[-1] if self._buffer else 0.0

    def __len__(self) -> int:
        return len(self._buffer)

    # -- model hooks --------------------------------------------------------------
    def _observe(self, value: float) -> None:
        """Called once per accepted value (after buffering): incremental models update
        their state here."""

    def _forecast(self, horizon: int) -> float:
        raise NotImplementedError

    def _forecast_upper(self, horizon: int, q: float) -> float:
        return self._forecast(horizon)


def _clamp(x: float) -> float:
    """Never negative, never NaN (a failed model must not poison the replica formula)."""
    return x if x > 0.0 else 0.0  # NaN > 0 is False -> 0.0
