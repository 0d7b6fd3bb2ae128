"""`max-score-picker`: the highest total score wins; ties are broken at random.

Upstream shuffles then stable-sorts; for the common single pick this finds the maximum
and draws among the tied endpoints, which is the same distribution in one pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.registry import register
from epp.scheduling.types import CycleState, ProfileResult, ScoredEndpoint, ScoredEndpoints
from plugins.pickers.common import BasePicker


@register("max-score-picker")
class MaxScorePicker(BasePicker):
    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        if not scored:
            return ProfileResult([])
        if self.k == 1:
            if isinstance(scored, ScoredEndpoints):  # from a profile: the numbers as a list
                return ProfileResult([self._best(scored.endpoints, scored.scores)])
            best = max(s.score for s in scored)
            tied = [s for s in scored if s.score == best]
            chosen = tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]
            return ProfileResult([chosen.endpoint])
        order = list(scored)
        self.rng.shuffle(order)
        order.sort(key=lambda s: s.score, reverse=True)
        return ProfileResult([s.endpoint for s in order[: self.k]])

    def _best(self, endpoints: list[EndpointSnapshot], scores: list[float]) -> EndpointSnapshot:
        """The same pick as the loop above (the tied endpoints in order, one drawn with
        one `randrange` call) with C-level list operations."""
        best = max(scores)
        if scores.count(best) == 1:
            return endpoints[scores.index(best)]
        tied = [i for i, s in enumerate(scores) if s == best]
        return endpoints[tied[self.rng.randrange(len(tied))]]
