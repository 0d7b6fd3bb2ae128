"""`prefix-scorer` (upstream alias `prefix-cache-scorer`): the share of the request's
blocks an endpoint already caches, from the approximate prefix index.

Score = consecutive matched blocks from the start / total blocks (`PrefixMatchInfo.score`,
GIE `prefix-cache-scorer`: matchBlocks / totalBlocks; no info or no blocks → 0).

Its parameters are the producer's (`approx-prefix-cache-producer`): older upstream
configs set them on the scorer, and then they configure the producer the loader creates
for it. If a producer is configured as well, parameters on the scorer are an error
(they would be ignored).
"""

from __future__ import annotations

from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.prefix.approx_producer import APPROX_PRODUCER_TYPE, ApproxPrefixParams
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo


def scores_from(info: PrefixMatchInfo | None, endpoints: list[EndpointSnapshot]) -> list[float]:
    """`info.score(name)` per endpoint, computed once per matched endpoint (few) and
    looked up for the rest: at 1,000 endpoints one method call each was measurable."""
    if info is None or info.total_blocks <= 0 or not info.matched:
        return [0.0] * len(endpoints)
    total = info.total_blocks  # `info.score` inlined: min(1, matched / total)
    by_name = {n: m / total if m < total else 1.0 for n, m in info.matched.items()}
    get = by_name.get
    return [get(e.endpoint.name, 0.0) for e in endpoints]


@register("prefix-scorer", aliases=("prefix-cache-scorer",))
class PrefixScorer(Plugin):
    Params = ApproxPrefixParams
    producer_type = APPROX_PRODUCER_TYPE

    def __init__(self, name: str, params: ApproxPrefixParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        info = state.read(PREFIX_MATCH_KEY)
        return scores_from(info, endpoints)
