"""`slo-slack-scorer`: place each request by the slack its own targets leave on an endpoint.

A request's slack on an endpoint is what its own TTFT / TPOT targets (`x-slo-ttft-ms`,
`x-slo-tpot-ms`) leave after the latency predicted there, relative to each target:
`s_ttft = (T_ttft − b·p_ttft) / T_ttft`, likewise `s_tpot` (`b` is the producer's
`sloBufferFactor`): 1 where it would be instant, 0 where it just meets the target,
negative where it misses. Whether the endpoint is *safe* is decided by the smaller of the
two (both targets must hold); how much slack it leaves, for ranking, by
`rankTtftWeight · s_ttft + (1 − rankTtftWeight) · s_tpot` (TTFT alone by default).

- Safe endpoints (slack ≥ `safeSlack`): `safeStrategy: flat` (default) scores them all 1
  and lets the profile's other scorers choose among them: a request that meets its own
  targets on several endpoints takes no more than it needs, and the load scorer places
  it where it delays others least. `most` prefers the most slack (0.5..1: the fastest
  predicted endpoint, as GIE's `latency-scorer` with `most`), `least` the least slack
  (packs: a loose request takes the slowest endpoint that still serves it and leaves the
  fast one to tight requests).
- Unsafe endpoints score 0..0.5 by slack (clamped to [−1, safeSlack)): always below every
  safe one, so a tight request avoids the endpoint that would miss it even where a loose
  request is sent, and a request that misses everywhere goes where it misses by least.

What was measured (`bench/slo_family.py`, docs/plugins.md "SLO-aware routing"): `most`
won the family's tuning half (+5.7 points over the default) and lost its reporting half
(−2.5, worst −7.9): spreading every request to its fastest predicted endpoint overloads
the fast servers, whose queueing the predictor under-estimates, and leaves the slow one
idle. `least` lost on the tuning half (−1.6): it packs chats too, onto endpoints that
only just meet, where a 20-30 % prediction error turns into misses. `flat` (the default
here) gained +4.1 on the reporting half, never below the default, and lost up to 12
points on a further draw, where serving each request by its own prediction sends long
prompts in front of the chats. None is the EPP's default.

`scoring: chance` replaces the bands by the probability that every target is met,
the prediction's error taken as log-normal with `errorSpread` (tried; below `flat`).

A request without targets (no header and no producer default) scores 0.5 everywhere:
the profile's other scorers route it exactly as they would without this plugin. So does
a cycle without a prediction for every candidate. Ties (equal slack, every safe endpoint
under `flat`) score equally; the profile's other scorers break them (with
`config/slo-slack.yaml`: the token-load scorer, fewer in-flight tokens wins), then
`max-score-picker` draws among exact ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo

NEUTRAL = 0.5
FLOOR_SLACK = -1.0  # missing by the target itself or more all count as the worst


@dataclass(frozen=True)
class SloSlackParams:
    safe_slack: float = param(
        0.0,
        min=0.0,
        max=0.99,
        doc="relative slack from which an endpoint is safe for the request (0: predicted "
        "to meet each target; 0.3: at most 70 % of each)",
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
    miss_strategy: str = param(
        "closest",
        choices=("closest", "flat"),
        doc="among endpoints below safeSlack: the most slack first (closest to meeting), "
        "or all equal at 0 (when no endpoint is safe the other scorers choose)",
    )
    safe_strategy: str = param(
        "flat",
        choices=("least", "flat", "most"),
        doc="among safe endpoints: all equal (the other scorers choose), least slack "
        "first (pack), or most slack first (spread)",
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
        if self.params.miss_strategy == "flat":
            return 0.0
        return NEUTRAL * (max(s, FLOOR_SLACK) - FLOOR_SLACK) / (m - FLOOR_SLACK)
