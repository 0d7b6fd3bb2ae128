"""What a prefix producer tells its consumers, under one CycleState key.

Both the approximate index (what the EPP routed where) and the precise index (what the
servers' KV events say they hold) produce a `PrefixMatchInfo` under `PREFIX_MATCH_KEY`
(their `produces`), so scorers, the affinity filter, the no-hit LRU scorer and the P/D
decider read one shape whichever producer runs. A config has at most one of them (the
loader refuses two producers of one key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PREFIX_MATCH_KEY = "prefix-match"


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
    """

    total_blocks: int
    block_size_tokens: int
    matched: Mapping[str, float] = field(default_factory=dict)
    cached_blocks: Mapping[str, int] = field(default_factory=dict)
    chains: Mapping[int, Sequence[int]] = field(default_factory=dict)

    def score(self, endpoint_name: str) -> float:
        if self.total_blocks <= 0:
            return 0.0
        return min(1.0, self.matched.get(endpoint_name, 0.0) / self.total_blocks)

    def cached_tokens(self, endpoint_name: str) -> int:
        return self.cached_blocks.get(endpoint_name, 0) * self.block_size_tokens
