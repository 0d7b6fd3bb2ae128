"""`slo-tier-scorer`: keep the fast capacity for the requests only it can serve.

`slo-slack-scorer` and `slo-externality-scorer` place a request by how much slack the
predictor says it keeps on each endpoint, so their quality is the predictor's: at 70-90 %
load it under-estimates queueing on the busy endpoints (predicted / observed TTFT
0.75-0.94), and a slow server that only just meets a chat's TPOT target attracts chats
through optimistic predictions (the winner's curse). This scorer asks the predictor one
yes/no question per endpoint, with a margin, and decides everything else from counts:

- **Feasible**: the request's own targets hold on the endpoint with the prediction
  multiplied by `margin` (and the producer's `sloBufferFactor`).
- **Tight** request: feasible on some candidates only (its targets need the endpoints
  that are fast or idle enough now). It scores 1 on the feasible ones and 0 elsewhere, so
  among those the profile's other scorers (with `config/slo-tiers.yaml` the default's
  token-load scorer) choose as the default would.
- **Loose** request: feasible everywhere. If its prompt has at least `steerMinTokens`
  tokens (a shorter prefill delays nobody's decode: it scores 1 everywhere and the other
  scorers choose), it is steered away from what the tight class needs: to the endpoint
  with the lowest *need* = relative speed × (1 + `tightWeight` × tight requests in
  flight there), scored 0.5 + 0.5 × lowest need / its need. An
  endpoint takes loose requests this way only while its share of the pool's in-flight
  tokens is within `capShare` × its share of the pool's measured speed (the *token-load
  cap*); over it, it scores 0.5 and the other scorers decide. So at high load the long
  class spreads over the pool by capacity instead of piling onto the one endpoint with
  fewest chats.
- **Deep overload** (feasible nowhere) and requests without targets (or a cycle without
  a prediction for every candidate) score 0.5 everywhere: the default's choice exactly.

Relative speed is measured, not predicted: from each finished request, the per-token
decode time (its mean inter-token gap over the batch it shared, the endpoint's running
requests at pick + 1) and the prefill time per token (TTFT over the prompt tokens pending
there at pick plus its own uncached prompt); per endpoint the median of the last
`speedWindow` of each, relative to the fastest endpoint's (1 = fastest, 0.5 = twice as
slow; the geometric mean of the two). An endpoint without samples counts as the fastest.

Measured (`bench/slo_family.py`, virtual time, docs/plugins.md "SLO-aware routing by
tiers"): +4.5 points over the default on the reporting half, worst −2.8, where the
slack-ranking scorers lose the long class at 85 % load; never below the default on a
fresh draw (+7.5). Not the EPP's default.

Ties (equal need under the cap, every feasible endpoint for a tight request) score
equally: the profile's other scorers break them, then `max-score-picker` draws. The tight
ledger is O(1) per request; scoring is O(endpoints) over cached speeds.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.records import RequestRecord
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, SchedulingResult
from plugins.latency.inflight import TightLedger
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo
from plugins.latency.slack import NEUTRAL


@dataclass(frozen=True)
class SloTierParams:
    margin: float = param(
        1.25,
        min=1.0,
        doc="an endpoint is feasible for a request when its targets hold with the "
        "predicted TTFT / TPOT multiplied by this",
    )
    slow_margin: float = param(
        0.0,
        min=0.0,
        doc="the margin on an endpoint is also divided by its relative speed to this "
        "power (1: a measured 2x slower endpoint needs predictions to hold with 2x the "
        "margin; the predictor's errors grow on the slow endpoints)",
    )
    cap_share: float = param(
        2.0,
        min=0.0,
        doc="a loose request is steered to an endpoint only while its share of the "
        "in-flight tokens is at most this × its share of the pool's measured speed",
    )
    steer_min_tokens: int = param(
        512,
        min=0,
        doc="a loose request with a shorter prompt is not steered (scores 1 everywhere: "
        "the other scorers choose); its prefill barely delays anyone's decode",
    )
    tight_weight: float = param(
        4.0, min=0.0, doc="need = relative speed × (1 + this × tight requests in flight)"
    )
    protect_tpot: bool = param(
        False,
        doc="also count a loose request with a TPOT target as tight in flight (a prefill "
        "stalls every decode on its endpoint, whatever the decoding request's class)",
    )
    speed_window: int = param(64, min=4, doc="finished requests per endpoint the speed uses")
    max_age_s: float = param(
        120.0, min=0.001, doc="a tight request not reported finished by then is forgotten"
    )


def feasible(info: LatencyPredictionInfo, name: str, margin: float) -> bool:
    """Both of the request's targets hold on `name` with the prediction × `margin`."""
    p, b = info.predictions[name], info.buffer_factor * margin
    if info.slo_ttft_ms is not None and b * p.ttft_ms > info.slo_ttft_ms:
        return False
    return info.slo_tpot_ms is None or b * p.tpot_ms <= info.slo_tpot_ms


class SpeedBook:
    """Per endpoint, the medians of its recent per-token decode and prefill times, and
    its speed relative to the fastest endpoint's (1 = the fastest, 0.5 = twice as slow)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.samples: tuple[dict[str, deque[float]], dict[str, deque[float]]] = ({}, {})
        self.medians: tuple[dict[str, float], dict[str, float]] = ({}, {})
        self.best = [math.inf, math.inf]

    def observe(self, name: str, decode_ms: float, prefill_ms: float) -> None:
        for k, value in enumerate((decode_ms, prefill_ms)):
            if math.isfinite(value) and value > 0:
                book = self.samples[k].setdefault(name, deque(maxlen=self.window))
                book.append(value)
                self.medians[k][name] = statistics.median(book)
                self.best[k] = min(self.medians[k].values())

    def retain(self, names: set[str]) -> None:
        for k in (0, 1):
            for gone in [n for n in self.samples[k] if n not in names]:
                del self.samples[k][gone], self.medians[k][gone]
            self.best[k] = min(self.medians[k].values(), default=math.inf)

    def relative(self, name: str) -> float:
        """The geometric mean of best / this endpoint's median over the two; 1 without
        samples (an unknown endpoint counts as the fastest)."""
        prod, parts = 1.0, 0
        for k in (0, 1):
            m = self.medians[k].get(name)
            if m is not None:
                prod *= self.best[k] / m
                parts += 1
        return prod ** (1.0 / parts) if parts else 1.0


@register("slo-tier-scorer")
class SloTierScorer(Plugin):
    Params = SloTierParams
    producer_type = "predicted-latency-producer"

    def __init__(self, name: str, params: SloTierParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self._clock = handle.clock
        self._pool = handle.pool
        handle.on_pool_change(self._pool_changed)
        self.speeds = SpeedBook(params.speed_window)
        # the count of tight requests in flight per endpoint
        self.ledger = TightLedger(params.max_age_s)
        # the last scored request's id and class (score and pre_request run back to back)
        self._last: tuple[str, bool] | None = None

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        self._last = None
        n = len(endpoints)
        info = state.read(LATENCY_PREDICTION_KEY)
        if not isinstance(info, LatencyPredictionInfo) or not info.has_slo:
            return [NEUTRAL] * n
        if any(e.name not in info.predictions for e in endpoints):
            return [NEUTRAL] * n
        m, k = self.params.margin, self.params.slow_margin
        rel = self.speeds.relative
        ok = [feasible(info, e.name, m * rel(e.name) ** -k if k else m) for e in endpoints]
        count = sum(ok)
        if count == 0:  # deep overload: the default's choice
            return [NEUTRAL] * n
        tight = count < n
        protect = tight or (self.params.protect_tpot and info.slo_tpot_ms is not None)
        self._last = (request.request_id, protect)
        if tight or request.prompt_tokens_estimate < self.params.steer_min_tokens:
            return [1.0 if f else 0.0 for f in ok]
        return self.steer(endpoints)

    def steer(self, endpoints: list[EndpointSnapshot]) -> list[float]:
        """A loose request's scores: lowest need first among the endpoints under their cap."""
        speed = [self.speeds.relative(e.name) for e in endpoints]
        total_speed = sum(speed)
        total_tokens = sum(e.inflight_tokens for e in endpoints)
        cap = self.params.cap_share * total_tokens / total_speed
        w = self.params.tight_weight
        need = [
            s * (1.0 + w * self.ledger.on(e.name)) if e.inflight_tokens <= cap * s else None
            for e, s in zip(endpoints, speed, strict=True)
        ]
        low = min((x for x in need if x is not None), default=None)
        if low is None:
            return [NEUTRAL] * len(endpoints)
        return [NEUTRAL if x is None else NEUTRAL + NEUTRAL * low / x for x in need]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        last, self._last = self._last, None
        if last is None or last[0] != request.request_id or not last[1]:
            return
        self.ledger.record(request.request_id, result.primary.targets[0].name, 1.0, self._clock())

    def post_response(
        self, request: InferenceRequest, response: RequestRecord, endpoint: EndpointSnapshot
    ) -> None:
        self.ledger.drop(request.request_id)
        if response is None or not response.ok or response.endpoint != endpoint.name:
            return
        batch = endpoint.metrics.running_requests + 1
        decode = response.itl_ms / batch if response.osl >= 2 else math.nan
        share = 1.0 - response.cached_tokens / response.isl if response.isl > 0 else 1.0
        own = request.prompt_tokens_estimate * min(1.0, max(0.0, share))
        pending = endpoint.inflight_prefill_tokens + own
        prefill = response.ttft_ms / pending if pending > 0 else math.nan
        self.speeds.observe(endpoint.name, decode, prefill)

    def _pool_changed(self) -> None:
        self.speeds.retain({e.name for e in self._pool()})
