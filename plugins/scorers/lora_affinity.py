"""`lora-affinity-scorer`: prefer endpoints where the LoRA adapter is, or can be, loaded.

Upstream's values and order (GIE / llm-d-router
`pkg/epp/framework/plugins/scheduling/scorer/loraaffinity/lora_affinity.go`), from the
endpoint's `vllm:lora_requests_info` (running and waiting adapters, `max_lora`):

    adapter running there                          → 1.0
    len(running) + len(waiting) < max_lora         → 0.8  (a slot is free to load it)
    adapter waiting there                          → 0.6
    otherwise                                      → 0.0  (full: it would queue for a slot)

The capacity branch is checked *before* the waiting one, as upstream: an endpoint with a
free slot outranks one where the adapter already queues (the queued one must first wait
for a slot; the free one loads at once).

Base-model requests are neutral. vLLM's metrics do not say which served model is the base
(its `/v1/models` lists adapters too), so a request counts as a LoRA request when its
target model is running or waiting on some candidate now, or was on an earlier request
(a bounded memory of adapter names, so an adapter idle everywhere is still recognised).
Any other request — the base model, or an adapter never yet seen running — scores 0.0 on
every endpoint: equal scores change no pick, and 0 (what upstream gives every endpoint of
a pool without LoRA metrics) leaves weighted-random lotteries unchanged too. Upstream
instead scores a base-model request 0.8/0.0 by free adapter slots, which only skews it.
"""

from __future__ import annotations

from epp.config.params import NoParams
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState

# How many adapter names are remembered; the oldest-learned is forgotten first. Far above
# any real pool's adapter count, small enough that memory stays bounded.
MAX_KNOWN_ADAPTERS = 4096

ACTIVE, FREE_SLOT, WAITING, FULL = 1.0, 0.8, 0.6, 0.0
NEUTRAL = 0.0


@register("lora-affinity-scorer")
class LoraAffinityScorer(Plugin):
    Params = NoParams

    def __init__(self, name: str, params: NoParams, handle: Handle) -> None:
        super().__init__(name)
        self._adapters: dict[str, None] = {}  # insertion-ordered set of known adapter names

    def is_adapter(self, model: str, endpoints: list[EndpointSnapshot]) -> bool:
        """True if `model` is a LoRA adapter: named in some candidate's LoRA metrics now or
        on an earlier request."""
        if model in self._adapters:
            return True
        for e in endpoints:
            m = e.metrics
            if model in m.active_models or model in m.waiting_models:
                self._adapters[model] = None
                if len(self._adapters) > MAX_KNOWN_ADAPTERS:
                    del self._adapters[next(iter(self._adapters))]
                return True
        return False

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        model = request.target_model
        if not model or not self.is_adapter(model, endpoints):
            return [NEUTRAL] * len(endpoints)
        out = []
        for e in endpoints:
            m = e.metrics
            if model in m.active_models:
                out.append(ACTIVE)
            elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
                out.append(FREE_SLOT)
            elif model in m.waiting_models:
                out.append(WAITING)
            else:
                out.append(FULL)
        return out
