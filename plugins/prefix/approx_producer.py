"""`approx-prefix-cache-producer`: which endpoint probably holds this prompt's prefix,
learnt from where the EPP itself sent earlier prompts (no feedback from the servers).

Per request (`produce`, before any profile runs): cut the prompt into blocks, hash them
as a chain (`hashing.py`), look the chain up in the index and produce a `PrefixMatchInfo`
(under `PREFIX_MATCH_KEY`, the `produces` key, which the `prefix-scorer` reads).
After scheduling (`pre_request`): record the chain for the first target of the primary
profile AND of every other profile that ran (the prefill endpoint in P/D), optimistically
assuming the server will cache it — upstream hard-codes a profile named "prefill"
(GIE #2080); every profile result is used here.

Blocks (GIE `approximateprefix`, reference §3.4):
- no `tokenizer`: a block is `blockSizeTokens × 4` bytes of the prompt text (upstream's
  4 characters per token), a trailing partial block is hashed and counted, and a prompt
  shorter than one block has no blocks (every score 0);
- with `tokenizer` ("simple", a tokenizer.json path, or the model's directory — then chat
  requests are rendered by its chat template as vLLM renders them, `epp.prompt_tokens`):
  a block is `blockSizeTokens` token ids (packed as little-endian uint32), with the same
  partial-block rule; a prompt sent as token ids is always hashed that way
  (`InferenceRequest.prompt_token_ids`). The ids are computed once per request and
  shared with any other plugin using the same tokenizer;
- `autoTune`: the block size is the first candidate's `vllm:cache_config_info`
  `block_size`, and each endpoint's LRU capacity its `num_gpu_blocks`, when reported,
  plus its `num_cpu_blocks` (the CPU offload tier's blocks), when reported.
- `prompt_cache_key` (OpenAI's field): a request the index has no match for at all goes
  where the key's last request went, while that endpoint is not saturated
  (`cache_key_hint.py`).
- media items (images, audio, video) enter the chain at their place, keyed by a digest
  of their inline bytes or their URL (`epp.media`): same text with different images
  diverges at the first differing image, as vLLM's block hashes do.
- `hashBlockSize` (upstream v1.0, deprecated): characters per block; when set it wins
  over `blockSizeTokens` and autoTune's block size, since it was set by hand.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.prompt_tokens import prompt_token_ids
from epp.request import CHARS_PER_TOKEN, InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, SchedulingResult
from epp.tokenizer import Tokenizer, load_tokenizer
from plugins.prefix import metrics
from plugins.prefix.approx_index import ApproxPrefixIndex
from plugins.prefix.cache_key_hint import CacheKeyHint
from plugins.prefix.hashing import chain_bytes, chain_seed, chain_tokens
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from plugins.prefix.pool_watch import PoolWatch

log = logging.getLogger(__name__)

APPROX_PRODUCER_TYPE = "approx-prefix-cache-producer"
_DEFAULT_BLOCK_SIZE_TOKENS = 16


@dataclass(frozen=True)
class ApproxPrefixParams:
    # Defaults: GIE `approximateprefix` (blockSizeTokens 16 = vLLM's default block size;
    # 256 blocks ≈ 4K tokens; 31,250 = (80 GB − 16 GB weights) / 128 KB per token / 16).
    block_size_tokens: int = param(
        _DEFAULT_BLOCK_SIZE_TOKENS,
        min=1,
        doc="tokens per block; without a tokenizer a block is 4 × this many characters",
    )
    max_prefix_blocks_to_match: int = param(256, min=1, doc="blocks hashed and matched at most")
    max_prefix_tokens_to_match: int = param(
        0, min=0, doc="if > 0, overrides the cap: blocks = this / block size"
    )
    lru_capacity_per_server: int = param(
        31_250, min=1, doc="blocks remembered per endpoint (when autoTune has no num_gpu_blocks)"
    )
    auto_tune: bool = param(
        True, doc="block size and capacity from each endpoint's vllm:cache_config_info"
    )
    tokenizer: str | None = param(
        None,
        doc='"simple", a tokenizer.json path or a model directory (its chat template too): '
        "blocks of token ids instead of characters",
    )
    hash_block_size: int = param(
        0, min=0, doc="deprecated (upstream v1.0): characters per block; overrides the above"
    )

    def validate(self) -> None:
        if self.hash_block_size and self.block_size_tokens != _DEFAULT_BLOCK_SIZE_TOKENS:
            raise ValueError(
                "give blockSizeTokens or the deprecated hashBlockSize (characters), not both"
            )


def load_tokenizer_param(spec: str | None) -> Tokenizer | None:
    """The configured tokenizer, or None; a missing file is a config error, not a crash."""
    if spec is None:
        return None
    try:
        return load_tokenizer(spec)
    except (OSError, RuntimeError, ValueError) as e:
        raise ValueError(f"tokenizer {spec!r}: {e}") from None


def first_targets(result: SchedulingResult) -> list[EndpointSnapshot]:
    """The first target of the primary profile, then of every other profile that ran,
    except an encode-only server's (it encodes the media and holds no prompt KV)."""
    out: list[EndpointSnapshot] = []
    primary = result.primary_profile
    first = result.profile_results.get(primary)
    if first is not None and first.targets:
        out.append(first.targets[0])
    for name, r in result.profile_results.items():
        if name == primary or r is None or not r.targets:
            continue
        pick = r.targets[0]
        endpoint = pick.endpoint
        if endpoint.role != "encode" and all(o.endpoint.name != endpoint.name for o in out):
            out.append(pick)
    return out


@register(APPROX_PRODUCER_TYPE)
class ApproxPrefixCacheProducer(Plugin):
    Params = ApproxPrefixParams
    produces = PREFIX_MATCH_KEY

    def __init__(self, name: str, params: ApproxPrefixParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.handle = handle
        self.tokenizer = load_tokenizer_param(params.tokenizer)
        self.index = ApproxPrefixIndex(params.lru_capacity_per_server)
        self.hint = CacheKeyHint()  # prompt_cache_key → where its last request went
        self._published_size = -1  # the index size last set on INDEXER_SIZE
        self._pool_watch = PoolWatch(handle, self.prune)

    # ---- DataProducer -----------------------------------------------------
    @property
    def prepares(self) -> bool:
        """Tokenizing is the request-only work worth a thread (`Preparer`)."""
        return self.tokenizer is not None

    def prepare(self, state: CycleState, request: InferenceRequest) -> None:
        """Off the loop for a large request (`Preparer`): the prompt's token ids, cached
        in `state` where `produce` reads them. Thread-safe: the tokenizer only reads."""
        if self.tokenizer is not None and request.prompt_token_ids is None:
            prompt_token_ids(state, request, self.tokenizer)

    def produce(
        self, state: CycleState, request: InferenceRequest, endpoints: list[EndpointSnapshot]
    ) -> PrefixMatchInfo:
        block_tokens = self.block_size(endpoints)
        ids = self.token_ids(state, request)
        hashes = self.hashes(request, block_tokens, ids)
        counts = self.index.match(hashes)
        if not counts and request.prompt_cache_key is not None:
            counts = self.hint.match(request, {e.name for e in endpoints}, len(hashes))
        return PrefixMatchInfo(
            total_blocks=len(hashes),
            block_size_tokens=block_tokens,
            matched=counts,
            cached_blocks=counts,
            chains={block_tokens: hashes},
            prompt_tokens=len(ids) if ids is not None else 0,
            # The share of each endpoint's LRU capacity (its num_gpu_blocks with autoTune)
            # the index holds: what the EPP routed there that the server has not had to
            # evict, as far as this index can tell.
            occupancy=self.index.fills,
        )

    def token_ids(self, state: CycleState | None, request: InferenceRequest) -> list[int] | None:
        """The prompt's ids (client-sent, or tokenized once per request), None to cut text."""
        if request.prompt_token_ids is not None:
            return request.prompt_token_ids
        if self.tokenizer is None:
            return None
        return prompt_token_ids(state, request, self.tokenizer)

    def block_size(self, endpoints: list[EndpointSnapshot]) -> int:
        """Tokens per block: hashBlockSize / 4, else autoTune's, else blockSizeTokens."""
        p = self.params
        if p.hash_block_size:
            return max(1, p.hash_block_size // CHARS_PER_TOKEN)
        if p.auto_tune and endpoints and endpoints[0].metrics.cache_block_size > 0:
            return endpoints[0].metrics.cache_block_size
        return p.block_size_tokens

    def max_blocks(self, block_tokens: int) -> int:
        p = self.params
        if p.max_prefix_tokens_to_match > 0:
            return max(1, p.max_prefix_tokens_to_match // block_tokens)
        return p.max_prefix_blocks_to_match

    def block_chars(self, block_tokens: int) -> int:
        return self.params.hash_block_size or block_tokens * CHARS_PER_TOKEN

    def hashes(
        self, request: InferenceRequest, block_tokens: int, ids: list[int] | None = None
    ) -> list[int]:
        seed = chain_seed(request.target_model or request.model, request.cache_salt)
        cap = self.max_blocks(block_tokens)
        text = request.prompt_text
        if ids is None:
            ids = self.token_ids(None, request)
        if ids is not None:
            return chain_tokens(ids, block_tokens, seed, max_blocks=cap, partial=True)
        chars = self.block_chars(block_tokens)
        # A character is ≥ 1 byte, so this many characters hold every byte hashed.
        data = text[: cap * chars].encode()
        return chain_bytes(data, chars, seed, max_blocks=cap, partial=True)

    # ---- PreRequest ---------------------------------------------------------
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        info: PrefixMatchInfo | None = result.cycle_state.read(PREFIX_MATCH_KEY)
        if info is None:
            return
        hashes = info.chains.get(info.block_size_tokens, ())
        targets = first_targets(result)
        if not hashes or not targets:
            return
        for snap in targets:
            self.index.add(snap.name, hashes, self._capacity(snap))
        self.hint.learn(request, targets[0].name, len(hashes))
        self._publish_size()
        # Upstream records the primary target's match (GIE plugin.go PreRequest).
        matched = info.cached_blocks.get(targets[0].endpoint.name, 0)
        metrics.HIT_RATIO.observe(matched / info.total_blocks)
        metrics.HIT_BYTES.observe(matched * self.block_chars(info.block_size_tokens))

    def _capacity(self, snap: EndpointSnapshot) -> int:
        if self.params.auto_tune and snap.metrics.cache_num_blocks > 0:
            # a server that offloads KV to CPU keeps those blocks' prefixes too
            return snap.metrics.cache_num_blocks + snap.metrics.cache_offload_blocks
        return self.params.lru_capacity_per_server

    # ---- Lifecycle: forget endpoints that leave the pool ----------------------
    async def start(self) -> None:
        self._pool_watch.start()

    async def stop(self) -> None:
        self._pool_watch.stop()

    def prune(self) -> None:
        """Drop the index entries of endpoints no longer in the pool."""
        gone = self.index.retain(e.name for e in self.handle.pool())
        if gone:
            log.debug("prefix index: dropped endpoints no longer in the pool: %s", gone)
            self._publish_size()

    def _publish_size(self) -> None:
        """INDEXER_SIZE := the index size, set only when it changed: once full, the
        index's size stays put and a gauge set (a lock) per request is wasted."""
        size = self.index.size
        if size != self._published_size:
            self._published_size = size
            metrics.INDEXER_SIZE.set(size)
