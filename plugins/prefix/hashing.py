"""Prefix block hashes: an xxhash64 chain, so one hash names a whole prefix.

Both prefix indexes cut a request into blocks and chain their hashes (GIE
`approximateprefix/hashing.go`; reference §3.4):

    seed = xxh64(target_model ‖ cache_salt)            (salt only when present)
    h_i  = xxh64(block_i_bytes ‖ LE_uint64(h_{i-1}))   with h_{-1} = seed

Because each hash folds in its predecessor, equal hashes mean equal prefixes up to and
including that block, scoped to one model (and one salt: requests that must not share
a cache never match each other). Block bytes are either the prompt's UTF-8 bytes
(`chain_bytes`, upstream's characters: Go strings are bytes) or token ids packed as
little-endian uint32 (`token_bytes`); the precise index hashes the token ids of KV
events and of requests with this same function, so both sides agree by construction.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence

import xxhash

_xxh64 = xxhash.xxh64_intdigest
_le64 = struct.Struct("<Q").pack
_U32 = "I" if array("I").itemsize == 4 else "L"
_BIG_ENDIAN = sys.byteorder == "big"


def chain_seed(model: str, cache_salt: str | None = None) -> int:
    """The chain's root: the target model (post-rewrite) and the cache salt, if any."""
    return _xxh64((model + (cache_salt or "")).encode())


def token_bytes(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32s (4 bytes per token, whatever the host)."""
    try:
        arr = array(_U32, ids)
    except OverflowError:  # an id outside uint32: keep its low 32 bits
        arr = array(_U32, (i & 0xFFFFFFFF for i in ids))
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def chain_bytes(
    data: bytes, block: int, seed: int, *, max_blocks: int = 0, partial: bool = True
) -> list[int]:
    """Hashes of consecutive `block`-byte blocks of `data`, chained from `seed`.

    `max_blocks` > 0 truncates first (upstream truncates the input to maxBlocks × block).
    `partial` hashes a trailing short block too (upstream's approximate index counts it
    in the total); data shorter than one block gives no hashes at all.
    """
    n = len(data)
    if block <= 0 or n < block:
        return []
    if max_blocks > 0 and n > max_blocks * block:
        n = max_blocks * block
    end = n if partial else n - n % block
    out: list[int] = []
    append = out.append
    prev = seed
    for start in range(0, end, block):
        prev = _xxh64(data[start : start + block] + _le64(prev))
        append(prev)
    return out


def chain_tokens(
    ids: Sequence[int], block: int, seed: int, *, max_blocks: int = 0, partial: bool = False
) -> list[int]:
    """`chain_bytes` over token ids: a block is `block` tokens (4 × block bytes)."""
    return chain_bytes(token_bytes(ids), 4 * block, seed, max_blocks=max_blocks, partial=partial)
