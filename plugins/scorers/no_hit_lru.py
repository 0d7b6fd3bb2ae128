"""`no-hit-lru-scorer`: spread cold requests (no prefix hit anywhere) least-recently-used first.

A cold request creates new KV blocks wherever it lands; sending cold requests round the
pool in LRU order grows every endpoint's cache evenly. llm-d-router
`pkg/epp/framework/plugins/scheduling/scorer/nohitlru/no_hit_lru.go`:

- cold request: endpoints that never took a cold request first, in candidate order,
  `1 − i/(N−1)`; then the used ones, least recently used first,
  `1 − (neverUsed + lruPos)/(N−1)`; a single candidate scores 1.0;
- warm request (some candidate has a prefix hit): 0.5 everywhere, neutral, so the prefix
  scorer decides;
- the LRU of cold-request recipients is updated at pre-request with the first target of
  the primary profile and of a profile named `prefill` (llm-d hard-codes that name), and
  holds at most `lruSize` endpoints.

"Cold" is judged over the candidates this scorer is given, as upstream: no
`PrefixMatchInfo` in the cycle (no prefix producer configured) counts as cold, so without
a producer the scorer simply round-robins in LRU order. The cold/warm verdict is passed
from scoring to pre-request through the CycleState.

One deviation: `lruPos` here is the rank among the *candidates* that are in the LRU;
upstream uses the position in the whole LRU (and clamps at 0), so endpoints outside this
candidate set (departed ones, or the other role's in P/D) push used candidates down to a
tied 0. With every LRU entry among the candidates the two are equal.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, SchedulingResult
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo

NEUTRAL = 0.5
PREFILL_PROFILE = "prefill"


@dataclass(frozen=True)
class NoHitLruParams:
    lru_size: int = param(1024, min=1, doc="endpoints remembered in the cold-request LRU")
    prefix_plugin_type: str = param(
        "prefix-cache-scorer", doc="accepted for llm-d configs and ignored (unused upstream too)"
    )
    prefix_plugin_name: str = param(
        "prefix-cache-scorer", doc="accepted for llm-d configs and ignored (unused upstream too)"
    )


def _is_cold(info: PrefixMatchInfo | None, endpoints: list[EndpointSnapshot]) -> bool:
    if info is None:
        return True
    matched, cached = info.matched, info.cached_blocks
    return not any(matched.get(e.name, 0) > 0 or cached.get(e.name, 0) > 0 for e in endpoints)


@register("no-hit-lru-scorer")
class NoHitLruScorer(Plugin):
    Params = NoHitLruParams

    def __init__(self, name: str, params: NoHitLruParams, handle: Handle) -> None:
        super().__init__(name)
        self.lru_size = params.lru_size
        self._lru: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._cold_key = f"{name}/cold"

    def lru_order(self) -> list[str]:
        """Endpoints that took cold requests, least recently used first."""
        return list(self._lru)

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        cold = _is_cold(state.read(PREFIX_MATCH_KEY), endpoints)
        state.write(self._cold_key, cold)
        n = len(endpoints)
        if not cold:
            return [NEUTRAL] * n
        if n == 1:
            return [1.0]
        lru = self._lru
        index = {e.name: i for i, e in enumerate(endpoints)}
        never_used = [i for i, e in enumerate(endpoints) if e.name not in lru]
        used = [index[name] for name in lru if name in index]  # least recently used first
        scores = [0.0] * n
        for rank, i in enumerate(never_used + used):
            scores[i] = 1.0 - rank / (n - 1)
        return scores

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        if not result.cycle_state.read(self._cold_key, False):
            return
        for profile in (result.primary_profile, PREFILL_PROFILE):
            picked = result.profile_results.get(profile)
            if picked is not None and picked.targets:
                self._touch(picked.targets[0].name)

    def _touch(self, endpoint: str) -> None:
        self._lru[endpoint] = None
        self._lru.move_to_end(endpoint)
        while len(self._lru) > self.lru_size:
            self._lru.popitem(last=False)
