"""`token-load-scorer`: fewer tokens of work ahead (in flight + this request's own
uncached prompt) scores higher.

Score = 1 − min(1, (in-flight tokens + uncached prompt tokens of this request on the
endpoint) / queueThresholdTokens); the default threshold 4,194,304 is upstream's (128
requests × 32K tokens). In-flight tokens (uncached prompt until the first token, expected
output until the end) are counted by the EPP at pick time, so a burst is seen before any
scrape reports it.

The request's own term is llm-d-router's (`scorer/tokenload/token_load.go` adds the
in-flight-load producer's `CurrentRequestLoad` — now `UncachedRequestTokens` — to each
endpoint's `InFlightLoad`): an endpoint that caches the prompt owes less for it, so with
8,500-token prompts a cached server with a few requests in flight still scores above a cold
idle one, until its queue outweighs the prefill the cold one would pay. It is added only
when a prefix producer ran: without one the prompt costs every endpoint the same, which
changes no ranking. The prompt's length is the producer's token count when it counted
tokens, else characters / 4. With `evictionCost: true` the request's own term counts
1 + the endpoint's cache fill times, as the affinity filter's (`placement_tokens`): a cold
server whose cache is full evicts as much as it prefills.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo, placement_tokens


@dataclass(frozen=True)
class TokenLoadParams:
    queue_threshold_tokens: int = param(
        4_194_304, min=1, doc="tokens of work ahead at which an endpoint scores 0"
    )
    per_request_tokens: int = param(
        0, min=0, doc="tokens each request in flight adds to its endpoint's load (0: upstream's)"
    )
    eviction_cost: bool = param(
        False,
        doc="count this request's uncached prompt 1 + the endpoint's cache fill times",
    )


@register("token-load-scorer")
class TokenLoadScorer(Plugin):
    Params = TokenLoadParams

    def __init__(self, name: str, params: TokenLoadParams, handle: Handle) -> None:
        super().__init__(name)
        self.threshold = params.queue_threshold_tokens
        self.per_request = params.per_request_tokens
        self.eviction = params.eviction_cost

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[float]:
        t, k = self.threshold, self.per_request
        info: PrefixMatchInfo | None = state.read(PREFIX_MATCH_KEY)
        if info is None:
            loads = [e.inflight_tokens + k * e.inflight_requests for e in endpoints]
        else:  # this request's uncached prompt there (`placement_tokens`)
            own = placement_tokens(
                info,
                request.prompt_tokens_estimate,
                [e.endpoint.name for e in endpoints],  # not the `name` property: a call each
                self.eviction,
            )
            loads = [
                e.inflight_tokens + k * e.inflight_requests + u
                for e, u in zip(endpoints, own, strict=True)
            ]
        # 1 - min(1, load / t), without a call per endpoint (1,000 candidates)
        return [1.0 - (r if (r := x / t) < 1.0 else 1.0) for x in loads]
