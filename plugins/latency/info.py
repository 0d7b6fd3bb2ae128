"""What `predicted-latency-producer` tells its consumers, under one CycleState key.

Upstream's `LatencyPredictionInfo` (GIE `predictedlatency`): per endpoint the predicted
TTFT and TPOT, and the headroom against the request's SLO: headroom = SLO − predicted, and
without an SLO `0 − predicted` (so, as upstream, an SLO-less request has no endpoint that
"meets" it and consumers fall back to the lowest prediction). The SLO comes from the
`x-slo-ttft-ms` / `x-slo-tpot-ms` headers, else the producer's configured default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from epp.config.params import param
from epp.headers import SLO_TPOT_MS, SLO_TTFT_MS
from epp.request import InferenceRequest

LATENCY_PREDICTION_KEY = "latency-prediction"


@dataclass(frozen=True, slots=True)
class LatencyPrediction:
    ttft_ms: float
    tpot_ms: float
    learned: bool  # False: the cold-start formula (no fitted model yet)


@dataclass(frozen=True, slots=True)
class LatencyPredictionInfo:
    """Predictions of one request on every candidate, and the request's SLO.

    `slo_*_ms` is None when neither the header nor a default sets it. `buffer_factor`
    multiplies a prediction before it is compared with the SLO (> 1 = a safety margin).
    """

    predictions: Mapping[str, LatencyPrediction]
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    buffer_factor: float = 1.0

    @property
    def has_slo(self) -> bool:
        return self.slo_ttft_ms is not None or self.slo_tpot_ms is not None

    def ttft_headroom(self, name: str) -> float:
        p = self.predictions[name]
        return (self.slo_ttft_ms or 0.0) - self.buffer_factor * p.ttft_ms

    def tpot_headroom(self, name: str) -> float:
        p = self.predictions[name]
        return (self.slo_tpot_ms or 0.0) - self.buffer_factor * p.tpot_ms

    def meets(self, name: str) -> bool:
        """Every SLO the request has is met on `name` (False when it has none)."""
        if not self.has_slo or name not in self.predictions:
            return False
        ok_ttft = self.slo_ttft_ms is None or self.ttft_headroom(name) >= 0
        ok_tpot = self.slo_tpot_ms is None or self.tpot_headroom(name) >= 0
        return ok_ttft and ok_tpot

    def deficit(self, name: str) -> float:
        """How far `name` misses the SLO, relative: max over the set SLOs of
        (predicted − SLO) / SLO, 0 when met (e.g. TTFT 300 ms for a 200 ms SLO → 0.5)."""
        worst = 0.0
        for slo, head in (
            (self.slo_ttft_ms, self.ttft_headroom),
            (self.slo_tpot_ms, self.tpot_headroom),
        ):
            if slo is not None:
                worst = max(worst, -head(name) / slo)
        return worst


def slo_from_headers(request: InferenceRequest, field: str, default_ms: float) -> float | None:
    """The SLO in ms from header `field`, else `default_ms` (0 = none). A malformed or
    non-positive header is ignored (the default applies): routing must not fail on it."""
    raw = request.headers.get(field)
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value > 0:
            return value
    return default_ms if default_ms > 0 else None


@dataclass(frozen=True)
class SloDefaultParams:
    """The targets a latency producer assumes for a request that names none."""

    default_ttft_slo_ms: float = param(
        0.0, min=0.0, doc="TTFT SLO when the request has no x-slo-ttft-ms header; 0 = none"
    )
    default_tpot_slo_ms: float = param(
        0.0, min=0.0, doc="TPOT SLO when the request has no x-slo-tpot-ms header; 0 = none"
    )


def request_slo(
    request: InferenceRequest, default_ttft_ms: float, default_tpot_ms: float
) -> tuple[float | None, float | None]:
    return (
        slo_from_headers(request, SLO_TTFT_MS, default_ttft_ms),
        slo_from_headers(request, SLO_TPOT_MS, default_tpot_ms),
    )
