"""`weighted-random-picker`: scores are lottery weights (upstream's A-Res sampling).

Each endpoint draws key = U^(1/score); the k largest keys win, which samples without
replacement in proportion to score. Non-positive scores get key 0; if every score is 0
the pick is uniform.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.request import InferenceRequest
from epp.scheduling.registry import register
from epp.scheduling.types import CycleState, ProfileResult, ScoredEndpoint
from plugins.pickers.common import BasePicker


@register("weighted-random-picker")
class WeightedRandomPicker(BasePicker):
    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        k = min(self.k, len(scored))
        if all(s.score <= 0 for s in scored):
            return ProfileResult([s.endpoint for s in self.rng.sample(scored, k)])
        rnd = self.rng.random
        keyed = []
        for s in scored:
            u = rnd() or 1e-12  # U in (0, 1)
            keyed.append((u ** (1.0 / s.score) if s.score > 0 else 0.0, s))
        keyed.sort(key=lambda t: t[0], reverse=True)
        return ProfileResult([s.endpoint for _, s in keyed[:k]])
