"""`data-parallel-rank-picker`: which data-parallel rank of the picked server runs the
request, named in the `x-data-parallel-rank` header.

A vLLM server started with `--data-parallel-size N` and one API server is one endpoint
(one port) with N engines, each with its own queue and its own prefix cache. Without
the header vLLM's API server balances by its ranks' queue lengths
(`DPLBAsyncMPClient.get_core_engine_for_request`), blind to which rank holds the
prompt's prefix; with it (`OpenAIServing._get_data_parallel_rank`) the request runs on
the named rank. llm-d-router models DP as one endpoint per rank, each rank on its own
port (llm-d/llm-d-router#340, the routing sidecar's `--data-parallel-size` listening on
N ports); a single-port DP server has no such endpoints, so here the rank is a
post-pick step: the profiles pick the endpoint as for any server (its metrics are the
ranks' totals), then this hook picks the rank:

1. the longest prefix held by a rank, from the precise prefix index's per-rank view
   (KV events carry `data_parallel_rank`), when a `precise-prefix-cache-producer` runs;
2. among equal prefixes, the least loaded rank: scraped waiting + running (vLLM labels
   each rank's series `engine="<rank>"`) plus the requests this EPP sent to the rank
   since that scrape, so a burst between scrapes still spreads;
3. a prefix is given up when its rank carries more than `maxLoadImbalance` requests
   above the least loaded one (prefix affinity must not pin a hot prompt to one rank).

Servers whose scrape shows one rank (the common case) cost one attribute read: the
hook returns before any work, and no header is added.
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.config.params import param
from epp.datastore import EndpointSnapshot
from epp.headers import DATA_PARALLEL_RANK
from epp.request import InferenceRequest
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register
from epp.scheduling.types import PREFIX_MATCH_KEY, SchedulingResult
from plugins.prefix.precise_index import PreciseIndex, rank_key

DP_RANK_PICKER_TYPE = "data-parallel-rank-picker"


@dataclass(frozen=True)
class DataParallelRankParams:
    prefix_producer: str = param(
        "",
        doc="name of the precise-prefix-cache-producer whose per-rank index to read "
        "(empty: the first one configured; none: ranks are picked by load alone)",
    )
    max_load_imbalance: int = param(
        8,
        min=0,
        doc="requests a prefix-holding rank may carry above the least loaded rank before "
        "the least loaded one is taken instead",
    )


@register(DP_RANK_PICKER_TYPE)
class DataParallelRankPicker(Plugin):
    Params = DataParallelRankParams

    def __init__(self, name: str, params: DataParallelRankParams, handle: Handle) -> None:
        super().__init__(name)
        self.params = params
        self.handle = handle
        self._producer: object | None = None
        self._resolved = False
        # endpoint name → (update_time of the scrape the counts follow, sent per rank)
        self._sent: dict[str, tuple[float, dict[int, int]]] = {}

    def _prefix_producer(self) -> object | None:
        """The producer whose `index` (a PreciseIndex) to read, found once."""
        if not self._resolved:
            self._resolved = True
            want = self.params.prefix_producer
            for p in self.handle.plugins.values():
                if (not want or p.name == want) and isinstance(
                    getattr(p, "index", None), PreciseIndex
                ):
                    self._producer = p
                    break
            if want and self._producer is None:
                raise ValueError(
                    f"{DP_RANK_PICKER_TYPE} {self.name!r}: prefixProducer {want!r} is not a "
                    "configured precise-prefix-cache-producer"
                )
        return self._producer

    def check_references(self) -> None:
        """Called by the config loader once every plugin exists: a wrong `prefixProducer`
        is a start-up error, not a failure of the first request."""
        self._prefix_producer()

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        target = result.primary.targets[0]
        if not target.metrics.ranks:
            return
        rank = self.pick_rank(target, result)
        result.headers[DATA_PARALLEL_RANK] = str(rank)

    def pick_rank(self, target: EndpointSnapshot, result: SchedulingResult) -> int:
        ranks = target.metrics.ranks
        name = target.name
        stamp = target.metrics.update_time
        seen = self._sent.get(name)
        if seen is None or seen[0] != stamp:
            seen = self._sent[name] = (stamp, {})
        sent = seen[1]
        loads = {
            r.rank: r.waiting_queue_size + r.running_requests + sent.get(r.rank, 0) for r in ranks
        }
        least = min(loads.values())
        matched, hashes, index, ttl = self._matches(target, result)
        best = min(
            loads,
            key=lambda r: (
                -(matched.get(r, 0.0) if loads[r] - least <= self.params.max_load_imbalance else 0),
                loads[r],
                r,
            ),
        )
        sent[best] = sent.get(best, 0) + 1
        if index is not None and hashes and ttl > 0:
            index.ranks_index().add_speculative(rank_key(name, best), hashes, ttl)
        return best

    def _matches(
        self, target: EndpointSnapshot, result: SchedulingResult
    ) -> tuple[dict[int, float], list[int], PreciseIndex | None, float]:
        """Per rank, the tier-weighted prefix it holds, and what to record the pick with."""
        producer = self._prefix_producer()
        info = result.cycle_state.read(PREFIX_MATCH_KEY)
        if producer is None or info is None:
            return {}, [], None, 0.0
        index: PreciseIndex = producer.index  # type: ignore[attr-defined]
        size = index.block_size(target.name) or info.block_size_tokens
        hashes = list(info.chains.get(size) or info.chains.get(info.block_size_tokens) or ())
        ttl = (
            float(getattr(producer, "ttl", 0.0))
            if getattr(getattr(producer, "params", None), "speculative_indexing", False)
            else 0.0
        )
        ranked = index.ranked
        if ranked is None or not hashes:
            return {}, hashes, index, ttl
        now = self.handle.clock()
        return (
            {
                r.rank: ranked.longest_prefix(rank_key(target.name, r.rank), hashes, now)[0]
                for r in target.metrics.ranks
            },
            hashes,
            index,
            ttl,
        )
