"""`round-robin-picker`: the candidates in turn, ignoring scores (a baseline).

What GIE's lightweight EPP does (`cmd/lwepp`, `pkg/lwepp`: round-robin, the picker of its
conformance tests; gie-epp.md §0), and what Envoy's ROUND_ROBIN does without an EPP. With
no scorers in front of it, `epp serve` with this picker places requests as Envoy's
round-robin would, so a benchmark beside Envoy alone measures the cost of the EPP hop by
itself (bench/routing.py `epp-rr`). One counter for every request: the n-th
pick is candidate n mod len(candidates), in the datastore's (stable) order.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.request import InferenceRequest
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, ProfileResult, ScoredEndpoint
from plugins.pickers.common import BasePicker, PickerParams


@register("round-robin-picker")
class RoundRobinPicker(BasePicker):
    def __init__(self, name: str, params: PickerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.turn = 0

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[ScoredEndpoint]
    ) -> ProfileResult:
        n = len(scored)
        if n == 0:
            return ProfileResult([])
        start, self.turn = self.turn % n, self.turn + 1
        k = min(self.k, n)
        return ProfileResult([scored[(start + i) % n].endpoint for i in range(k)])
