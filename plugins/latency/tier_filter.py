"""`slo-headroom-tier-filter`: keep the endpoints predicted to meet the request's SLO.

Upstream (GIE `pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier`, parameter
`epsilonExploreNeg` 0.01): endpoints split into a positive tier (TTFT and TPOT headroom
≥ 0) and a negative one; when both exist the positive tier is kept, except with
probability ε the negative one (so predictions for the busy endpoints keep being
refreshed by real observations). Here, when *no* endpoint meets the SLO, the filter keeps
the ones closest to meeting it: relative deficit (see `LatencyPredictionInfo.deficit`)
within `closestDeficitSlack` of the best (upstream keeps all and lets the scorer order
them). No SLO on the request, or no predictions in the cycle → everything kept.
Randomness is the handle's `rng`, so tests are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo


@dataclass(frozen=True)
class SloTierParams:
    epsilon_explore_neg: float = param(
        0.01, min=0.0, max=1.0, doc="chance of keeping the missing tier instead of the meeting one"
    )
    closest_deficit_slack: float = param(
        0.1,
        min=0.0,
        doc="nobody meets the SLO: keep endpoints whose relative deficit is within this "
        "of the best one's (0.1 = 10 % of the SLO)",
    )


@register("slo-headroom-tier-filter")
class SloHeadroomTierFilter(Plugin):
    Params = SloTierParams
    producer_type = "predicted-latency-producer"

    def __init__(self, name: str, params: SloTierParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.rng = handle.rng

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[EndpointSnapshot]:
        info = state.read(LATENCY_PREDICTION_KEY)
        if not isinstance(info, LatencyPredictionInfo) or not info.has_slo:
            return endpoints
        known = [e for e in endpoints if e.name in info.predictions]
        if len(known) != len(endpoints):
            return endpoints
        positive, negative = [], []
        for e in endpoints:
            (positive if info.meets(e.name) else negative).append(e)
        if positive and negative:
            if self.rng.random() < self.params.epsilon_explore_neg:
                return negative
            return positive
        if positive:
            return positive
        best = min(info.deficit(e.name) for e in endpoints)
        return [
            e for e in endpoints if info.deficit(e.name) <= best + self.params.closest_deficit_slack
        ]
