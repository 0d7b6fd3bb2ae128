"""The precise prefix index: which blocks each server says it holds (its KV events).

Blocks are keyed by the EPP's OWN hash of their token ids (`hashing.chain_tokens`,
chained from the parent block's own hash), not by the engine's hash: vLLM's hashes are
sha256-based and seeded per deployment, so the request side could not recompute them.
Each endpoint keeps a map engine hash → own hash, to find a stored block's parent and
to apply `BlockRemoved`, which names blocks by engine hash only (llm-d-kv-cache's
dual-key design, #202). This makes the EPP independent of vLLM's hash algorithm and
seed; only the block size must match, and that comes with every `BlockStored`.

Seed rule (both sides): `chain_seed(model, cache_salt)` where the event side's model is
the event's `lora_name` if set, else the topic's model (`kv@host:port@<model>`, which
must be the served model name clients send), and its salt is the one string in block
0's `extra_keys` (vLLM puts `cache_salt` there); the request side uses the request's
target model and `cache_salt`. Multimodal keys in block 0 yield a seed no request has
(a missed match rather than a false one); extra keys of later blocks are not hashed.

Per endpoint the blocks live in an LRU (an OrderedDict) capped at
`max_blocks_per_endpoint` (memory stays bounded if removals are lost); the value is a
bit set of tiers: one per storage medium the events name (vLLM's `medium`, lowercased,
none = "gpu", as llm-d-router's `normalizeDeviceTier`: "gpu", "cpu", and whatever an
offloading connector reports, e.g. "disk") and SPECULATIVE (added by the EPP at routing
time, expiring after a TTL unless an event confirms it). A block held in several tiers
weighs its best tier's weight (llm-d-router's `fillMaxWeights`); the weights are the
producer's `kvCacheBackendConfigs` (llm-d-router's defaults: gpu 1.0, cpu 0.8), a
speculative block weighs as GPU. A medium the config does not name weighs the lowest
configured weight, where llm-d-router gives it 1.0: an unnamed medium is an offload
tier (disk, shared storage), and scoring its hit as a GPU hit would prefer it to a
CPU-tier hit.
"""

from __future__ import annotations

import collections
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence

from epp.datalayer.kv_decode import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent
from epp.datalayer.kvevents import DROPPED
from plugins.prefix.hashing import chain_seed, chain_tokens

GPU = 1
CPU = 2
SPECULATIVE = 4
GPU_WEIGHT = 1.0
CPU_WEIGHT = 0.8
# llm-d-router's DefaultKVCacheBackendConfig (pkg/kvcache/backend.go)
DEFAULT_TIER_WEIGHTS = {"gpu": GPU_WEIGHT, "cpu": CPU_WEIGHT}
# Bits for further media, in the order they are first seen; a medium past the last
# shares it (its weight then is the lowest of those sharing it).
_EXTRA_TIER_BITS = (8, 16, 32, 64, 128, 256)
# Group-aware stores are admitted only for full attention (llm-d-router #2363): a
# sliding-window or mamba group's blocks do not make a reusable prefix.
FULL_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


def tier_name(medium: str | None) -> str:
    """vLLM's `medium` as a tier name: lowercased, none = "gpu" (llm-d-router)."""
    return medium.lower() if medium else "gpu"


class Tiers:
    """Medium names ↔ tier bits, and the weight of a block's tier bits."""

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        self.weights = dict(DEFAULT_TIER_WEIGHTS if weights is None else weights)
        self.unknown_weight = min(
            [w for n, w in self.weights.items() if n != "gpu"] or [CPU_WEIGHT]
        )
        self.bits: dict[str, int] = {"gpu": GPU, "cpu": CPU}
        self._bit_weight: dict[int, float] = {
            GPU: self.weights.get("gpu", GPU_WEIGHT),
            CPU: self.weights.get("cpu", self.unknown_weight),
        }
        self._memo: dict[int, float] = {}

    def bit(self, medium: str | None) -> int:
        name = tier_name(medium)
        b = self.bits.get(name)
        if b is None:
            used = len(self.bits) - 2
            b = _EXTRA_TIER_BITS[min(used, len(_EXTRA_TIER_BITS) - 1)]
            self.bits[name] = b
            w = self.weights.get(name, self.unknown_weight)
            self._bit_weight[b] = min(w, self._bit_weight.get(b, w))
            self._memo.clear()
        return b

    def weight(self, bits: int) -> float:
        """The best weight among `bits`' tiers (SPECULATIVE excluded by the caller)."""
        w = self._memo.get(bits)
        if w is None:
            w = max((bw for b, bw in self._bit_weight.items() if bits & b), default=0.0)
            self._memo[bits] = w
        return w


def tier_of(medium: str | None) -> int:
    """The tier bit of vLLM's `medium` under the default tiers (gpu, cpu)."""
    return _DEFAULT_TIERS.bit(medium)


_DEFAULT_TIERS = Tiers()


class _Blocks:
    """One endpoint's blocks and engine-hash map."""

    __slots__ = ("block_size", "blocks", "e2o", "o2e", "spec")

    def __init__(self, block_size: int = 0) -> None:
        self.blocks: OrderedDict[int, int] = OrderedDict()  # own hash → tier bits
        self.e2o: dict[int, int] = {}  # engine hash → own hash
        self.o2e: dict[int, int] = {}  # own hash → engine hash (to clean e2o on eviction)
        self.spec: dict[int, float] = {}  # own hash → speculative expiry
        self.block_size = block_size

    def remove(self, own: int) -> None:
        self.blocks.pop(own, None)
        self.spec.pop(own, None)
        eh = self.o2e.pop(own, None)
        if eh is not None and self.e2o.get(eh) == own:
            del self.e2o[eh]


class PreciseIndex:
    """Per-endpoint blocks from KV events, plus speculative entries from routing."""

    def __init__(
        self,
        max_blocks_per_endpoint: int,
        clock: Callable[[], float],
        tier_weights: dict[str, float] | None = None,
    ) -> None:
        if max_blocks_per_endpoint < 1:
            raise ValueError("max blocks per endpoint must be at least 1")
        self.tiers = Tiers(tier_weights)
        self._gpu_weight = self.tiers.weight(GPU)
        self.cap = max_blocks_per_endpoint
        self.clock = clock
        self.stats: collections.Counter[str] = collections.Counter()
        self._eps: dict[str, _Blocks] = {}
        # (expiry, endpoint, hashes) in expiry order (one TTL, a monotonic clock).
        self._spec_queue: deque[tuple[float, str, Sequence[int]]] = deque()
        # Data-parallel servers: a second index keyed by `rank_key(endpoint, rank)`,
        # made when the first batch from a rank above 0 arrives, and the endpoints seen
        # with one. Single-rank servers never create it.
        self.ranked: PreciseIndex | None = None
        self._dp_endpoints: set[str] = set()

    def ranks_index(self) -> PreciseIndex:
        """`ranked`, made on first use (the rank picker's speculative entries)."""
        if self.ranked is None:
            self.ranked = PreciseIndex(self.cap, self.clock, self.tiers.weights)
        return self.ranked

    # ---- events -------------------------------------------------------------
    def on_batch(self, endpoint: str, model: str, batch: EventBatch) -> None:
        """The subscriber's handler: apply a batch's events in order.

        The endpoint-level entry holds every rank's blocks (the endpoint is scored as
        one server: a prefix held by any rank is a hit there). A batch from a
        data-parallel rank (`data_parallel_rank` > 0, or any rank of an endpoint seen
        with one) is also applied under its (endpoint, rank) key in `ranked`, which the
        rank picker reads.
        """
        self.apply(endpoint, model, batch.events)
        rank = batch.data_parallel_rank
        if rank is None or (rank == 0 and endpoint not in self._dp_endpoints):
            return
        self._dp_endpoints.add(endpoint)
        self.ranks_index().apply(rank_key(endpoint, rank), model, batch.events)

    def apply(self, endpoint: str, model: str, events: Iterable[KVEvent]) -> None:
        for ev in events:
            if isinstance(ev, BlockStored):
                self._stored(endpoint, model, ev)
            elif isinstance(ev, BlockRemoved):
                self._removed(endpoint, ev)
            elif isinstance(ev, AllBlocksCleared):
                self.clear(endpoint)

    def _drop(self, reason: str) -> None:
        self.stats[reason] += 1
        DROPPED.labels(reason=reason).inc()

    def _stored(self, endpoint: str, model: str, ev: BlockStored) -> None:
        if ev.kv_cache_spec_kind is not None and ev.kv_cache_spec_kind not in FULL_ATTENTION_KINDS:
            self._drop("not_full_attention")
            return
        st = self._eps.get(endpoint)
        if st is None:
            st = self._eps[endpoint] = _Blocks()
        tier = self.tiers.bit(ev.medium)
        if not ev.token_ids:
            # An offload store names blocks by engine hash only: add the tier to them.
            for eh in ev.block_hashes:
                own = st.e2o.get(eh)
                if own is not None and own in st.blocks:
                    st.blocks[own] |= tier
                    st.blocks.move_to_end(own)
                else:
                    self._drop("unknown_block")
            return
        size, n = ev.block_size, len(ev.block_hashes)
        if size <= 0 or n == 0 or len(ev.token_ids) != size * n:
            self._drop("unsupported_block")
            return
        if ev.parent_block_hash is None:
            prev = chain_seed(ev.lora_name or model, _salt(ev))
        else:
            parent = st.e2o.get(ev.parent_block_hash)
            if parent is None:
                # Its parent's store was lost or evicted: the chain cannot be rebuilt.
                self._drop("orphan_block")
                return
            prev = parent
        own_hashes = chain_tokens(ev.token_ids, size, prev)
        st.block_size = size
        blocks, e2o, o2e, spec = st.blocks, st.e2o, st.o2e, st.spec
        # Last block first, so a sequence's leading blocks end most recently used and
        # the cap, when it bites, cuts chains at the tail rather than at the root.
        for eh, own in zip(reversed(ev.block_hashes), reversed(own_hashes), strict=True):
            bits = blocks.get(own, 0) | tier
            if bits & GPU and bits & SPECULATIVE:  # confirmed: the TTL no longer matters
                bits &= ~SPECULATIVE
                spec.pop(own, None)
            blocks[own] = bits
            blocks.move_to_end(own)
            old = o2e.get(own)
            if old is not None and old != eh and e2o.get(old) == own:
                del e2o[old]
            e2o[eh] = own
            o2e[own] = eh
        self._evict(st)

    def _removed(self, endpoint: str, ev: BlockRemoved) -> None:
        st = self._eps.get(endpoint)
        if st is None:
            return
        tier = self.tiers.bit(ev.medium)
        for eh in ev.block_hashes:
            own = st.e2o.get(eh)
            if own is None:
                continue
            bits = st.blocks.get(own, 0) & ~(tier | SPECULATIVE)
            if bits:
                st.blocks[own] = bits
            else:  # no tier holds it any more: forget the block and its engine hash
                st.remove(own)

    def clear(self, endpoint: str) -> None:
        """`AllBlocksCleared`: the server dropped everything (e.g. after a weight update)."""
        st = self._eps.get(endpoint)
        if st is not None:
            self._eps[endpoint] = _Blocks(st.block_size)

    def _evict(self, st: _Blocks) -> None:
        over = len(st.blocks) - self.cap
        for _ in range(over):
            own = next(iter(st.blocks))
            st.remove(own)
        if over > 0:
            self.stats["evicted"] += over

    # ---- speculative entries ------------------------------------------------
    def add_speculative(self, endpoint: str, hashes: Sequence[int], ttl: float) -> None:
        """The request was just sent to `endpoint`: assume its blocks for `ttl` seconds.

        This covers the gap before the server's first `BlockStored` for them (llm-d
        `speculativeIndexing`); entries expire lazily unless an event confirms them.
        """
        if not hashes or ttl <= 0:
            return
        now = self.clock()
        self.expire(now)
        expiry = now + ttl
        st = self._eps.get(endpoint)
        if st is None:
            st = self._eps[endpoint] = _Blocks()
        blocks, spec = st.blocks, st.spec
        for h in reversed(hashes):  # leading blocks end most recently used
            bits = blocks.get(h, 0)
            if not bits & GPU:
                blocks[h] = bits | SPECULATIVE
                spec[h] = expiry
            blocks.move_to_end(h)
        self._spec_queue.append((expiry, endpoint, hashes))
        self._evict(st)

    def expire(self, now: float) -> None:
        """Drop speculative entries whose TTL has passed (called on each use)."""
        q = self._spec_queue
        while q and q[0][0] <= now:
            expiry, endpoint, hashes = q.popleft()
            st = self._eps.get(endpoint)
            if st is None:
                continue
            for h in hashes:
                if st.spec.get(h) != expiry:  # confirmed, removed or renewed since
                    continue
                del st.spec[h]
                bits = st.blocks.get(h, 0) & ~SPECULATIVE
                if bits:
                    st.blocks[h] = bits
                else:
                    st.remove(h)

    # ---- lookups ------------------------------------------------------------
    def longest_prefix(self, endpoint: str, hashes: Sequence[int], now: float) -> tuple[float, int]:
        """(tier-weighted, unweighted) length of the leading run of `hashes` the endpoint
        holds; the walk stops at its first missing block (llm-d `LongestPrefixScorer`)."""
        st = self._eps.get(endpoint)
        if st is None:
            return 0.0, 0
        blocks, spec = st.blocks, st.spec
        gpu, weight = self._gpu_weight, self.tiers.weight
        weighted = 0.0
        n = 0
        for h in hashes:
            bits = blocks.get(h)
            if not bits:
                break
            if bits == GPU:  # the common case first
                weighted += gpu
            elif bits & SPECULATIVE and spec.get(h, 0.0) > now:
                held = bits & ~SPECULATIVE
                weighted += max(gpu, weight(held)) if held else gpu
            elif bits & ~SPECULATIVE:
                weighted += weight(bits & ~SPECULATIVE)
            else:
                break
            n += 1
        return weighted, n

    def block_size(self, endpoint: str) -> int:
        """The block size the endpoint's events carry (0 until one arrives)."""
        st = self._eps.get(endpoint)
        return st.block_size if st is not None else 0

    def size(self, endpoint: str) -> int:
        st = self._eps.get(endpoint)
        return len(st.blocks) if st is not None else 0

    def sizes(self, endpoints: Sequence[str]) -> list[int]:
        """`size` of each endpoint, in one pass (read for every candidate of a request)."""
        eps = self._eps
        return [len(eps[n].blocks) if n in eps else 0 for n in endpoints]

    def total_size(self) -> int:
        """Blocks held over all endpoints (the `prefix_indexer_size` gauge)."""
        return sum(len(st.blocks) for st in self._eps.values())

    def engine_map_size(self, endpoint: str) -> int:
        st = self._eps.get(endpoint)
        return len(st.e2o) if st is not None else 0

    def retain(self, endpoints: Iterable[str]) -> list[str]:
        """Forget endpoints that left the pool (and their ranks); returns those dropped."""
        keep = set(endpoints)
        gone = [name for name in self._eps if name.partition(_RANK_SEP)[0] not in keep]
        for name in gone:
            del self._eps[name]
        self._dp_endpoints &= keep
        if self.ranked is not None:
            self.ranked.retain(keep)
        return gone

    @property
    def endpoints(self) -> list[str]:
        return list(self._eps)


_RANK_SEP = "\x1f"


def rank_key(endpoint: str, rank: int) -> str:
    """The `ranked` index's key for one data-parallel rank of an endpoint."""
    return f"{endpoint}{_RANK_SEP}{rank}"


def _salt(ev: BlockStored) -> str | None:
    """vLLM puts `cache_salt` in the first block's extra keys (after any multimodal keys,
    beside the LoRA name). One string there is the salt; more than that (multimodal
    content) gives a salt no request has, so such a prefix is never matched."""
    if ev.parent_block_hash is not None or not ev.extra_keys:
        return None
    first = ev.extra_keys[0]
    if not isinstance(first, list | tuple):
        return None
    keys = [k for k in first if k != ev.lora_name]
    if not keys:
        return None
    if len(keys) == 1 and isinstance(keys[0], str):
        return keys[0]
    return "\0" + repr(keys)
