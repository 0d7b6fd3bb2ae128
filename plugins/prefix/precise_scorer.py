"""`precise-prefix-cache-scorer`: the share of the request's blocks an endpoint holds,
from the servers' own KV events (`precise-prefix-cache-producer`).

Score = tier-weighted longest consecutive prefix the endpoint holds / the prompt's full
blocks (llm-d scheduler PR #1107: `clip(raw / totalBlocks, 0, 1)`), so a cold pool
scores 0 everywhere rather than 1 (the old min–max normalisation did the latter).

Like `prefix-scorer`, its parameters are its producer's: without a configured producer
they configure the one the loader creates; with one, they are an error.
"""

from __future__ import annotations

from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.prefix.match_info import PREFIX_MATCH_KEY
from plugins.prefix.precise_producer import PRECISE_PRODUCER_TYPE, PrecisePrefixParams
from plugins.prefix.prefix_scorer import scores_from


@register("precise-prefix-cache-scorer")
class PrecisePrefixCacheScorer(Plugin):
    Params = PrecisePrefixParams
    producer_type = PRECISE_PRODUCER_TYPE

    def __init__(self, name: str, params: PrecisePrefixParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        info = state.read(PREFIX_MATCH_KEY)
        return scores_from(info, endpoints)
