"""Saturation detectors: is the pool too busy to take more sheddable work?

Both are upstream's (gie-epp.md §5.3), and, as upstream, both are also filters:

- `utilization-detector` (GIE's default detector): per endpoint
  `max(waiting / queueDepthThreshold, KV use / kvCacheUtilThreshold)`, metrics older than
  `metricsStalenessThreshold` (or never scraped) count as 1.0; the pool's saturation is
  the mean over the candidates (none → 1.0). As a filter it keeps endpoints with fresh
  metrics, `waiting < Qthr·(1+headroom)` and `KV < KVthr·(1+headroom)`, and keeps all if
  none passes (fail-open, as upstream).
- `concurrency-detector`: from the EPP's own in-flight counts, so a burst is seen before
  any scrape: saturation = Σ in-flight / Σ capacity, capacity `maxConcurrency` requests
  (or `maxTokenConcurrency` tokens with `concurrencyMode: tokens`) per endpoint. As a
  filter it keeps endpoints under `limit·(1+headroom)`, with no fail-open (upstream).

A saturation ≥ 1.0 means saturated: `epp/admission.py` (its `SaturationDetector` protocol)
then sheds sheddable requests.
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


@dataclass(frozen=True)
class UtilizationParams:
    queue_depth_threshold: int = param(5, min=1, doc="waiting requests that count as full")
    kv_cache_util_threshold: float = param(
        0.8, min=0.0, max=1.0, doc="KV-cache use that counts as full"
    )
    metrics_staleness_threshold: float = param(
        0.2, min=0.0, doc="seconds: older metrics count as saturated (upstream 200ms)"
    )
    headroom: float = param(0.0, min=0.0, doc="filter only: thresholds × (1 + headroom)")


@register("utilization-detector")
class UtilizationDetector(Plugin):
    Params = UtilizationParams

    def __init__(self, name: str, params: UtilizationParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.clock = handle.clock

    def _fresh(self, e: EndpointSnapshot, now: float) -> bool:
        t = e.metrics.update_time
        return t > 0 and now - t <= self.params.metrics_staleness_threshold

    def endpoint_saturation(self, e: EndpointSnapshot, now: float) -> float:
        if not self._fresh(e, now):
            return 1.0
        p, m = self.params, e.metrics
        return max(
            m.waiting_queue_size / p.queue_depth_threshold,
            m.kv_cache_usage / p.kv_cache_util_threshold if p.kv_cache_util_threshold else 1.0,
        )

    def saturation(self, endpoints: Sequence[EndpointSnapshot]) -> float:
        if not endpoints:
            return 1.0
        now = self.clock()
        return sum(self.endpoint_saturation(e, now) for e in endpoints) / len(endpoints)

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[EndpointSnapshot]:
        p, now = self.params, self.clock()
        q_max = p.queue_depth_threshold * (1 + p.headroom)
        kv_max = p.kv_cache_util_threshold * (1 + p.headroom)
        kept = [
            e
            for e in endpoints
            if self._fresh(e, now)
            and e.metrics.waiting_queue_size < q_max
            and e.metrics.kv_cache_usage < kv_max
        ]
        return kept or endpoints


@dataclass(frozen=True)
class ConcurrencyParams:
    concurrency_mode: str = param(
        "requests", choices=("requests", "tokens"), doc="count in-flight requests or tokens"
    )
    max_concurrency: int = param(
        100, min=1, doc="in-flight requests per endpoint at saturation (≈ 1.1 × max batch)"
    )
    max_token_concurrency: int = param(
        1_000_000, min=1, doc="in-flight tokens per endpoint at saturation (tokens mode)"
    )
    headroom: float = param(0.0, min=0.0, doc="filter only: limit × (1 + headroom)")


@register("concurrency-detector")
class ConcurrencyDetector(Plugin):
    Params = ConcurrencyParams

    def __init__(self, name: str, params: ConcurrencyParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.tokens = params.concurrency_mode == "tokens"
        self.limit = params.max_token_concurrency if self.tokens else params.max_concurrency

    def _load(self, e: EndpointSnapshot) -> int:
        return e.inflight_tokens if self.tokens else e.inflight_requests

    def saturation(self, endpoints: Sequence[EndpointSnapshot]) -> float:
        if not endpoints:
            return 1.0
        return sum(self._load(e) for e in endpoints) / (self.limit * len(endpoints))

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[EndpointSnapshot]:
        cap = self.limit * (1 + self.params.headroom)
        return [e for e in endpoints if self._load(e) < cap]
