"""`slo-externality-scorer`: own slack minus the slack a placement takes from tight requests.

`slo-slack-scorer` scores a request by its own targets only, so a long prompt that meets
its loose target everywhere is as welcome in front of tight chats as on an idle server:
its prefill then stretches the decode steps (TPOT) and the queue (TTFT) of every tight
request on that endpoint, which the long request's own slack cannot see.

This scorer keeps its own in-flight ledger (`pre_request` adds the pick; `post_response`
removes it, or `maxAgeS` does when the response path is off): per endpoint, the targets
of the requests routed there that have not finished. A request is *tight* when it has a
TPOT target or a TTFT target of at most `tightTtftMs`. The *harm* of placing a request on
an endpoint is its prefill time there (uncached prompt tokens / `prefillTokensPerSecond`)
relative to each tight in-flight request's TTFT target, summed: Σ_j d / T_j (a 300 ms
prefill in front of two 150 ms chats: 4). The score is the request's own band (predicted
to meet both targets: 1; else 0..0.5 by how close, as `slo-slack-scorer`'s `closest`)
minus `harmWeight` × harm, floored at 0. A long prompt thus goes where tight requests
wait least while its loose target holds there; a chat's own prefill is short, so its
harm is small and its own slack decides.

A request without targets, or a cycle without a prediction for every candidate, scores
0.5 everywhere (the profile's other scorers route it as without this plugin). Ties (equal
band and equal harm, e.g. no tight request in flight anywhere) score equally: the
profile's other scorers break them (with `config/slo-externality.yaml` the token-load
scorer: fewer in-flight tokens wins), then `max-score-picker` draws among exact ties.
The ledger is updated in O(1) per request and read in O(1) per endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.records import RequestRecord
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, SchedulingResult
from plugins.latency.inflight import TightLedger
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo, request_slo
from plugins.latency.slack import FLOOR_SLACK, NEUTRAL, slack
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo


@dataclass(frozen=True)
class SloExternalityParams:
    harm_weight: float = param(
        0.5, min=0.0, doc="score taken per unit of harm (Σ prefill / tight TTFT target)"
    )
    tight_ttft_ms: float = param(
        500.0,
        min=0.0,
        doc="a request with a TTFT target at most this (or any TPOT target) is tight",
    )
    prefill_tokens_per_second: float = param(
        15928.0, min=1.0, doc="prefill throughput used to turn a prompt into prefill time"
    )
    guard: bool = param(
        True,
        doc="harm orders endpoints only within the request's own band (an endpoint that "
        "meets its targets always outranks one that misses them); false: band − weight × harm",
    )
    max_age_s: float = param(
        120.0, min=0.001, doc="an in-flight entry not reported finished by then is forgotten"
    )


@register("slo-externality-scorer")
class SloExternalityScorer(Plugin):
    Params = SloExternalityParams
    producer_type = "predicted-latency-producer"

    def __init__(self, name: str, params: SloExternalityParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self._clock = handle.clock
        # per endpoint the running Σ 1 / T_ttft of its tight requests in flight
        self.ledger = TightLedger(params.max_age_s)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        info = state.read(LATENCY_PREDICTION_KEY)
        if not isinstance(info, LatencyPredictionInfo) or not info.has_slo:
            return [NEUTRAL] * len(endpoints)
        if any(e.name not in info.predictions for e in endpoints):
            return [NEUTRAL] * len(endpoints)
        return self.scores_for(info, state, request, endpoints)

    def scores_for(
        self,
        info: LatencyPredictionInfo,
        state: CycleState,
        request: InferenceRequest,
        endpoints: list[EndpointSnapshot],
    ) -> list[float]:
        """The scores over `info`'s predictions (a prediction for every endpoint)."""
        prefix = state.read(PREFIX_MATCH_KEY)
        prompt = request.prompt_tokens_estimate
        ms_per_token = 1000.0 / self.params.prefill_tokens_per_second
        w = self.params.harm_weight
        out = []
        for e in endpoints:
            cached = prefix.cached_tokens(e.name) if isinstance(prefix, PrefixMatchInfo) else 0
            harm = max(0, prompt - cached) * ms_per_token * self.ledger.on(e.name)
            own = slack(info, e.name)
            band = 1.0 if own >= 0 else NEUTRAL * (1.0 - max(own, FLOOR_SLACK) / FLOOR_SLACK)
            if self.params.guard:  # 1/(1 + w·harm) keeps each band's range
                keep = 1.0 / (1.0 + w * harm)
                out.append(NEUTRAL + NEUTRAL * keep if band == 1.0 else band * keep)
            else:
                out.append(max(0.0, band - w * harm))
        return out

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        ttft, tpot = request_slo(request, 0.0, 0.0)
        if ttft is None and tpot is None:
            return
        tight = tpot is not None or (ttft is not None and ttft <= self.params.tight_ttft_ms)
        weight = 1.0 / (ttft or self.params.tight_ttft_ms or 1.0) if tight else 0.0
        target = result.primary.targets[0].name
        self.ledger.record(request.request_id, target, weight, self._clock())

    def post_response(
        self, request: InferenceRequest, response: RequestRecord, endpoint: EndpointSnapshot
    ) -> None:
        self.ledger.drop(request.request_id)
