"""`prefix-cache-affinity-filter`: narrow to endpoints that already hold the prompt, unless
that costs too much waiting.

A prefix scorer with the max-score picker piles every similar prompt onto one endpoint; with
a random picker it loses the cache. This filter keeps only the "sticky" endpoints (prefix
score ≥ `affinityThreshold`) and lets later scorers and the picker spread load among them,
with two valves (llm-d-router `pkg/epp/framework/plugins/scheduling/filter/
prefixcacheaffinity/plugin.go`, whose behaviour and defaults these are):

- exploration: with probability `explorationProbability` keep everything, so other
  endpoints get to warm up their caches (llm-d's default 0 — off; GIE's is 0.01);
- the TTFT load gate: each endpoint's TTFT is estimated as
  `load tokens / peakPrefillThroughput × 1000` ms (llm-d's formula); if the best sticky
  estimate exceeds the best non-sticky one by more than `maxTTFTPenaltyMs`, keep
  everything (stickiness broken). 0 turns the gate off (always stick).

The load tokens are chosen by `loadSignal`:

- `prefill` (llm-d's): the prompt tokens of requests that have not had their first token.
  Blind to decode: a server busy generating long outputs looks idle, so on decode-bound
  traffic one cached prefix keeps drawing requests (llm-d issue #355's "few unique
  prefixes" hot spot).
- `live` ("sticky until saturated", config/prefix-aware.yaml): everything the server still
  owes, as the EPP counts it — in-flight uncached prompt tokens plus the expected output
  tokens of requests still generating (`EndpointSnapshot.inflight_tokens`, what
  `token-load-scorer` spreads) — plus `queuedRequestTokens` for every request on it: each
  one the EPP has in flight and each one in the scraped waiting queue (load this EPP did
  not send: another replica, direct clients). The per-request term is what a cached
  request still costs: its prefill is nearly free, but its sequence takes a batch slot and
  every decode step reads its whole context, so 200 cached requests are not 200 × nothing
  (without it a one-prefix burst piles onto one server). The EPP's own queued requests are
  counted twice, which only makes a queueing server give up stickiness sooner.

With `includeRequest: true` each endpoint's estimate also counts the prompt tokens *this*
request would prefill there (its uncached part: next to nothing on a cached server, all of
it on a cold one), so the gate compares the TTFT the request would actually see on either
side — the cached server's queue against the cold server's prefill of the whole prompt.
llm-d's released filter reads only the in-flight tokens (`plugin.go` `endpointTTFT`); its
token-load scorer already adds the request's `UncachedRequestTokens`, and a proposed change
to the filter ("include the current request's endpoint-specific uncached prompt work in
throughput-based TTFT estimates") adds the same term here. Without it, with 8,500-token
prompts the gate opened to an empty server as soon as the cached one had 250 ms of work,
though the empty one would spend 530 ms prefilling (long-context).

With `cachedPenaltyFactor: k` > 0 the penalty is also capped at k times what the cache
is worth to this request: the prefill time of the sticky endpoints' cached prefix (cached
tokens / peakPrefillThroughput). On short prompts (150 tokens: 9 ms of prefill) the gate
then opens as soon as a cached server is a few requests busier than a cold one, instead
of queueing up to 250 ms behind a KV cache that holds 7 sequences (docs/BENCHMARKS.md,
decode-bound); a 2,000-token prefix at k = 2 (251 ms) or an 8,000-token document keeps the
full penalty. k = 1 was too tight where prefixes outgrow the pool's KV cache: capping
2,000-token prefixes at 131 ms spread groups over servers that evict them (virtual
kv-pressure at 75 req/s: TTFT p90 167 ms → 1.8 s). k > 1 also stands for the requests
after this one that find the prefix where it is.

With `evictionCost: true` (and `includeRequest`) this request's uncached prompt on each
endpoint counts 1 + that endpoint's cache fill times (`placement_tokens`): on a server
whose KV cache is full of cached prefixes, each block it prefills evicts one a later
request would hit. On 3 real vLLM servers with 10 groups' prefixes in 3 × 64 blocks, the
gate opened whenever a group's server had one prefill more in flight than an idle one
(1 request × 1,024 + ~450 prompt tokens against a ~500-token prefix), the group moved, its
second copy evicted other groups, and the pool kept 0.79-0.90 of the ideal hit rate; with
the term, 0.96 (docs/BENCHMARKS.md). An empty cold server (fill 0) costs what it did.

No sticky endpoint, fewer than two candidates, or no `PrefixMatchInfo` in the cycle (no
prefix producer configured) → all kept. The defaults are llm-d's consistent set, since the
TTFT estimate is llm-d's: 15,928 tok/s is Qwen 32B on 2×H100 (TP 2) with vLLM 0.19, so
retune it per deployment. GIE's variant (exploration 0.01, penalty 5,000 ms) takes TTFT
from a latency predictor this EPP does not have. The prefill tokens are, as in llm-d, the
uncached prompt tokens of requests that have not had their first token yet: the director
counts a routed prompt minus what the prefix producer predicts the pick holds in cache, and
the response path releases it at the first token.
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

_QUEUED_DEFAULT = 1024  # a typical chat prompt; only `live` reads it


@dataclass(frozen=True)
class PrefixAffinityParams:
    affinity_threshold: float = param(
        0.80, min=0.0, max=1.0, doc="prefix score at which an endpoint is sticky"
    )
    exploration_probability: float = param(
        0.0, min=0.0, max=1.0, doc="chance of keeping every endpoint anyway"
    )
    max_ttft_penalty_ms: float = param(
        18000.0,
        min=0.0,
        aliases=("maxTTFTPenaltyMs",),  # llm-d's spelling
        doc="break stickiness when the best sticky TTFT exceeds the best other by more; 0 = off",
    )
    peak_prefill_throughput: float = param(
        15928.0, min=0.0, doc="tokens/s one endpoint prefills; TTFT = in-flight tokens / this"
    )
    load_signal: str = param(
        "prefill",
        choices=("prefill", "live"),
        doc="gate load: prefill = in-flight prompt tokens (llm-d); live = + decode + queue",
    )
    queued_request_tokens: int = param(
        _QUEUED_DEFAULT,
        min=0,
        doc="tokens each in-flight or scraped waiting request adds to the live load",
    )
    include_request: bool = param(
        False,
        doc="add this request's uncached prompt tokens on each endpoint to its TTFT estimate",
    )
    cached_penalty_factor: float = param(
        0.0,
        min=0.0,
        doc="cap maxTTFTPenaltyMs at this many times the cached prefix's prefill time; 0 = off",
    )
    eviction_cost: bool = param(
        False,
        doc="with includeRequest, count the request's uncached prompt 1 + cache fill times",
    )
    ttft_source: str = param(
        "prefillThroughput",
        choices=("prefillThroughput",),
        doc="where TTFT comes from (llm-d's latencyPredictor is not implemented)",
    )

    def validate(self) -> None:
        if self.load_signal != "live" and self.queued_request_tokens != _QUEUED_DEFAULT:
            raise ValueError("queuedRequestTokens is read only with loadSignal: live; set both")
        if self.max_ttft_penalty_ms > 0 and self.peak_prefill_throughput <= 0:
            raise ValueError("peakPrefillThroughput must be > 0 while maxTTFTPenaltyMs is > 0")
        if self.eviction_cost and not self.include_request:
            raise ValueError("evictionCost weighs the request's own prompt: set includeRequest")


@register("prefix-cache-affinity-filter")
class PrefixCacheAffinityFilter(Plugin):
    Params = PrefixAffinityParams

    def __init__(self, name: str, params: PrefixAffinityParams, handle: Handle) -> None:
        super().__init__(name)
        self.threshold = params.affinity_threshold
        self.exploration = params.exploration_probability
        self.max_penalty_ms = params.max_ttft_penalty_ms
        self.peak = params.peak_prefill_throughput
        self.live = params.load_signal == "live"
        self.queued_tokens = params.queued_request_tokens
        self.include_request = params.include_request
        self.cached_penalty_factor = params.cached_penalty_factor
        self.eviction = params.eviction_cost
        self.rng = handle.rng

    def load_tokens(self, endpoint: EndpointSnapshot) -> int:
        """The work ahead of a new request on `endpoint`, in tokens (see `loadSignal`)."""
        if not self.live:
            return endpoint.inflight_prefill_tokens
        requests = endpoint.metrics.waiting_queue_size + endpoint.inflight_requests
        return endpoint.inflight_tokens + requests * self.queued_tokens

    def ttft_ms(self, endpoint: EndpointSnapshot) -> float:
        """Estimated time to first token: the load tokens ahead of it, prefilled at peak."""
        return self.load_tokens(endpoint) / self.peak * 1000.0

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> list[EndpointSnapshot]:
        info: PrefixMatchInfo | None = state.read(PREFIX_MATCH_KEY)
        if info is None or len(endpoints) <= 1 or self.threshold <= 0:
            return endpoints
        names = info.names_scoring_at_least(self.threshold)
        if not names:
            return endpoints
        sticky = [e for e in endpoints if e.endpoint.name in names]
        if not sticky:
            return endpoints
        other = [e for e in endpoints if e.endpoint.name not in names]
        # Drawn only when it can matter, so a config without exploration uses no randomness.
        if self.exploration > 0 and self.rng.random() < self.exploration:
            return endpoints
        if self.max_penalty_ms > 0 and other:
            prompt = request.prompt_tokens_estimate if self.include_request else 0
            best_sticky = self.best_ttft_ms(info, prompt, sticky)
            best_other = self.best_ttft_ms(info, prompt, other)
            if best_sticky - best_other > self.penalty_ms(info, sticky):
                return endpoints
        return sticky

    def penalty_ms(self, info: PrefixMatchInfo, sticky: list[EndpointSnapshot]) -> float:
        """The TTFT a request may lose by sticking: `maxTTFTPenaltyMs`, at most
        `cachedPenaltyFactor` times the prefill time of the longest cached prefix among the
        sticky endpoints (when > 0): a 150-token prompt is not worth queueing 250 ms for,
        an 8,000-token document is."""
        if self.cached_penalty_factor <= 0:
            return self.max_penalty_ms
        cached = max(info.cached_tokens(e.name) for e in sticky)
        cap = self.cached_penalty_factor * cached / self.peak * 1000.0
        return min(self.max_penalty_ms, cap)

    def best_ttft_ms(
        self, info: PrefixMatchInfo, prompt: int, endpoints: list[EndpointSnapshot]
    ) -> float:
        """The lowest estimated TTFT among `endpoints`, each counting this request's own
        uncached prompt tokens there when `prompt` > 0 (`includeRequest`)."""
        # One pass of plain attribute reads (`load_tokens` inlined), and the minimum taken
        # on tokens: x / peak * 1000 is monotonic, so the least load is the least TTFT,
        # bit for bit (1,000 candidates per request).
        if prompt > 0:
            own = placement_tokens(
                info, prompt, [e.endpoint.name for e in endpoints], self.eviction
            )
        else:
            own = [0] * len(endpoints)
        if self.live:
            q = self.queued_tokens
            loads = [
                e.inflight_tokens + (e.metrics.waiting_queue_size + e.inflight_requests) * q + u
                for e, u in zip(endpoints, own, strict=True)
            ]
        else:
            loads = [e.inflight_prefill_tokens + u for e, u in zip(endpoints, own, strict=True)]
        return min(loads) / self.peak * 1000.0
