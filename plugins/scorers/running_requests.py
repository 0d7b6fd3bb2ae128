"""`running-requests-size-scorer`: fewer running requests scores higher (min–max)."""

from __future__ import annotations

from epp.config.params import NoParams
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.scorers.minmax import min_max_inverted


@register("running-requests-size-scorer")
class RunningRequestsSizeScorer(Plugin):
    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        return min_max_inverted([e.metrics.running_requests for e in endpoints])
