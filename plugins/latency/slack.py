"""`slo-slack-scorer`: place each request by the slack its own targets leave on an endpoint.

A request's slack on an endpoint is what its own TTFT / TPOT targets (`x-slo-ttft-ms`,
`x-slo-tpot-ms`) leave after the latency predicted there, relative to the target and the
smaller of the two when it has both: `min((T_ttft − b·p_ttft) / T_ttft, (T_tpot − b·p_tpot) /
T_tpot)`, 1 on an endpoint where it would be instant, 0 where it just meets its targets,
negative where it misses (`b` is the producer's `sloBufferFactor`).

`latency-scorer` (GIE's) min–max normalises headroom in milliseconds over the candidates and
spreads every request by it (`most`) or packs every request (`least`). Spreading by
milliseconds gives a long prompt with a 2 s target the idle fast server as readily as a chat
with a 150 ms one — its headroom there is just as large in min–max terms — and the chats
that arrive next queue behind its prefill; packing sends chats to endpoints that only just
meet their target, where the predictor's error turns that into a miss. Here the two cases
are told apart by the request's own slack:

- endpoints where the slack is at least `safeSlack` are *safe*: the request meets its
  targets there with a margin for the predictor's error, so it has no use for more. With
  `safeStrategy: least` (default) the safe endpoint with the least slack scores highest
  (0.5..1): a loose request — a long prompt with a generous target — takes the slow or
  busy endpoint that still serves it and leaves the fast, idle one to requests that
  need it; a tight request is never placed where a loose one would do as well. `flat`
  scores every safe endpoint 1 (the profile's other scorers choose among them), `most`
  prefers the most slack (spreads).
- below `safeSlack` the request needs every bit: the most slack scores highest (0..0.5,
  linear in slack clamped to [−1, safeSlack)), so a request that is tight everywhere goes
  where it is predicted fastest, and one that misses everywhere goes where it misses by
  least.

A request without targets (no header and no producer default) scores 0.5 everywhere:
the profile's other scorers route it as they would without this plugin. So do requests
in a cycle without predictions for every candidate. Ties (equal slack) score equally; the
profile's other scorers break them (with `config/slo-slack.yaml`, the token-load scorer:
fewer in-flight tokens wins), then `max-score-picker` draws among exact ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.params import param
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo

NEUTRAL = 0.5
FLOOR_SLACK = -1.0  # missing by the target itself or more all count as the worst


@dataclass(frozen=True)
class SloSlackParams:
    safe_slack: float = param(
        0.3,
        min=0.0,
        max=0.99,
        doc="relative slack from which an endpoint is safe for the request (0.3: predicted "
        "at most 70 % of each target)",
    )
    scoring: str = param(
        "slack",
        choices=("slack", "chance"),
        doc="slack: the safe / unsafe bands above; chance: the probability that both "
        "targets are met, the prediction's error taken as log-normal with `errorSpread`",
    )
    error_spread: float = param(
        0.3, min=0.01, doc="chance: the predictor's relative error (σ of log(observed / predicted))"
    )
    rank_ttft_weight: float = param(
        1.0,
        min=0.0,
        max=1.0,
        doc="how a request with both targets ranks endpoints: this × TTFT slack + (1 − this) "
        "× TPOT slack; safety is always the smaller of the two",
    )
    safe_strategy: str = param(
        "least",
        choices=("least", "flat", "most"),
        doc="among safe endpoints: least slack first (leave fast endpoints to tight "
        "requests), all equal, or most slack first",
    )


def slack(info: LatencyPredictionInfo, name: str) -> float:
    """The request's relative slack on `name` (see the module doc); +inf without targets."""
    out = float("inf")
    if info.slo_ttft_ms is not None:
        out = info.ttft_headroom(name) / info.slo_ttft_ms
    if info.slo_tpot_ms is not None:
        out = min(out, info.tpot_headroom(name) / info.slo_tpot_ms)
    return out


@register("slo-slack-scorer")
class SloSlackScorer(Plugin):
    Params = SloSlackParams
    producer_type = "predicted-latency-producer"

    def __init__(self, name: str, params: SloSlackParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        info = state.read(LATENCY_PREDICTION_KEY)
        if not isinstance(info, LatencyPredictionInfo) or not info.has_slo:
            return [NEUTRAL] * len(endpoints)
        preds = info.predictions
        if any(e.name not in preds for e in endpoints):
            return [NEUTRAL] * len(endpoints)
        if self.params.scoring == "chance":
            return [self.chance(info, e.name) for e in endpoints]
        w = self.params.rank_ttft_weight
        if info.slo_ttft_ms is not None and info.slo_tpot_ms is not None:
            return [self.score_ranked(info, e.name, w) for e in endpoints]
        return [self.score_slack(slack(info, e.name)) for e in endpoints]

    def score_ranked(self, info: LatencyPredictionInfo, name: str, w: float) -> float:
        st = info.ttft_headroom(name) / info.slo_ttft_ms  # type: ignore[operator]
        sp = info.tpot_headroom(name) / info.slo_tpot_ms  # type: ignore[operator]
        safe = min(st, sp) >= self.params.safe_slack
        ranked = self.score_slack(max(self.params.safe_slack, w * st + (1 - w) * sp))
        return ranked if safe else self.score_slack(min(st, sp))

    def chance(self, info: LatencyPredictionInfo, name: str) -> float:
        """P(observed ≤ target) for each target, multiplied: observed = predicted × e^N(0, σ)."""
        p, out, sigma = info.predictions[name], 1.0, self.params.error_spread
        b = info.buffer_factor
        for target, pred in ((info.slo_ttft_ms, p.ttft_ms), (info.slo_tpot_ms, p.tpot_ms)):
            if target is not None:
                if pred <= 0:
                    continue
                z = math.log(target / (b * pred)) / sigma
                out *= 0.5 * math.erfc(-z / math.sqrt(2.0))
        return out

    def score_slack(self, s: float) -> float:
        """A slack's score: safe ones in [0.5, 1] by the strategy, the others in [0, 0.5)."""
        m = self.params.safe_slack
        if s >= m:
            strategy = self.params.safe_strategy
            if strategy == "flat":
                return 1.0
            spare = min(1.0, (s - m) / (1.0 - m))  # 0 at the margin, 1 when instant
            return 1.0 - NEUTRAL * spare if strategy == "least" else NEUTRAL + NEUTRAL * spare
        return NEUTRAL * (max(s, FLOOR_SLACK) - FLOOR_SLACK) / (m - FLOOR_SLACK)
