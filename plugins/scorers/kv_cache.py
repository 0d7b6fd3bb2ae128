"""`kv-cache-utilization-scorer` (upstream alias `kv-cache-scorer`): 1 − KV-cache usage."""

from __future__ import annotations

from epp.config.params import NoParams
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState


@register("kv-cache-utilization-scorer", aliases=("kv-cache-scorer",))
class KVCacheUtilizationScorer(Plugin):
    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        return [1.0 - e.metrics.kv_cache_usage for e in endpoints]
