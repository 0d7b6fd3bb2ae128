"""`random-picker`: uniform choice, ignoring scores (a baseline, and upstream's)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.request import InferenceRequest
from epp.scheduling.registry import register
from epp.scheduling.types import CycleState, ProfileResult, ScoredEndpoint
from plugins.pickers.common import BasePicker


@register("random-picker")
class RandomPicker(BasePicker):
    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        k = min(self.k, len(scored))
        return ProfileResult([s.endpoint for s in self.rng.sample(scored, k)])
