"""The replay's fast path for traces whose prompts share no prefix block (ServeGen and the
Azure traces: no `hash_ids`), where the approximate prefix index can only count.

In such a replay every prompt's first token names its request (`routing.EppRouter._prompt`),
so every block-hash chain is new from its first block: the index never matches anything
(every `match` is empty, the affinity filter keeps every endpoint, the prefix scorer gives
0) and what it holds per endpoint is a count of blocks, `min(capacity, blocks added)`, which
is all `fills` (the eviction cost of `token-load-scorer` and the affinity filter) reads.
So the producer's chain is replaced by its length and the index by that count:
`UniqueChainIndex` answers every read `ApproxPrefixIndex` answers, equally, for chains that
never repeat. The producer, its metrics and every other plugin run as configured.

Hashing a prompt's blocks and moving them through a per-endpoint LRU was a tenth of a
ServeGen day's replay. The path is taken only for configs whose plugins all read the
prefix match through `PrefixMatchInfo`'s counts (`SAFE_TYPES`); any other config, or a
trace with shared blocks, routes through the real index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from epp.config.loader import LoadedConfig
from epp.request import InferenceRequest
from plugins.prefix.approx_producer import APPROX_PRODUCER_TYPE, ApproxPrefixCacheProducer

# Plugin types checked to read a prefix match only as counts (total blocks, matched and
# cached blocks per endpoint, occupancy, prompt tokens), never the chain's hash values.
SAFE_TYPES = frozenset(
    {
        APPROX_PRODUCER_TYPE,
        "prefix-cache-affinity-filter",
        "token-load-scorer",
        "prefix-scorer",
        "max-score-picker",
        "single-profile-handler",
    }
)


class UniqueChainIndex:
    """`ApproxPrefixIndex`'s reads and writes for chains that never repeat: per endpoint
    the number of blocks it holds (each chain adds all of its blocks, LRU eviction keeps
    the capacity), and no match ever."""

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError("LRU capacity must be at least 1")
        self.default_capacity = default_capacity
        self._held: dict[str, int] = {}
        self._capacity: dict[str, int] = {}
        self._entries = 0

    def add(self, endpoint: str, hashes: Sequence[int], capacity: int | None = None) -> None:
        if capacity is not None and capacity > 0:
            self._capacity[endpoint] = capacity
        cap = self._capacity.get(endpoint, self.default_capacity)
        before = self._held.get(endpoint, 0)
        held = before + len(hashes)
        held = self._held[endpoint] = held if held < cap else cap
        self._entries += held - before

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        return {}

    def remove_endpoint(self, endpoint: str) -> None:
        held = self._held.pop(endpoint, None)
        if held is not None:
            self._capacity.pop(endpoint, None)
            self._entries -= held

    def retain(self, endpoints: Iterable[str]) -> list[str]:
        keep = set(endpoints)
        gone = [name for name in self._held if name not in keep]
        for name in gone:
            self.remove_endpoint(name)
        return gone

    def capacity(self, endpoint: str) -> int:
        return self._capacity.get(endpoint, self.default_capacity)

    def fills(self, endpoints: Sequence[str]) -> list[float]:
        held, cap, default = self._held, self._capacity, self.default_capacity
        return [held[n] / cap.get(n, default) if n in held else 0.0 for n in endpoints]

    def endpoint_size(self, endpoint: str) -> int:
        return self._held.get(endpoint, 0)

    @property
    def endpoints(self) -> list[str]:
        return list(self._held)

    @property
    def size(self) -> int:
        return self._entries

    @property
    def distinct_hashes(self) -> int:
        return self.size


def install(config: LoadedConfig) -> bool:
    """Put the approximate producer of `config` on the count (module doc) if every plugin
    of the config is one of `SAFE_TYPES`; returns whether it did."""
    plugins = config.plugins.values()
    if any(getattr(p, "type_name", None) not in SAFE_TYPES for p in plugins):
        return False
    producers = [p for p in plugins if isinstance(p, ApproxPrefixCacheProducer)]
    if len(producers) != 1 or producers[0].index.size:
        return False
    producer = producers[0]
    producer.index = UniqueChainIndex(producer.params.lru_capacity_per_server)  # type: ignore[assignment]
    original = producer.hashes

    def hashes(
        request: InferenceRequest, block_tokens: int, ids: list[int] | None = None
    ) -> Sequence[int]:
        """The chain's length, as `chain_tokens` would cut it: ceil(tokens / block)
        blocks up to the producer's cap, none for a prompt shorter than one block."""
        if ids is None:
            ids = producer.token_ids(None, request)
        if ids is None:  # a text prompt (the replay sends ids): hash it as configured
            return original(request, block_tokens, ids)
        n = len(ids)
        if n < block_tokens:
            return range(0)
        return range(min(-(-n // block_tokens), producer.max_blocks(block_tokens)))

    producer.hashes = hashes  # type: ignore[method-assign]
    return True
