"""OpenAI's `prompt_cache_key` as a prefix-routing hint.

A client that sends `prompt_cache_key` says its requests with that key share a prefix
(OpenAI's field "to optimize cache hit rates"; one conversation, one tenant's system
prompt). When the prefix index has no evidence for a request at all (no endpoint holds
any of its blocks: the index was pruned or restarted, the shared part is shorter than a
block, another EPP replica routed the earlier requests), the hint stands in for it: the
endpoint that took the key's last request is taken to hold that request's blocks, up to
this prompt's last block. The match then goes through the same gates as a real one
(the prefix-cache-affinity filter keeps it only while that endpoint is not saturated);
any index evidence at all wins over the hint.

Keys are scoped by target model and bounded in number (least recently used dropped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from epp.request import InferenceRequest

DEFAULT_CAPACITY = 100_000


class CacheKeyHint:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        # (model, key) → (endpoint name, blocks of the key's last request)
        self._last: OrderedDict[tuple[str, str], tuple[str, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def match(
        self, request: InferenceRequest, names: Iterable[str], total_blocks: int
    ) -> dict[str, int]:
        """{endpoint: blocks} the hint stands for, {} when it has nothing to say.
        Call only when the index found no match at all."""
        key = request.prompt_cache_key
        if key is None or total_blocks <= 1:
            return {}
        entry = self._last.get((request.target_model or request.model, key))
        if entry is None or entry[0] not in names:
            return {}
        return {entry[0]: min(entry[1], total_blocks - 1)}

    def learn(self, request: InferenceRequest, endpoint: str, blocks: int) -> None:
        key = request.prompt_cache_key
        if key is None:
            return
        scoped = (request.target_model or request.model, key)
        self._last[scoped] = (endpoint, blocks)
        self._last.move_to_end(scoped)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)
