"""`precise-prefix-cache-producer`: which endpoint holds this prompt's prefix, from what
the servers themselves report in their KV events (llm-d's "precise" prefix scoring).

Per request (`produce`): the prompt's token ids as the servers compute them
(`epp.prompt_tokens`: the configured tokenizer — the served model's directory for real
models, whose chat template renders chat requests exactly as vLLM does; "simple" matches
`epp sim` — computed once per request and shared; or the ids the client sent), chain
the hashes of its full blocks with the seed rule of `precise_index.py`, and produce a
`PrefixMatchInfo` (under `PREFIX_MATCH_KEY`, its `produces` key): `total_blocks` = full
blocks of the prompt (a trailing partial block is never cached by vLLM, so it is not
counted, as llm-d), `matched` = the tier-weighted longest consecutive prefix each
endpoint holds, `cached_blocks` the unweighted one, `chains` the block hashes per size.

A request with media (`InferenceRequest.media`) is matched only up to the block before
its first media item (`_media_cut`): vLLM hashes the media into the blocks that hold it.

The block size per endpoint is the one its `BlockStored` events carry, else its
`vllm:cache_config_info` block_size; endpoints with neither use the most common known
size among the candidates, else `blockSizeTokens`. Should candidates differ, the info
is expressed in the most common size and other endpoints' matches are scaled to it
(the same share of the prompt).

After scheduling (`pre_request`), the picked endpoints (first target of every profile)
get speculative entries for the request's blocks, living `speculativeTTL` seconds, so
back-to-back requests sharing a prefix stick before the first event arrives. With several
EPP replicas, `speculativeSyncBind` + `speculativeSyncPeers` share those entries between
them (`spec_sync.py`: each publishes what it routed, applies what the others routed), so
a follow-up that Envoy hands to another replica sticks too.

Events arrive through `epp.datalayer.kvevents.KVEventSubscriber`, started and stopped
with the server (`start`/`stop`); endpoints leaving the pool are forgotten.
"""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from epp.config.params import param
from epp.datalayer.kv_decode import EventBatch
from epp.datalayer.kvevents import MODES, KVEventSubscriber
from epp.datastore import EndpointSnapshot
from epp.prompt_tokens import prompt_token_ids
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import CycleState, SchedulingResult
from plugins.prefix import metrics
from plugins.prefix.approx_producer import first_targets, load_tokenizer_param
from plugins.prefix.hashing import chain_seed, chain_tokens
from plugins.prefix.match_info import PREFIX_MATCH_KEY, PrefixMatchInfo
from plugins.prefix.pool_watch import PoolWatch
from plugins.prefix.precise_index import PreciseIndex
from plugins.prefix.spec_sync import SpecSync, check_bind, parse_peer

log = logging.getLogger(__name__)

PRECISE_PRODUCER_TYPE = "precise-prefix-cache-producer"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


def parse_seconds(value: float | str) -> float:
    """Seconds from a number or a Go-style duration ("2s", "500ms", "1m"), as llm-d's
    `speculativeTTL` is written."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(f"speculativeTTL must be seconds or a duration like 2s; got {value!r}")
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if seconds < 0:
        raise ValueError(f"speculativeTTL must be >= 0; got {value!r}")
    return seconds


@dataclass(frozen=True)
class PrecisePrefixParams:
    mode: str = param(
        "bind",
        choices=MODES,
        doc="bind: one SUB socket all servers connect to; connect: dial every endpoint",
    )
    endpoint: str = param(
        "tcp://*:5557", doc="bind mode: the address the EPP binds (servers' kv-events endpoint)"
    )
    publisher_port: int = param(
        5557, min=1, max=65535, doc="connect mode: publisher port (label epp.kv-events-port wins)"
    )
    topic_filter: str = param("kv@", doc="ZMQ subscription prefix (llm-d's default)")
    tokenizer: str = param(
        "simple",
        doc='"simple" (as epp sim), or the served model\'s directory (tokenizer.json and '
        "chat template) or tokenizer.json path",
    )
    # 16 = vLLM's default block size (llm-d tokenProcessorConfig default).
    block_size_tokens: int = param(
        16, min=1, doc="block size until an endpoint's events or metrics give it"
    )
    max_blocks_per_endpoint: int = param(
        31_250, min=1, doc="blocks remembered per endpoint (LRU), bounding memory"
    )
    speculative_indexing: bool = param(
        True, doc="assume the picked endpoint holds the request's blocks until events say"
    )
    speculative_ttl: float | str = param(
        2.0,
        aliases=("speculativeTTL",),
        doc="speculativeTTL: seconds (or 2s, 500ms) a speculative entry lives unconfirmed",
    )

    kv_cache_backend_configs: list[dict[str, Any]] = param(
        default_factory=lambda: [{"name": "gpu", "weight": 1.0}, {"name": "cpu", "weight": 0.8}],
        aliases=("kvCacheBackendConfigs",),
        doc="kvCacheBackendConfigs: [{name, weight}] per storage medium of vLLM's KV events "
        "(gpu, cpu, disk...): a cached block scores its tier's weight (llm-d-router's "
        "defaults: gpu 1.0, cpu 0.8; an unnamed medium weighs the lowest given)",
    )

    speculative_sync_bind: str = param(
        "",
        doc="several EPP replicas: where this one publishes its speculative entries "
        "(tcp://*:5558); empty: not shared",
    )
    speculative_sync_peers: list[str] = param(
        default_factory=list,
        doc="the replicas' publishers, tcp://HOST:PORT (a headless Service name reaches "
        "every EPP pod; listing this replica too is fine)",
    )

    def validate(self) -> None:
        parse_seconds(self.speculative_ttl)
        self.tier_weights  # noqa: B018 (raises ValueError naming the entry)
        if bool(self.speculative_sync_bind) != bool(self.speculative_sync_peers):
            raise ValueError(
                "speculativeSyncBind and speculativeSyncPeers go together: set both to "
                "share speculative entries between EPP replicas, or neither"
            )
        if self.speculative_sync_bind:
            if not self.speculative_indexing or self.ttl_seconds <= 0:
                raise ValueError(
                    "speculativeSyncBind shares speculative entries: it needs "
                    "speculativeIndexing: true and a speculativeTTL above 0"
                )
            check_bind(self.speculative_sync_bind)
            for peer in self.speculative_sync_peers:
                parse_peer(peer)

    @property
    def tier_weights(self) -> dict[str, float]:
        """kvCacheBackendConfigs as {lowercased medium: weight}."""
        out: dict[str, float] = {}
        for i, entry in enumerate(self.kv_cache_backend_configs):
            name, weight = (
                (entry.get("name"), entry.get("weight"))
                if isinstance(entry, dict)
                else (None, None)
            )
            if not isinstance(name, str) or not name:
                raise ValueError(f"kvCacheBackendConfigs[{i}]: needs a name (gpu, cpu, disk...)")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
                raise ValueError(
                    f"kvCacheBackendConfigs[{i}] ({name}): weight must be a number >= 0"
                )
            out[name.lower()] = float(weight)
        return out

    @property
    def ttl_seconds(self) -> float:
        return parse_seconds(self.speculative_ttl)


@register(PRECISE_PRODUCER_TYPE)
class PrecisePrefixCacheProducer(Plugin):
    Params = PrecisePrefixParams
    produces = PREFIX_MATCH_KEY

    def __init__(self, name: str, params: PrecisePrefixParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.handle = handle
        tokenizer = load_tokenizer_param(params.tokenizer)
        assert tokenizer is not None
        self.tokenizer = tokenizer
        self.ttl = params.ttl_seconds
        self.index = PreciseIndex(params.max_blocks_per_endpoint, handle.clock, params.tier_weights)
        self.subscriber: KVEventSubscriber | None = None
        self.sync: SpecSync | None = None
        self._pool_names: frozenset[str] = frozenset()
        self._pool_watch = PoolWatch(handle, self.prune)

    # ---- DataProducer -----------------------------------------------------
    def known_block_size(self, snap: EndpointSnapshot) -> int:
        """From the endpoint's events, else its vllm:cache_config_info; 0 if unknown."""
        return self.index.block_size(snap.name) or snap.metrics.cache_block_size

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
        ids = self._token_ids(state, request)
        hashable = ids[: self._media_cut(request)] if request.media else ids
        seed = _seed(request)
        known = [self.known_block_size(e) for e in endpoints]
        counts = collections.Counter(size for size in known if size)
        ref = counts.most_common(1)[0][0] if counts else self.params.block_size_tokens
        sizes = [size or ref for size in known]
        chains: dict[int, list[int]] = {}
        for size in sizes:
            if size not in chains:
                chains[size] = chain_tokens(hashable, size, seed)
        now = self.handle.clock()
        self.index.expire(now)
        matched: dict[str, float] = {}
        cached: dict[str, int] = {}
        for e, size in zip(endpoints, sizes, strict=True):
            weighted, n = self.index.longest_prefix(e.name, chains[size], now)
            if not n:
                continue
            if size != ref:  # the same share of the prompt, in the reference block size
                weighted = weighted * size / ref
                n = n * size // ref
            matched[e.name] = weighted
            cached[e.name] = n
        return PrefixMatchInfo(
            total_blocks=len(ids) // ref,
            block_size_tokens=ref,
            matched=matched,
            cached_blocks=cached,
            chains=chains,
            prompt_tokens=len(ids),
            occupancy=self._occupancy(endpoints),
        )

    def _occupancy(
        self, endpoints: list[EndpointSnapshot]
    ) -> Callable[[Sequence[str]], list[float]]:
        """`PrefixMatchInfo.occupancy`: the blocks each endpoint's events say it holds over
        its `num_gpu_blocks` (vllm:cache_config_info), else over `maxBlocksPerEndpoint`.
        The capacities are read only when a consumer asks (`evictionCost`)."""
        fallback = self.params.max_blocks_per_endpoint
        caps: dict[str, int] = {}

        def occupancy(names: Sequence[str]) -> list[float]:
            if not caps:  # once per request, however many consumers ask
                caps.update((e.name, e.metrics.cache_num_blocks or fallback) for e in endpoints)
            sizes = self.index.sizes(names)
            return [s / caps.get(n, fallback) for n, s in zip(names, sizes, strict=True)]

        return occupancy

    def _token_ids(self, state: CycleState | None, request: InferenceRequest) -> list[int]:
        return prompt_token_ids(state, request, self.tokenizer)

    def _media_cut(self, request: InferenceRequest) -> int:
        """The tokens before the request's first media item. vLLM keys every block that
        holds a media item's placeholder with the hash of the decoded media (extra keys
        `("mm", identifier, offset)`), which the EPP cannot compute, so only the full
        blocks before that item can be matched: the chain stops there. A request with
        media is tokenized from its plain rendering (the template does not render media
        parts), where the item's marker starts at `media_at`."""
        return len(self.tokenizer.encode(request.prompt_text[: request.media_at]))

    # ---- PreRequest ---------------------------------------------------------
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        if not self.params.speculative_indexing or self.ttl <= 0:
            return
        info: PrefixMatchInfo | None = result.cycle_state.read(PREFIX_MATCH_KEY)
        if info is None:
            return
        for snap in first_targets(result):
            size = self.known_block_size(snap) or info.block_size_tokens
            hashes = info.chains.get(size)
            if hashes is None:  # the endpoint's block size changed since `produce`
                ids = self._token_ids(result.cycle_state, request)
                if request.media:
                    ids = ids[: self._media_cut(request)]
                hashes = chain_tokens(ids, size, _seed(request))
            self.index.add_speculative(snap.name, hashes, self.ttl)
            if self.sync is not None:
                self.sync.publish(snap.name, hashes, self.ttl)

    def _on_peer_entry(self, endpoint: str, hashes: list[int], ttl: float) -> None:
        """A peer replica routed a request to `endpoint`: the same speculative entry here
        (an endpoint this replica does not have is skipped). It lives at most this
        replica's own TTL, which keeps the index's expiry queue in order."""
        if endpoint in self._pool_names:
            self.index.add_speculative(endpoint, hashes, min(ttl, self.ttl))

    # ---- Lifecycle: the KV-event subscriber -----------------------------------
    async def start(self) -> None:
        if self.subscriber is not None:
            return
        h = self.handle
        p = self.params
        self._pool_watch.start()
        self._pool_names = frozenset(e.name for e in h.pool())
        self.subscriber = KVEventSubscriber(
            self._on_batch,
            mode=p.mode,
            endpoint=p.endpoint,
            publisher_port=p.publisher_port,
            topic_filter=p.topic_filter,
            pool=lambda: h.pool(),
            on_pool_change=lambda fn: h.on_pool_change(fn),
        )
        try:
            await self.subscriber.start()
            if p.speculative_sync_bind:
                self.sync = SpecSync(
                    p.speculative_sync_bind, p.speculative_sync_peers, self._on_peer_entry
                )
                await self.sync.start()
        except Exception:
            await self.stop()
            raise

    def _on_batch(self, endpoint: str, model: str, batch: EventBatch) -> None:
        self.index.on_batch(endpoint, model, batch)
        # upstream's prefix_indexer_size, for this index too (sum over a few endpoints)
        metrics.INDEXER_SIZE.set(self.index.total_size())

    async def stop(self) -> None:
        self._pool_watch.stop()
        if self.sync is not None:
            sync, self.sync = self.sync, None
            await sync.stop()
        if self.subscriber is not None:
            sub, self.subscriber = self.subscriber, None
            await sub.stop()

    def prune(self) -> None:
        self._pool_names = frozenset(e.name for e in self.handle.pool())
        gone = self.index.retain(e.name for e in self.handle.pool())
        if gone:
            log.debug("precise prefix index: dropped endpoints no longer in the pool: %s", gone)


def _seed(request: InferenceRequest) -> int:
    return chain_seed(request.target_model or request.model, request.cache_salt)
