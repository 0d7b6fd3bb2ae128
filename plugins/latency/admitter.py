"""`latency-slo-admitter`: refuse sheddable work that no endpoint can serve within its SLO.

llm-d-router's `pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo` (README and
plugin.go), same rules: a request of priority ≥ 0, or one without an SLO header
(`x-slo-ttft-ms` / `x-slo-tpot-ms` > 0), is admitted; so is every request when the cycle
has no predictions (fail open). A sheddable request (priority < 0) with an SLO is refused
only when no candidate

- is predicted to meet its SLO (`predicted-latency-producer`'s predictions; created with
  this plugin's parameters when the config has none, as every consumer's producer is),
- is idle (no running request), or
- is cold (KV-cache use below 2 %: its predictions are not yet reliable).

Differences, and why. Idle: upstream's code reads only the scraped running count (its
README says the EPP's dispatched count); here an endpoint is idle when both are zero,
since the scrape lags a burst the EPP has just sent there. A refusal is a 429 with
`x-llm-d-request-dropped-reason: rejected-saturated` (the Scheduler's `_admit`), where
upstream answers 500. `latencyPredictionInfoProducerName` (upstream's only parameter) is
accepted; one producer writes the predictions per cycle here, so there is nothing to
choose between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.headers import SLO_TPOT_MS, SLO_TTFT_MS
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo

COLD_KV_USAGE = 0.02  # upstream's threshold


@dataclass(frozen=True)
class LatencyAdmitterParams:
    latency_prediction_info_producer_name: str = param(
        "", doc="upstream's: which producer's predictions to read (one per cycle here)"
    )


def _header_ms(request: InferenceRequest, name: str) -> float:
    raw = request.headers.get(name)
    if not raw:
        return 0.0
    try:
        v = float(raw)
    except ValueError:
        return 0.0
    return v if math.isfinite(v) else 0.0


@register("latency-slo-admitter")
class LatencySloAdmitter(Plugin):
    Params = LatencyAdmitterParams
    producer_type = "predicted-latency-producer"

    def __init__(self, name: str, params: LatencyAdmitterParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params

    def admit(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> str | None:
        if request.priority >= 0:
            return None
        if _header_ms(request, SLO_TTFT_MS) <= 0 and _header_ms(request, SLO_TPOT_MS) <= 0:
            return None  # no SLO: nothing to judge by
        info = state.read(LATENCY_PREDICTION_KEY)
        if not isinstance(info, LatencyPredictionInfo) or not info.predictions:
            return None  # no predictions: fail open
        for e in endpoints:
            if e.metrics.kv_cache_usage < COLD_KV_USAGE:
                return None  # cold: its predictions are not reliable yet
            if e.metrics.running_requests == 0 and e.inflight_requests == 0:
                return None  # idle
            if info.meets(e.name):
                return None
        return (
            f"none of the {len(endpoints)} endpoints is predicted to meet the request's "
            "latency SLO, idle or cold, and its objective is sheddable "
            f"(priority {request.priority})"
        )
