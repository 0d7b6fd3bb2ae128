"""Constant predictor: the next interval looks like the last one (Dynamo SLA-v1
`ConstantPredictor`, reference §2.2). The baseline the other models must beat: on the
benchmark traces it is also the one to beat in practice (docs/BENCHMARKS.md@a73a134
"Planner: load predictors")."""

from __future__ import annotations

from epp.planner.core.predictors.base import BufferedPredictor


class ConstantPredictor(BufferedPredictor):
    min_points = 1

    def __init__(self) -> None:
        super().__init__(window=1)

    def _forecast(self, horizon: int) -> float:
        return self.last()
