"""What a prefix producer tells its consumers, under one CycleState key.

Both the approximate index (what the EPP routed where) and the precise index (what the
servers' KV events say they hold) produce a `PrefixMatchInfo` under `PREFIX_MATCH_KEY`
(their `produces`), so scorers, the affinity filter, the no-hit LRU scorer and the P/D
decider read one shape whichever producer runs. A config has at most one of them (the
loader refuses two producers of one key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from epp.scheduling.types import PREFIX_MATCH_KEY  # declared by the framework, which reads it

__all__ = [
    "PREFIX_MATCH_KEY",
    "PrefixMatchInfo",
    "placement_tokens",
    "uncached_by_name",
    "uncached_prompt_tokens",
]


@dataclass(frozen=True, slots=True)
class PrefixMatchInfo:
    """Prefix matches of one request against every candidate endpoint.

    `total_blocks` counts the request's blocks (a trailing partial block included, as
    upstream); `matched[name]` is the score-bearing match length in blocks per endpoint,
    possibly tier-weighted (a CPU-tier block counts 0.8); `cached_blocks[name]` is the
    unweighted count of leading blocks the endpoint holds, which is what a P/D decider
    must use to count cached tokens (llm-d#1466 undercounted with the weighted one).
    `chains[block_size_tokens]` is the request's block-hash chain at each block size the
    producer matched, which its pre-request hook records for the picked endpoints.
    `prompt_tokens` is the prompt's length in tokens when the producer counted tokens
    (0 when it cut characters), which caps `cached_tokens` as vLLM caps a hit.
    `occupancy(names)`, when the producer can tell, is per endpoint the share of its KV
    blocks the index sees holding cached blocks (0 = room to spare, 1 = every new block evicts
    one): what `placement_tokens` charges for prefilling there.
    """

    total_blocks: int
    block_size_tokens: int
    matched: Mapping[str, float] = field(default_factory=dict)
    cached_blocks: Mapping[str, int] = field(default_factory=dict)
    chains: Mapping[int, Sequence[int]] = field(default_factory=dict)
    prompt_tokens: int = 0
    occupancy: Callable[[Sequence[str]], list[float]] | None = None

    def score(self, endpoint_name: str) -> float:
        if self.total_blocks <= 0:
            return 0.0
        return min(1.0, self.matched.get(endpoint_name, 0.0) / self.total_blocks)

    def names_scoring_at_least(self, threshold: float) -> frozenset[str]:
        """The endpoints whose `score` is >= `threshold` (> 0): only matched ones can be,
        so a filter need not call `score` for each of 1,000 candidates."""
        total = self.total_blocks
        if total <= 0:
            return frozenset()
        # `score` inlined (one call per matched endpoint per request): min(1, m / total)
        return frozenset(
            [n for n, m in self.matched.items() if (m / total if m < total else 1.0) >= threshold]
        )

    def fill(self, endpoint_name: str) -> float:
        """One endpoint's `occupancy`, clamped to [0, 1]; 0 when the producer does not tell."""
        if self.occupancy is None:
            return 0.0
        return min(1.0, max(0.0, self.occupancy([endpoint_name])[0]))

    def request_tokens(self, estimate: int) -> int:
        """The prompt's length for cost estimates: the producer's token count when it
        counted tokens, else `estimate` (the request's characters / 4). With a chat template
        the two differ by the template and the tokenizer (~500 tokens counted as ~450), and
        the cached tokens they are set against are counted, not estimated."""
        return self.prompt_tokens if self.prompt_tokens > 0 else max(0, estimate)

    def cached_tokens(self, endpoint_name: str) -> int:
        """Tokens the endpoint will serve from its cache: its leading cached blocks, at
        most the full blocks before the prompt's last token — vLLM always computes the
        last token (`KVCacheManager.get_computed_blocks` looks up at most
        `num_tokens - 1` tokens), so a fully cached 64-token prompt at block size 32 hits
        32 tokens, not 64. This is the `usage.prompt_tokens_details.cached_tokens` the
        server reports."""
        blocks = self.cached_blocks.get(endpoint_name, 0)
        if self.prompt_tokens > 0:
            blocks = min(blocks, (self.prompt_tokens - 1) // self.block_size_tokens)
        return blocks * self.block_size_tokens


def uncached_by_name(info: PrefixMatchInfo, prompt_tokens: int) -> dict[str, int]:
    """`uncached_prompt_tokens` for the endpoints with a match only; every other endpoint
    prefills the whole prompt, `max(0, prompt_tokens)`. For callers that fold the lookup
    into their own pass over 1,000 candidates."""
    # `cached_tokens` inlined (one call per matched endpoint, up to 3 times per request)
    size = info.block_size_tokens
    if info.prompt_tokens > 0:
        cap = (info.prompt_tokens - 1) // size  # the blocks before the prompt's last token
        return {
            n: max(0, prompt_tokens - (b if b < cap else cap) * size)
            for n, b in info.cached_blocks.items()
        }
    return {n: max(0, prompt_tokens - b * size) for n, b in info.cached_blocks.items()}


def uncached_prompt_tokens(
    info: PrefixMatchInfo, prompt_tokens: int, names: Sequence[str]
) -> list[int]:
    """Per endpoint, the prompt tokens it would have to prefill for this request: the
    prompt less what it caches (`cached_tokens`). llm-d's in-flight-load producer computes
    the same per endpoint (`UncachedRequestTokens`, formerly `CurrentRequestLoad`), which
    its `token-load-scorer` adds to each endpoint's in-flight tokens. Only endpoints with a
    match are computed; the rest (most of 1,000 candidates) are one dict lookup each."""
    whole = max(0, prompt_tokens)
    get = uncached_by_name(info, prompt_tokens).get
    return [get(name, whole) for name in names]


def placement_tokens(
    info: PrefixMatchInfo, estimate: int, names: Sequence[str], eviction: bool
) -> list[float]:
    """Per endpoint, what placing this request there costs in prompt tokens: its uncached
    prompt there (`request_tokens` less `cached_tokens`) and, with `eviction`, as many
    again times the endpoint's `fill`: on a server whose KV cache is full of cached
    prefixes every block this prefill writes evicts one that a later request would have
    hit, so a cold full server costs the pool about twice the prefill, a cached one
    nothing more. Without the term a group whose server is one request busier moves to
    an idle server that must evict other groups to hold it, and under KV pressure that
    cascades (docs/BENCHMARKS.md, "Prefix hit rates on real vLLM servers"). Only matched endpoints
    cost less than the whole prompt; the rest are one dict lookup each."""
    whole = info.request_tokens(estimate)
    get = uncached_by_name(info, whole).get
    if not eviction or info.occupancy is None:
        return [get(n, whole) for n in names]
    fills = info.occupancy(names)
    return [
        u * (1.0 + (f if f < 1.0 else 1.0)) if (u := get(n, whole)) else 0
        for n, f in zip(names, fills, strict=True)
    ]
