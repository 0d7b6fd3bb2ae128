"""Constant predictor: the next interval looks like the last one (Dynamo SLA-v1
`ConstantPredictor`, reference §2.2). The baseline the other models must beat: on the
benchmark traces it is also the one to beat in practice (docs/BENCHMARKS.md@a73a134
"Planner: load predictors").

Beyond Dynamo, an upper bound from the traffic's own history (`history` intervals,
0: none): the constant forecast's error `horizon` intervals ahead is the ratio
x[t + horizon] / x[t] the load showed over the last `history` intervals, so its upper
quantile q is the last value times that ratio's empirical q-quantile (an empirical
prediction interval: no distribution assumed, the spread is the one the traffic had).
A steady load gives ratios near 1 and no headroom; a load that steps up every few
intervals (ServeGen's clients move in 10-minute windows) gives the step it usually
takes over the lead time, provisioned before the step comes instead of one interval
after it.
"""

from __future__ import annotations

import math

from epp.planner.core.predictors.base import BufferedPredictor

MIN_RATIOS = 10  # fewer ratios than this in the history: no spread, the point forecast


class ConstantPredictor(BufferedPredictor):
    min_points = 1

    def __init__(self, history: int = 0) -> None:
        if history < 0:
            raise ValueError(f"history must be >= 0 intervals, got {history}")
        super().__init__(window=max(1, history))
        self.history = history

    def _forecast(self, horizon: int) -> float:
        return self.last()

    def _forecast_upper(self, horizon: int, q: float) -> float:
        values = self._buffer
        last = self.last()
        if self.history <= horizon or len(values) <= horizon:
            return last
        seen = list(values)
        ratios = [seen[i + horizon] / seen[i] for i in range(len(seen) - horizon) if seen[i] > 0]
        if len(ratios) < MIN_RATIOS:
            return last
        ratios.sort()
        return last * ratios[max(0, math.ceil(q * len(ratios)) - 1)]
