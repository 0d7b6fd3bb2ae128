"""The paged KV cache with prefix caching, block for block as vLLM's V1 `BlockPool`.

- The cache is `num_blocks` blocks of `block_size` tokens. A request holds a list of
  blocks; a block is *in use* while any request references it (`ref_cnt > 0`), and
  `vllm:kv_cache_usage_perc` is the fraction in use.
- A block becomes *cached* once it is full: it gets the hash of its tokens chained to
  its parent's hash (plus the LoRA name and, for block 0, the cache salt, as vLLM's
  extra keys), is registered under that hash, and a `BlockStored` event is queued.
- Freed blocks keep their hash and go to the tail of the free queue; allocation takes
  from the head, evicting the cached block found there (`BlockRemoved`). So freed
  blocks serve as cache until reused, least recently freed first. A request frees its
  blocks tail first, so a prefix outlives its suffixes (vLLM does the same).
- A new request takes the longest run of cached blocks matching its own block hashes,
  but never all of its tokens: the last token is always recomputed to get logits, so
  at most `(num_tokens - 1) // block_size` blocks can hit.
- Identical blocks computed concurrently are both registered, as vLLM does (it does
  not de-duplicate so block tables stay append-only); a lookup takes the first.

Block hashes are SHA-256 over (parent hash, token ids, extra keys); events carry the
low 64 bits as an unsigned integer, as vLLM does with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`.
They are not bit-identical to vLLM's (which hashes a pickled or CBOR-encoded tuple);
consumers key blocks by `token_ids`, which every `BlockStored` carries.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from epp.sim.sequence import SimRequest

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
NONE_HASH = hashlib.sha256(b"epp-sim prefix cache").digest()
_MASK64 = (1 << 64) - 1


def external_hash(digest: bytes) -> int:
    """The 64-bit form of a block hash that KV events carry."""
    return int.from_bytes(digest, "big") & _MASK64


def hash_block(parent: bytes, tokens: Sequence[int], extra: bytes = b"") -> bytes:
    return hashlib.sha256(parent + array("q", tokens).tobytes() + extra).digest()


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class Block:
    __slots__ = ("hash", "id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.id = block_id
        self.ref_cnt = 0
        self.hash: bytes | None = None  # set once the block is full and cached

    def __repr__(self) -> str:
        return f"Block({self.id}, ref={self.ref_cnt}, cached={self.hash is not None})"


class KVCache:
    """Block accounting plus the prefix cache. `events` collects what a step produced
    (only when `emit_events`); the engine drains it after each step."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        emit_events: bool = False,
        offload_blocks: int = 0,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.emit_events = emit_events and enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (head first); cached blocks stay here until reused.
        self._free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)
        self._cached: dict[bytes, dict[int, Block]] = {}
        self.events: list[KVEvent] = []
        self.evictions = 0
        # The CPU tier (`offload_blocks` > 0): digests of blocks evicted from the GPU, LRU.
        # Only announced: a hit there is recomputed, not loaded back (the sim models no
        # transfer), so it shows what a router sees, not what offloading saves.
        self.offload_blocks = offload_blocks
        self._cpu: OrderedDict[bytes, None] = OrderedDict()

    # -- accounting ----------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(v) for v in self._cached.values())

    def is_cached(self, digest: bytes) -> bool:
        return digest in self._cached

    # -- hashing -----------------------------------------------------------------------

    def request_block_hashes(self, req: SimRequest, upto_tokens: int) -> list[bytes]:
        """The request's chained hashes for every full block within its first
        `upto_tokens` tokens (computed once, extended as tokens are appended)."""
        hashes = req.block_hashes
        bs = self.block_size
        want = min(upto_tokens, req.num_tokens) // bs
        tokens = req.tokens
        while len(hashes) < want:
            i = len(hashes)
            parent = hashes[-1] if hashes else NONE_HASH
            extra = _extra(req, i, bs)
            hashes.append(hash_block(parent, tokens[i * bs : (i + 1) * bs], extra))
        return hashes

    # -- prefix cache ------------------------------------------------------------------

    def find_cached_prefix(self, req: SimRequest) -> list[Block]:
        """The longest run of cached blocks matching the request's prompt, leaving at
        least its last token to compute."""
        if not self.enable_caching:
            return []
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits: list[Block] = []
        # The hash list may already be longer (a preempted request's, or one built from
        # a trace's block ids), so cap it: the last token must still be computed.
        for digest in self.request_block_hashes(req, max_blocks * self.block_size)[:max_blocks]:
            holders = self._cached.get(digest)
            if not holders:
                break
            hits.append(next(iter(holders.values())))
        return hits

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on cache-hit blocks; free ones leave the eviction queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.id]
            block.ref_cnt += 1

    # -- allocation ----------------------------------------------------------------------

    def blocks_needed(self, req: SimRequest, num_tokens: int) -> int:
        """New blocks the request needs to hold its first `num_tokens` tokens."""
        need = -(-num_tokens // self.block_size)
        return max(0, need - len(req.blocks))

    def allocate(self, req: SimRequest, num_tokens: int) -> bool:
        """Grow the request's block table to hold `num_tokens` tokens, or change nothing
        and return False when the free queue is too short."""
        n = self.blocks_needed(req, num_tokens)
        if n > len(self._free):
            return False
        free = self._free
        for _ in range(n):
            _, block = free.popitem(last=False)
            if block.hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            req.blocks.append(block)
        return True

    def _evict(self, block: Block) -> None:
        digest = block.hash
        assert digest is not None
        holders = self._cached.get(digest)
        if holders is not None and holders.pop(block.id, None) is not None:
            if not holders:
                del self._cached[digest]
            self.evictions += 1
            if self.offload_blocks and digest not in self._cached:
                self._offload(digest)
            if self.emit_events:
                self.events.append(BlockRemoved([external_hash(digest)], MEDIUM_GPU))
        block.hash = None

    def _offload(self, digest: bytes) -> None:
        """The GPU's last copy of `digest` is evicted: keep it on the CPU tier (vLLM's
        offloading connector announces a CPU store by hash only, no tokens)."""
        cpu = self._cpu
        if digest in cpu:
            cpu.move_to_end(digest)
            return
        cpu[digest] = None
        if self.emit_events:
            self.events.append(
                BlockStored(
                    [external_hash(digest)], None, [], self.block_size, None, MEDIUM_CPU, None
                )
            )
        if len(cpu) > self.offload_blocks:
            old, _ = cpu.popitem(last=False)
            if self.emit_events:
                self.events.append(BlockRemoved([external_hash(old)], MEDIUM_CPU))

    def is_offloaded(self, digest: bytes) -> bool:
        return digest in self._cpu

    def free(self, req: SimRequest) -> None:
        """Release the request's blocks, tail first so a shared prefix is evicted last."""
        free = self._free
        for block in reversed(req.blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                free[block.id] = block
        req.blocks = []
        req.num_cached_blocks = 0

    def cache_full_blocks(
        self, req: SimRequest, num_tokens: int, lora_id: int | None = None
    ) -> None:
        """Register every block that `num_tokens` computed tokens fill, and queue one
        `BlockStored` for them (as vLLM's `cache_full_blocks`)."""
        if not self.enable_caching:
            return
        bs = self.block_size
        first = req.num_cached_blocks
        full = min(num_tokens, req.num_tokens) // bs
        if full <= first:
            return
        hashes = self.request_block_hashes(req, full * bs)
        new_hashes: list[int] = []
        for i in range(first, full):
            block = req.blocks[i]
            digest = hashes[i]
            block.hash = digest
            self._cached.setdefault(digest, {})[block.id] = block
            if self.emit_events:
                new_hashes.append(external_hash(digest))
        req.num_cached_blocks = full
        if self.emit_events:
            parent = external_hash(hashes[first - 1]) if first else None
            self.events.append(
                BlockStored(
                    block_hashes=new_hashes,
                    parent_block_hash=parent,
                    token_ids=req.tokens[first * bs : full * bs],
                    block_size=bs,
                    lora_id=lora_id,
                    medium=MEDIUM_GPU,
                    lora_name=req.lora,
                )
            )

    def reset(self) -> bool:
        """Forget every cached block (vLLM's `reset_prefix_cache`); refused, as in vLLM,
        while any block is in use."""
        if self.num_used_blocks:
            return False
        for block in self.blocks:
            block.hash = None
        self._cached.clear()
        self._cpu.clear()
        if self.emit_events:
            self.events.append(AllBlocksCleared())
        return True

    def drain_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events


def _extra(req: SimRequest, block_index: int, block_size: int) -> bytes:
    """vLLM's extra hash keys: the LoRA name for every block, the salt for block 0, and
    ("mm", identifier, offset from the block's start) for every media item whose
    placeholder tokens overlap the block (`kv_cache_utils._gen_mm_extra_hash_keys`)."""
    extra = b""
    if req.lora:
        extra += b"\x00lora:" + req.lora.encode()
    if block_index == 0 and req.cache_salt:
        extra += b"\x00salt:" + req.cache_salt.encode()
    if req.mm:
        start = block_index * block_size
        end = start + block_size
        for identifier, offset, length in req.mm:
            if offset < end and start < offset + length:
                extra += f"\x00mm:{identifier}:{offset - start}".encode()
    return extra
