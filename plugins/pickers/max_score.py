"""`max-score-picker`: the highest total score wins; ties are broken at random.

Upstream shuffles then stable-sorts; for the common single pick this finds the maximum
and draws among the tied endpoints, which is the same distribution in one pass.
"""

from __future__ import annotations

from epp.request import InferenceRequest
from epp.scheduling.registry import register
from epp.scheduling.types import CycleState, ProfileResult, ScoredEndpoint
from plugins.pickers.common import BasePicker


@register("max-score-picker")
class MaxScorePicker(BasePicker):
    def pick(
        self, state: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> ProfileResult:
        if not scored:
            return ProfileResult([])
        if self.k == 1:
            best = max(s.score for s in scored)
            tied = [s for s in scored if s.score == best]
            chosen = tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]
            return ProfileResult([chosen.endpoint])
        order = list(scored)
        self.rng.shuffle(order)
        order.sort(key=lambda s: s.score, reverse=True)
        return ProfileResult([s.endpoint for s in order[: self.k]])
