"""The approximate prefix index: which endpoints were sent which block hashes.

Upstream's indexer (GIE `approximateprefix/indexer.go`) keeps `hash → set of pods` plus
one LRU of hashes per pod; evicting a hash from a pod's LRU removes the pod from that
hash's set, and an empty set is dropped. This keeps the same two structures, with two
representation changes for memory and speed in Python:

- the set of endpoints holding a hash is a bitmask over endpoint slots (an int): a
  Python `set` costs ≥ 216 bytes, i.e. over 100 MB at upstream's sizing of 16 endpoints
  × 31,250 blocks, while a small int is shared or 28–36 bytes;
- a request's hashes are inserted last block first, so its leading blocks end up most
  recently used. vLLM frees a finished sequence's blocks tail first, so the leading
  blocks, shared by more requests, are the last to go; inserting in prompt order (as
  upstream does) would make block 0 the first victim and break every chain at its root.

Memory is bounded whatever the traffic: each endpoint's LRU holds at most its capacity,
every index entry belongs to some LRU, and endpoints that leave the pool are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class ApproxPrefixIndex:
    """block hash → endpoints, with a per-endpoint LRU of bounded capacity."""

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError("LRU capacity must be at least 1")
        self.default_capacity = default_capacity
        self._owners: dict[int, int] = {}  # hash → bitmask of endpoint slots
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._slot: dict[str, int] = {}
        self._names: list[str | None] = []  # slot → endpoint name
        self._free: list[int] = []
        self._entries = 0

    # ---- writes -----------------------------------------------------------
    def add(self, endpoint: str, hashes: Sequence[int], capacity: int | None = None) -> None:
        """Record that `endpoint` now holds `hashes` (a request's chain, in prompt order)."""
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
            self._slot[endpoint] = self._take_slot(endpoint)
        if capacity is not None and capacity > 0:
            self._capacity[endpoint] = capacity
        bit = 1 << self._slot[endpoint]
        owners = self._owners
        move = lru.move_to_end
        before = len(lru)
        for h in reversed(hashes):
            if h in lru:
                move(h)
            else:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
        self._entries += len(lru) - before
        self._evict(endpoint, lru, bit)

    def _evict(self, endpoint: str, lru: OrderedDict[int, None], bit: int) -> None:
        over = len(lru) - self._capacity.get(endpoint, self.default_capacity)
        if over <= 0:
            return
        owners = self._owners
        pop = lru.popitem
        for _ in range(over):
            h, _ = pop(last=False)
            mask = owners[h] & ~bit
            if mask:
                owners[h] = mask
            else:
                del owners[h]
        self._entries -= over

    def remove_endpoint(self, endpoint: str) -> None:
        lru = self._lru.pop(endpoint, None)
        if lru is None:
            return
        slot = self._slot.pop(endpoint)
        self._capacity.pop(endpoint, None)
        bit = 1 << slot
        owners = self._owners
        for h in lru:
            mask = owners[h] & ~bit
            if mask:
                owners[h] = mask
            else:
                del owners[h]
        self._entries -= len(lru)
        self._names[slot] = None
        self._free.append(slot)

    def retain(self, endpoints: Iterable[str]) -> list[str]:
        """Drop every endpoint not in `endpoints` (the pool); returns those dropped."""
        keep = set(endpoints)
        gone = [name for name in self._lru if name not in keep]
        for name in gone:
            self.remove_endpoint(name)
        return gone

    def _take_slot(self, endpoint: str) -> int:
        if self._free:
            slot = self._free.pop()
            self._names[slot] = endpoint
        else:
            slot = len(self._names)
            self._names.append(endpoint)
        return slot

    # ---- reads ------------------------------------------------------------
    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Upstream's greedy walk: blocks held per endpoint before the first unknown block.

        Hashes are visited in order; the walk stops at the first hash that NO endpoint
        holds, and every endpoint holding a visited hash gets +1. So the count is "how
        many of the leading blocks, up to the first globally unknown one, this endpoint
        holds" — not its own longest prefix: an endpoint holding blocks 0 and 2 while
        another holds block 1 counts 2. (With chained hashes and last-block-first
        insertion this needs an eviction of a leading block, which is rare.)
        """
        out: dict[str, int] = {}
        get = self._owners.get
        run_mask = 0
        run = 0
        for h in hashes:
            mask = get(h)
            if not mask:
                break
            if mask == run_mask:
                run += 1
            else:
                if run:
                    self._credit(out, run_mask, run)
                run_mask, run = mask, 1
        if run:
            self._credit(out, run_mask, run)
        return out

    def _credit(self, out: dict[str, int], mask: int, n: int) -> None:
        names = self._names
        while mask:
            low = mask & -mask
            name = names[low.bit_length() - 1]
            if name is not None:
                out[name] = out.get(name, 0) + n
            mask ^= low

    def endpoints_of(self, h: int) -> set[str]:
        """The endpoints holding hash `h` (the `hash → set` view, for tests and debugging)."""
        out: set[str] = set()
        self._credit_set(out, self._owners.get(h, 0))
        return out

    def _credit_set(self, out: set[str], mask: int) -> None:
        names = self._names
        while mask:
            low = mask & -mask
            name = names[low.bit_length() - 1]
            if name is not None:
                out.add(name)
            mask ^= low

    def capacity(self, endpoint: str) -> int:
        return self._capacity.get(endpoint, self.default_capacity)

    def fills(self, endpoints: Sequence[str]) -> list[float]:
        """Per endpoint, its LRU's size over its capacity (0 for one never written): one
        list pass of dict lookups, read for every candidate of a request."""
        lru, cap, default = self._lru, self._capacity, self.default_capacity
        return [len(lru[n]) / cap.get(n, default) if n in lru else 0.0 for n in endpoints]

    def endpoint_size(self, endpoint: str) -> int:
        lru = self._lru.get(endpoint)
        return len(lru) if lru is not None else 0

    @property
    def endpoints(self) -> list[str]:
        return list(self._lru)

    @property
    def size(self) -> int:
        """Total (endpoint, hash) entries: upstream's `prefix_indexer_size`."""
        return self._entries

    @property
    def distinct_hashes(self) -> int:
        return len(self._owners)
