"""`calibrated-latency-producer` and `slo-calibrated-scorer`: SLO placement on predictions
that know the queue and are corrected by what each endpoint measured.

The producer writes the same `LatencyPredictionInfo` as `predicted-latency-producer`
(under the same CycleState key, so a config has one or the other) from two parts:

- a queueing estimate from the endpoint snapshot (`queueing.py`: prompt tokens pending
  ahead × the endpoint's learned prefill speed, plus the wait for a batch slot), instead
  of a regression on load counts;
- an online observed / predicted correction per endpoint and request class, shrunk
  toward the pool's for the class (`calibration.py`), so the endpoints the router picks
  because they look fast are the ones whose optimism is measured and removed.

Both learn in `post_response` (the response path must be on: `epp serve --response-path
on`; without it the cold values and no correction apply) from the pick-time snapshot and
the measured TTFT / mean inter-token latency. The request path does a few multiplications
and dictionary reads per endpoint; a request without targets, none (and until one with
targets arrives, nothing is learned, so a pool without targets pays nothing per response).

The scorer is `slo-externality-scorer` (own band, minus the harm a prefill does to tight
requests in flight) read over these predictions, with a graded fallback. The producer
also gives each prediction at the central calibration (z = 0, no margin). When no
endpoint meets the request's targets with the margin, the scorer (`graded: true`, the
default) scores over the central estimates instead, so the endpoints that meet there win:
the margin exists to keep a request off an endpoint that merely looks feasible; when none
looks feasible with it, the central estimate is the best information left, and a miss
inflated by the margin ranks endpoints partly by the width of their error bars (z·σ of
each) rather than by how close they are expected to come. When none meets even there,
`whenNoneMeet: default` (the default, and the tuning half's choice) scores 0.5 everywhere
so the profile's other scorers — the EPP's default choice — decide; `closest` prefers
the smallest miss of the central estimate (`graded: false`: of the margin's).
`tpotFirst` ranks, in that fallback, the endpoints whose calibrated TPOT (their measured
inter-token latency) misses the TPOT target below the rest (lower on the tuning half of
`bench/slo_family.py`; off).

Ties (every endpoint safe and no tight request harmed, e.g. an idle pool) score equally:
the profile's other scorers break them (with `config/slo-calibrated.yaml` the token-load
scorer: fewer in-flight tokens wins), then `max-score-picker` draws among exact ties.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.records import RequestRecord
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.latency.calibration import Calibrator, request_class
from plugins.latency.externality import SloExternalityParams, SloExternalityScorer
from plugins.latency.info import (
    LATENCY_PREDICTION_KEY,
    LatencyPrediction,
    LatencyPredictionInfo,
    SloDefaultParams,
    request_slo,
)
from plugins.latency.queueing import Speed, SpeedLearner, predict
from plugins.latency.slack import NEUTRAL, slack
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo

COLD_SLOTS = 1 << 20


@dataclass(frozen=True, slots=True)
class CalibratedPredictionInfo(LatencyPredictionInfo):
    """`predictions` with the producer's margin (`quantileZ`), and `central`: the same
    estimates at the central calibration (z = 0), for the scorer's graded fallback."""

    central: Mapping[str, LatencyPrediction] = field(default_factory=dict)

    def at_central(self) -> LatencyPredictionInfo:
        return LatencyPredictionInfo(
            self.central, self.slo_ttft_ms, self.slo_tpot_ms, self.buffer_factor
        )


@dataclass(frozen=True)
class CalibratedLatencyParams(SloDefaultParams):
    cold_prefill_tokens_per_second: float = param(
        15928.0, min=1.0, doc="prefill speed before an endpoint has history (llm-d's default)"
    )
    cold_tpot_ms: float = param(20.0, min=0.1, doc="TPOT before an endpoint has history")
    batch_slots: int = param(
        0,
        min=0,
        doc="requests a server runs at once (vLLM's --max-num-seqs); 0 = learn it as the most "
        "running requests a scrape showed (an underestimate until a server has been full)",
    )
    speed_alpha: float = param(
        0.1, min=0.001, max=1.0, doc="EWMA weight of the newest request in the learned speeds"
    )
    calibration_alpha: float = param(
        0.1, min=0.001, max=1.0, doc="EWMA weight of the newest observed / predicted ratio"
    )
    prior_samples: float = param(
        20.0,
        min=0.0,
        doc="shrinkage: an endpoint's own ratio counts n / (n + this), the pool's the rest",
    )
    quantile_z: float = param(
        1.5,
        min=-3.0,
        max=3.0,
        doc="margin: predictions × exp(mean + z·sd) of the log ratio (0: the mean; 2: ~p98)",
    )
    min_samples: int = param(
        8, min=1, doc="finished requests (pool-wide) before predictions count as learned"
    )
    tight_ttft_ms: float = param(
        500.0,
        min=0.0,
        doc="calibration class: a TTFT target at most this (or any TPOT target) is tight",
    )


@register("calibrated-latency-producer")
class CalibratedLatencyProducer(Plugin):
    Params = CalibratedLatencyParams
    produces = LATENCY_PREDICTION_KEY

    def __init__(self, name: str, params: CalibratedLatencyParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        # Before a server was seen, no queueing for a slot is assumed.
        slots = params.batch_slots or COLD_SLOTS
        cold = Speed(1000.0 / params.cold_prefill_tokens_per_second, params.cold_tpot_ms, slots)
        self.speeds = SpeedLearner(cold, params.speed_alpha, params.batch_slots)
        self.calibration = Calibrator(
            params.calibration_alpha, params.prior_samples, params.quantile_z
        )
        self._pool = handle.pool
        # The pick's time, in the clock the server stamps in-flight requests and response
        # records with (time.monotonic; virtual in benchmarks).
        self._clock = handle.clock
        handle.on_pool_change(self._pool_changed)
        self.finished = 0
        # Learning starts with the first request that carries a target (or at once when a
        # default target is set): a pool whose requests carry none, the common case under
        # the default config, pays one flag test per request and nothing per response.
        self.learning = params.default_ttft_slo_ms > 0 or params.default_tpot_slo_ms > 0

    def _slo(self, request: InferenceRequest) -> tuple[float | None, float | None]:
        return request_slo(
            request, self.params.default_ttft_slo_ms, self.params.default_tpot_slo_ms
        )

    # -- request path -------------------------------------------------------------

    def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> CalibratedPredictionInfo:
        prefix = state.read(PREFIX_MATCH_KEY)
        prompt = request.prompt_tokens_estimate
        slo_ttft, slo_tpot = self._slo(request)
        if slo_ttft is None and slo_tpot is None:
            # No target to place against: the scorer is neutral, nothing to predict.
            return CalibratedPredictionInfo({}, None, None, central={})
        self.learning = True
        cls = request_class(slo_ttft, slo_tpot, self.params.tight_ttft_ms)
        learned = self.finished >= self.params.min_samples
        speeds, factors, now = self.speeds, self.calibration.factors, self._clock()
        out: dict[str, LatencyPrediction] = {}
        central: dict[str, LatencyPrediction] = {}
        for e in endpoints:
            cached = prefix.cached_tokens(e.name) if isinstance(prefix, PrefixMatchInfo) else 0
            raw = predict(e, max(0, prompt - cached), speeds.get(e.name), now)
            ft, ct = factors(e.name, cls, "queued-ttft" if raw.queued else "ttft")
            fp, cp = factors(e.name, cls, "tpot")
            out[e.name] = LatencyPrediction(raw.ttft_ms * ft, raw.tpot_ms * fp, learned)
            central[e.name] = LatencyPrediction(raw.ttft_ms * ct, raw.tpot_ms * cp, learned)
        return CalibratedPredictionInfo(out, slo_ttft, slo_tpot, central=central)

    # -- learning (request loop, once per finished request) -------------------------

    def _pool_changed(self) -> None:
        names = {e.name for e in self._pool()}
        self.speeds.retain(names)
        self.calibration.retain(names)

    def post_response(
        self, request: InferenceRequest, response: RequestRecord, endpoint: EndpointSnapshot
    ) -> None:
        if not self.learning or not response.ok or response.endpoint != endpoint.name:
            return
        if math.isnan(response.ttft_ms) and math.isnan(response.itl_ms):
            return
        # The prompt in the units produce() used, less the share the server had cached.
        prompt = request.prompt_tokens_estimate
        share = 1.0 - response.cached_tokens / response.isl if response.isl > 0 else 1.0
        uncached = round(prompt * min(1.0, max(0.0, share)))
        # What produce() predicted at the pick (from its snapshot, with today's speeds),
        # against what came: the calibration; then the speeds learn from the request.
        routed_at = response.finished_at - response.duration_s
        raw = predict(endpoint, uncached, self.speeds.get(endpoint.name), routed_at)
        cls = request_class(*self._slo(request), self.params.tight_ttft_ms)
        ttft = "queued-ttft" if raw.queued else "ttft"
        self.calibration.observe(endpoint.name, cls, ttft, raw.ttft_ms, response.ttft_ms)
        self.calibration.observe(endpoint.name, cls, "tpot", raw.tpot_ms, response.itl_ms)
        self.speeds.observe(endpoint, uncached, response.ttft_ms, response.itl_ms, routed_at)
        self.finished += 1


@dataclass(frozen=True)
class SloCalibratedParams(SloExternalityParams):
    graded: bool = param(
        True,
        doc="when no endpoint meets the request's targets with the producer's margin, "
        "step down to its central estimate (z = 0) and score over that: the endpoints "
        "that meet there win; false: the fallback below on the margin's predictions",
    )
    when_none_meet: str = param(
        "default",
        choices=("default", "closest"),
        doc="when no endpoint is predicted to meet the request's targets (with `graded`: "
        "not even at the central estimate): prefer the endpoint that misses by least, or "
        "score 0.5 everywhere (the other scorers decide, as without SLO routing)",
    )
    tpot_first: bool = param(
        False,
        doc="in that fallback, an endpoint whose predicted TPOT (its measured inter-token "
        "latency, calibrated) misses the request's TPOT target ranks below every one "
        "that meets it, whatever its TTFT",
    )


@register("slo-calibrated-scorer")
class SloCalibratedScorer(SloExternalityScorer):
    Params = SloCalibratedParams
    producer_type = "calibrated-latency-producer"

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        info = state.read(LATENCY_PREDICTION_KEY)
        if (
            not isinstance(info, LatencyPredictionInfo)
            or not info.has_slo
            or any(e.name not in info.predictions for e in endpoints)
        ):
            return super().score(state, request, endpoints)
        if any(slack(info, e.name) >= 0 for e in endpoints):
            return self.scores_for(info, state, request, endpoints)
        if (
            self.params.graded
            and isinstance(info, CalibratedPredictionInfo)
            and all(e.name in info.central for e in endpoints)
        ):
            info = info.at_central()
            if any(slack(info, e.name) >= 0 for e in endpoints):
                return self.scores_for(info, state, request, endpoints)
        # None meets, at the margin nor (graded) at the central estimate: the fallback.
        ok = [True] * len(endpoints)
        if self.params.tpot_first and info.slo_tpot_ms is not None:
            ok = [info.tpot_headroom(e.name) >= 0 for e in endpoints]
            if not any(ok):
                ok = [True] * len(endpoints)
        if self.params.when_none_meet == "default":
            return [NEUTRAL if k else 0.0 for k in ok]
        out = self.scores_for(info, state, request, endpoints)
        if all(ok):
            return out
        # Closest-miss scores are in [0, 0.5): the TPOT-feasible half above the rest.
        return [NEUTRAL / 2 + s / 2 if k else s / 2 for s, k in zip(out, ok, strict=True)]
