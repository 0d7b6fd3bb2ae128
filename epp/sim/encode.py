"""The `encode` role: a server that only runs the vision/audio encoder over a request's
media and keeps the result in its encoder cache, as a vLLM encoder instance of an
encode/prefill/decode deployment does (vLLM's disaggregated encoder: the instance runs
with an `ec_producer` EC connector; the proxy sends it the request with one output
token, then sends the request on to prefill/decode, which load the embeddings).

Each media item not in the encoder cache costs `--encode-ms-per-item` model ms, one
request at a time (the encoder is one batch); an item already there (same identifier,
`epp.sim.chat.media_items`) costs nothing. The cache holds `--encoder-cache-items`
items, least recently used dropped first (vLLM's `EncoderCacheManager` keys by
`mm_hash` and evicts unreferenced entries). The answer is one token, as vLLM's.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable

from epp.sim.clock import ModelClock


class EncoderCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def add(self, key: str) -> None:
        self._items[key] = None
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


class Encoder:
    """Encodes the items of one request at a time; returns (encoded, cache hits)."""

    def __init__(self, clock: ModelClock, ms_per_item: float, capacity: int) -> None:
        self.clock = clock
        self.ms_per_item = ms_per_item
        self.cache = EncoderCache(capacity)
        self._lock = asyncio.Lock()

    async def encode(self, identifiers: Iterable[str]) -> tuple[int, int]:
        async with self._lock:
            missing = []
            hits = 0
            for key in identifiers:
                if key in self.cache or key in missing:
                    hits += 1
                else:
                    missing.append(key)
            if missing:
                await self.clock.sleep(len(missing) * self.ms_per_item / 1000.0)
            for key in missing:
                self.cache.add(key)
            return len(missing), hits
