"""`random-picker`: uniform choice, ignoring scores (a baseline, and upstream's)."""

from __future__ import annotations

from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, ProfileResult, ScoredEndpoint
from plugins.pickers.common import PickerParams


@register("random-picker")
class RandomPicker(Plugin):
    Params = PickerParams

    def __init__(self, name: str, params: PickerParams, handle: Handle) -> None:
        super().__init__(name)
        self.k = params.max_num_of_endpoints
        self.rng = handle.rng

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: list[ScoredEndpoint]
    ) -> ProfileResult:
        k = min(self.k, len(scored))
        return ProfileResult([s.endpoint for s in self.rng.sample(scored, k)])
