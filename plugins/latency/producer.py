"""`predicted-latency-producer`: per candidate endpoint, this request's predicted TTFT and
TPOT, and its headroom against the request's SLO (`LatencyPredictionInfo`).

Upstream (GIE `pkg/epp/framework/plugins/requestcontrol/predictedlatency`) predicts with
XGBoost / Bayesian-ridge sidecars over HTTP; this one fits a linear model in-process
(`plugins/latency/model.py`) and never blocks the request path on it:

- produce (request path): features from the snapshot (waiting, running, KV use, the EPP's
  in-flight requests / prefill / decode tokens, the age of its oldest request still
  waiting for a first byte) and the request (prompt tokens minus the
  cached part from the cycle's `PrefixMatchInfo` when a prefix producer runs first;
  expected output tokens are not a feature: TPOT is per token); a few multiplications each;
- post_response (request loop, once per finished request): one `Sample` into a bounded
  ring buffer: the features the primary endpoint was routed with (its snapshot at pick,
  the prompt estimate less the share the server reported cached) and the measured
  TTFT / ITL;
- start/stop (server lifecycle): an asyncio task that every `refitIntervalSeconds`, if
  new samples arrived, refits in a worker thread (`asyncio.to_thread`) and swaps the
  coefficients in by one assignment. Outside a server `refit()` does it synchronously.

Memory: `maxSamples` samples, one weight vector per endpoint seen in them, and the
feature set's per-endpoint history (recent TTFT / TPOT / duration, kept for the pool's
endpoints only).

The fit minimises the squared relative error by default (`fitObjective: relative`): the
absolute one let the long prompts' large errors set the weights and left short requests
off by 30-140 % (docs/BENCHMARKS.md@a73a134 "Predictor accuracy per load level").
Parameters are this EPP's: upstream's sidecar knobs (`samplingMean`, `contextTTL`, …) have
no meaning here and are refused as unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.records import RequestRecord
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.latency.features import FEATURE_SETS, EndpointHistory
from plugins.latency.info import (
    LATENCY_PREDICTION_KEY,
    LatencyPrediction,
    LatencyPredictionInfo,
    SloDefaultParams,
    request_slo,
)
from plugins.latency.model import Coefficients, ColdStart, Sample, SampleBuffer, fit, predict
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo

log = logging.getLogger("epp.latency")


@dataclass(frozen=True)
class PredictedLatencyParams(SloDefaultParams):
    max_samples: int = param(4096, min=16, doc="ring buffer of observations the model fits on")
    min_samples: int = param(
        32, min=8, doc="observations an endpoint (or the pool) needs before its fit is used"
    )
    refit_interval_seconds: float = param(
        2.0, min=0.05, doc="how often the background task refits (only if new samples came)"
    )
    cold_prefill_tokens_per_second: float = param(
        15928.0,
        min=1.0,
        doc="cold-start TTFT = pending prefill tokens / this (llm-d's TTFT-gate default)",
    )
    cold_tpot_ms: float = param(
        20.0, min=0.0, doc="cold-start TPOT at empty KV (scaled by 1 + KV use)"
    )
    slo_buffer_factor: float = param(
        1.0, min=0.1, doc="predictions are multiplied by this before the SLO comparison"
    )
    features: str = param(
        "basic",
        choices=tuple(sorted(FEATURE_SETS)),
        doc="feature set (plugins/latency/features.py): basic = queue counts, KV use, "
        "in-flight tokens; queue = + queueing and per-endpoint speed terms; +age = + the "
        "age of the oldest request awaiting its first byte",
    )
    fit_objective: str = param(
        "relative",
        choices=("relative", "absolute"),
        doc="least squares on the relative error (what MAPE and the SLO test measure) "
        "or on the absolute error in ms",
    )


@register("predicted-latency-producer")
class PredictedLatencyProducer(Plugin):
    Params = PredictedLatencyParams
    produces = LATENCY_PREDICTION_KEY

    def __init__(self, name: str, params: PredictedLatencyParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.buffer = SampleBuffer(params.max_samples)
        self.features = FEATURE_SETS[params.features]
        self.history = EndpointHistory()
        self._relative = params.fit_objective == "relative"
        self._pool = handle.pool
        # The pick's time for `pending_age_ms`, in the clock the server stamps in-flight
        # requests and response records with (time.monotonic; virtual in benchmarks).
        self._clock = handle.clock
        handle.on_pool_change(self._pool_changed)
        self.coefficients = Coefficients()
        self.cold = ColdStart(params.cold_prefill_tokens_per_second, params.cold_tpot_ms)
        self._fitted_at = 0  # buffer.added when the last fit started
        self._task: asyncio.Task[None] | None = None

    # -- request path -------------------------------------------------------------

    def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> LatencyPredictionInfo:
        prefix = state.read(PREFIX_MATCH_KEY)
        prompt = request.prompt_tokens_estimate
        coef = self.coefficients  # one read: a concurrent swap cannot mix two fits
        f, h, now = self.features, self.history, self._clock()
        out: dict[str, LatencyPrediction] = {}
        for e in endpoints:
            cached = prefix.cached_tokens(e.name) if isinstance(prefix, PrefixMatchInfo) else 0
            ttft, tpot, learned = predict(
                coef, self.cold, e.name, f.ttft(e, max(0, prompt - cached), h, now), f.tpot(e, h)
            )
            out[e.name] = LatencyPrediction(ttft, tpot, learned)
        slo_ttft, slo_tpot = request_slo(
            request, self.params.default_ttft_slo_ms, self.params.default_tpot_slo_ms
        )
        return LatencyPredictionInfo(out, slo_ttft, slo_tpot, self.params.slo_buffer_factor)

    # -- learning -----------------------------------------------------------------

    def _pool_changed(self) -> None:
        self.history.retain({e.name for e in self._pool()})

    def post_response(
        self, request: InferenceRequest, response: RequestRecord, endpoint: EndpointSnapshot
    ) -> None:
        if not response.ok or response.endpoint != endpoint.name:
            return
        if math.isnan(response.ttft_ms) and math.isnan(response.itl_ms):
            return
        # In the units produce() uses (the EPP's prompt estimate), whatever the server's
        # tokenizer counts: the estimate scaled by the share the server did not have cached.
        prompt = request.prompt_tokens_estimate
        share = 1.0 - response.cached_tokens / response.isl if response.isl > 0 else 1.0
        uncached = round(prompt * min(1.0, max(0.0, share)))
        f, h = self.features, self.history
        # The pick's time: the record's duration runs from routing to its end.
        routed_at = response.finished_at - response.duration_s
        # The history as it is now, before this response joins it (what produce() used at
        # pick time differs only by the requests that finished meanwhile).
        self.buffer.add(
            Sample(
                endpoint.name,
                f.ttft(endpoint, uncached, h, routed_at),
                f.tpot(endpoint, h),
                response.ttft_ms,
                response.itl_ms,
            )
        )
        h.observe(
            endpoint.name,
            response.ttft_ms,
            response.itl_ms,
            1000.0 * response.duration_s,
            endpoint.metrics.running_requests,
        )

    def refit(self) -> Coefficients:
        """Fit on the buffer now and use the result (tests; the server's task uses the
        same code off the loop)."""
        self._fitted_at = self.buffer.added
        self.coefficients = self._fit(self.buffer.copy())
        return self.coefficients

    def _fit(self, samples: list[Sample]) -> Coefficients:
        return fit(samples, self.params.min_samples, relative=self._relative)

    async def _refit_forever(self) -> None:
        while True:
            await asyncio.sleep(self.params.refit_interval_seconds)
            if self.buffer.added == self._fitted_at:
                continue
            self._fitted_at = self.buffer.added
            samples = self.buffer.copy()
            try:
                coef = await asyncio.to_thread(self._fit, samples)
            except Exception:  # a singular fit must not end learning for good
                log.exception("latency model refit failed; keeping the previous fit")
                continue
            self.coefficients = coef
            log.info(
                "latency model refit on %d samples (%d endpoints): in-sample MAPE "
                "TTFT %.1f %%, TPOT %.1f %%",
                coef.samples,
                len(coef.ttft_by_endpoint),
                100 * coef.ttft_mape,
                100 * coef.tpot_mape,
            )

    async def start(self) -> None:
        self._task = asyncio.create_task(self._refit_forever(), name=f"{self.name}-refit")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
