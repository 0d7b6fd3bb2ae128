"""`latency-scorer`: score endpoints by headroom against the request's latency SLO.

Upstream (GIE `pkg/epp/framework/plugins/scheduling/scorer/latency`), reading the
`LatencyPredictionInfo` of `predicted-latency-producer`:

- SLO set, some endpoints meet it: only those score (the others 0). Their TTFT and TPOT
  headrooms are min–max normalised over them and combined
  `c = ttftWeight·nTTFT + tpotWeight·nTPOT` (weights renormalised; a dimension whose range
  is zero, or that has no SLO, drops out). `headroomSelectionStrategy: least` (upstream's
  default) packs: the endpoint that *just* meets the SLO scores highest (1 − c), keeping
  roomy ones for tighter requests; `most` spreads (c). Scores are mapped into [0.1, 1] so a
  meeting endpoint always outranks a missing one.
- SLO set, nobody meets it: closer is better: 1 − min–max(relative deficit), the deficit
  being max over the set SLOs of (predicted − SLO) / SLO. (Upstream buckets by which SLO
  is violated, then prefers idle endpoints; the relative deficit orders the same cases
  by one number.)
- no SLO: lowest predicted latency: 1 − (ttftWeight·n(TTFT) + tpotWeight·n(TPOT)).
- no predictions in the cycle (the producer not configured): every endpoint 0.5, neutral.
  (Upstream falls back to a KV/queue/prefix composite; the other scorers do that here.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.latency.info import LATENCY_PREDICTION_KEY, LatencyPredictionInfo

NEUTRAL = 0.5
MEETS_FLOOR = 0.1  # lowest score of an endpoint that meets the SLO


@dataclass(frozen=True)
class LatencyScorerParams:
    ttft_weight: float = param(0.8, min=0.0, doc="weight of TTFT")
    tpot_weight: float = param(0.2, min=0.0, doc="weight of TPOT")
    headroom_selection_strategy: str = param(
        "least",
        choices=("least", "most"),
        doc="among endpoints meeting the SLO prefer the least headroom (pack) or the most",
    )


def _norm(values: Sequence[float]) -> list[float] | None:
    """Min–max to [0, 1]; None when all are equal (the dimension carries no choice)."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return None
    return [(v - lo) / (hi - lo) for v in values]


def _combine(columns: list[tuple[float, list[float] | None]], n: int) -> list[float]:
    """Weighted mean of the normalised columns that vary; all flat → 0.5 everywhere."""
    live = [(w, col) for w, col in columns if col is not None and w > 0]
    total = sum(w for w, _ in live)
    if total == 0:
        return [0.5] * n
    return [sum(w * col[i] for w, col in live) / total for i in range(n)]


@register("latency-scorer")
class LatencyScorer(Plugin):
    Params = LatencyScorerParams
    producer_type = "predicted-latency-producer"

    def __init__(self, name: str, params: LatencyScorerParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        info = state.read(LATENCY_PREDICTION_KEY)
        if not isinstance(info, LatencyPredictionInfo) or not endpoints:
            return [NEUTRAL] * len(endpoints)
        if any(e.name not in info.predictions for e in endpoints):
            return [NEUTRAL] * len(endpoints)
        if not info.has_slo:
            return self._lowest_latency(info, endpoints)
        meeting = [i for i, e in enumerate(endpoints) if info.meets(e.name)]
        if not meeting:
            deficits = _norm([info.deficit(e.name) for e in endpoints])
            return [1.0] * len(endpoints) if deficits is None else [1.0 - d for d in deficits]
        scores = [0.0] * len(endpoints)
        names = [endpoints[i].name for i in meeting]
        p = self.params
        c = _combine(
            [
                (
                    p.ttft_weight if info.slo_ttft_ms is not None else 0.0,
                    _norm([info.ttft_headroom(n) for n in names]),
                ),
                (
                    p.tpot_weight if info.slo_tpot_ms is not None else 0.0,
                    _norm([info.tpot_headroom(n) for n in names]),
                ),
            ],
            len(names),
        )
        for i, ci in zip(meeting, c, strict=True):
            s = 1.0 - ci if p.headroom_selection_strategy == "least" else ci
            scores[i] = MEETS_FLOOR + (1.0 - MEETS_FLOOR) * s
        return scores

    def _lowest_latency(
        self, info: LatencyPredictionInfo, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        preds = [info.predictions[e.name] for e in endpoints]
        c = _combine(
            [
                (self.params.ttft_weight, _norm([p.ttft_ms for p in preds])),
                (self.params.tpot_weight, _norm([p.tpot_ms for p in preds])),
            ],
            len(preds),
        )
        return [1.0 - ci for ci in c]
