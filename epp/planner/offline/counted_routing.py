"""The replay's routing, counted: the picks `routing.EppRouter` makes through the EPP's
`Director` and a config of the default's shape (config/default.yaml), for a trace whose
prompts share no prefix block, computed from a few counters per endpoint instead of
running the director, the datastore's snapshots and every plugin per request.

Why it is the same pick. In such a replay (`unique_prompts.py`) the prefix index never
matches, and a request carries no SLO targets, so for the plugins a config must be made
of (`plan`):

- `prefix-cache-affinity-filter` finds no sticky endpoint and keeps every candidate (it
  draws no random number then);
- `prefix-scorer` scores 0 and `slo-calibrated-scorer` `NEUTRAL` on every endpoint
  (with `calibrated-latency-producer` predicting nothing: no default SLO);
- `token-load-scorer` scores 1 - min(1, load / threshold), load = in-flight tokens +
  perRequestTokens x in-flight requests + the whole prompt (x (1 + cache fill) with
  `evictionCost`), the fill being the counting index's blocks over the endpoint's
  capacity (`UniqueChainIndex.fills`);
- `max-score-picker` (one endpoint) takes the highest weighted sum, drawing among ties
  from the config's own seeded generator, with the same call.

The sums are the profile's: `w1*s1 + w2*s2 + ...` in the profile's order, as floats, so
rounding and ties are the live ones. The in-flight counters are the datastore's
(`acquire` / `prefill_done` / `release`, the director's holds), the capacity and block
size those autoTune reads from an endpoint's first scrape, as in `EppRouter`.

Any other config (another plugin, picker, handler, a second profile or token-load
scorer, a default SLO), or a trace with shared prefix blocks, routes through
`EppRouter`: `router_for` decides. tests/unit/test_planner_replay_counted.py drives both
routers through random sequences of joins, drains, departures, requests, first tokens
and ends, and checks every pick.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from epp.config.loader import LoadedConfig
from epp.planner.offline import unique_prompts
from epp.planner.offline.routing import SCRAPE_S, EppRouter
from plugins.filters.prefix_affinity import PrefixCacheAffinityFilter
from plugins.latency.calibrated import CalibratedLatencyProducer, SloCalibratedScorer
from plugins.latency.slack import NEUTRAL
from plugins.pickers.max_score import MaxScorePicker
from plugins.prefix.approx_producer import ApproxPrefixCacheProducer
from plugins.prefix.prefix_scorer import PrefixScorer
from plugins.profile_handlers.single import SingleProfileHandler
from plugins.scorers.token_load import TokenLoadScorer


@dataclass(frozen=True, slots=True)
class Plan:
    """What the picks of an eligible config depend on."""

    before: tuple[float, ...]  # w*s of the constant scorers ahead of token-load, in order
    load_weight: float | None  # token-load's weight; None: no token-load scorer
    after: tuple[float, ...]  # w*s of the constant scorers after it
    threshold: int
    per_request: int
    eviction: bool
    block_tokens: int  # the producer's blockSizeTokens (before a scrape tells autoTune)
    max_blocks: int  # the producer's cap on blocks per prompt, at the scraped block size
    default_max_blocks: int  # the same at `block_tokens`
    lru_capacity: int
    auto_tune: bool


def plan(config: LoadedConfig, block_size: int) -> Plan | None:
    """The plan of `config` if its picks can be counted (module doc), else None.
    `block_size`: the servers' KV block size (what autoTune reads)."""
    sched = config.scheduler
    if not isinstance(sched.handler, SingleProfileHandler) or len(sched.profiles) != 1:
        return None
    if sched.admitters:
        return None
    (profile,) = sched.profiles.values()
    picker = profile.picker
    if not isinstance(picker, MaxScorePicker) or picker.k != 1:
        return None
    if not all(isinstance(f, PrefixCacheAffinityFilter) for f in profile.filters):
        return None
    producers = [p for p in config.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
    if len(producers) != 1 or not isinstance(producers[0].index, unique_prompts.UniqueChainIndex):
        return None
    producer = producers[0]
    for p in config.plugins.values():
        if isinstance(p, CalibratedLatencyProducer):
            if p.params.default_ttft_slo_ms > 0 or p.params.default_tpot_slo_ms > 0:
                return None
        elif not isinstance(
            p,
            ApproxPrefixCacheProducer
            | PrefixCacheAffinityFilter
            | SloCalibratedScorer
            | TokenLoadScorer
            | PrefixScorer
            | MaxScorePicker
            | SingleProfileHandler,
        ):
            return None
    before: list[float] = []
    after: list[float] = []
    token_load: TokenLoadScorer | None = None
    weight = None
    for ws in profile.scorers:
        s = ws.scorer
        if isinstance(s, TokenLoadScorer) and token_load is None:
            token_load, weight = s, ws.weight
        elif isinstance(s, SloCalibratedScorer):
            (after if token_load else before).append(ws.weight * NEUTRAL)
        elif isinstance(s, PrefixScorer):
            (after if token_load else before).append(ws.weight * 0.0)
        else:
            return None
    params = producer.params
    if params.hash_block_size:
        return None  # characters per block: not what the replay's token ids are cut by
    return Plan(
        before=tuple(before),
        load_weight=weight,
        after=tuple(after),
        threshold=token_load.threshold if token_load else 1,
        per_request=token_load.per_request if token_load else 0,
        eviction=token_load.eviction if token_load else False,
        block_tokens=params.block_size_tokens,
        max_blocks=producer.max_blocks(block_size) if block_size > 0 else 0,
        default_max_blocks=producer.max_blocks(params.block_size_tokens),
        lru_capacity=params.lru_capacity_per_server,
        auto_tune=params.auto_tune,
    )


def router_for(
    config_text: str,
    source: str,
    *,
    seed: int,
    block_tokens: int,
    cache_block_size: int,
    cache_num_blocks: int,
    unique: bool = False,
) -> EppRouter | CountedRouter:
    """The replay's router: counted when the trace shares no prefix block and the config
    allows it (module doc), else the director's."""
    router = EppRouter(
        config_text,
        source,
        seed=seed,
        block_tokens=block_tokens,
        cache_block_size=cache_block_size,
        cache_num_blocks=cache_num_blocks,
        unique_prompts=unique,
    )
    if router.unique_prompts:
        p = plan(router.config, cache_block_size)
        if p is not None:
            return CountedRouter(p, router.config, cache_block_size, cache_num_blocks)
    return router


class _Endpoint:
    """One endpoint's counters: the datastore's in-flight ones, and the counting index's
    blocks, with the two terms a pick reads kept up to date as they change."""

    __slots__ = ("base", "blocks", "capacity", "decode", "fill_term", "prefill", "requests")

    def __init__(self) -> None:
        self.requests = self.prefill = self.decode = 0
        self.blocks = 0
        self.capacity = 0  # 0: no block recorded yet (the index holds nothing for it)
        self.base = 0  # in-flight tokens + perRequestTokens x in-flight requests (an int)
        self.fill_term = 1.0  # 1 + min(1, fill): what the eviction cost multiplies


class CountedRouter:
    """`EppRouter`'s interface and picks (module doc) over per-endpoint counters."""

    unique_prompts = True

    def __init__(
        self, plan: Plan, config: LoadedConfig, cache_block_size: int, cache_num_blocks: int
    ) -> None:
        self.plan = plan
        self.rng = config.handle.rng  # the picker's: its tie-breaks draw as the live ones
        # the scorers' constant terms folded in the profile's order around token-load's
        pre = None
        for v in plan.before:
            pre = v if pre is None else pre + v
        self._pre = pre
        # + 0.0 (a prefix scorer's weighted 0 after token-load's) changes no comparison
        # (only -0.0 to 0.0, which compare equal): skipped
        self._after = tuple(v for v in plan.after if v != 0.0)
        self.now = 0.0
        self.scrape_s = SCRAPE_S
        self._next_scrape = 0.0
        self.geometry = (cache_block_size, cache_num_blocks)
        self._names: list[str] = []  # the candidates: joined, not draining, join order
        self._active: list[_Endpoint] = []  # theirs, in the same order
        self._by_name: dict[str, _Endpoint] = {}  # every endpoint in the pool
        self._unscraped: list[str] = []  # joined since the last scrape
        self._scraped: set[str] = set()  # geometry known (autoTune)
        # rid -> (its endpoint, prompt tokens still held, output tokens); an endpoint that
        # left stays referenced here, detached: late releases change nothing that is read
        self._holds: dict[int, tuple[_Endpoint, int, int]] = {}
        self._firsts: list[tuple[float, int]] = []  # (first token, rid): prompt released
        self._ends: list[tuple[float, int]] = []  # (finish, rid)

    # -- membership (EppRouter's) --------------------------------------------------------

    def join(self, name: str) -> None:
        e = self._by_name[name] = _Endpoint()
        self._names.append(name)
        self._active.append(e)
        self._scraped.discard(name)
        self._unscraped.append(name)
        self._next_scrape = self.now  # a new endpoint is scraped at once

    def drain(self, name: str) -> None:
        if name in self._names:
            i = self._names.index(name)
            del self._names[i], self._active[i]

    def leave(self, name: str) -> None:
        """The datastore forgets it, and so does the index (its pool watch)."""
        self.drain(name)
        self._by_name.pop(name, None)
        self._scraped.discard(name)

    # -- time ----------------------------------------------------------------------------

    def first_token(self, rid: int, at: float) -> None:
        """`rid`'s first token came at `at` (the engine tells, as it steps): from then
        on its prompt no longer counts (`EppRouter` reads the same time off the engine's
        request at each settle)."""
        heapq.heappush(self._firsts, (at, rid))

    def finished(self, rid: int, finish: float) -> None:
        heapq.heappush(self._ends, (finish, rid))

    def settle(self, now: float, loads: object = None) -> None:
        """First tokens and ends up to `now` (the director's `first_token` and `release`;
        a first token is always taken before its end, as there),
        and the scrape tick: only whether an endpoint was ever scraped matters to these
        picks (autoTune's geometry), so `loads` is not read."""
        self.now = now
        k = self.plan.per_request
        firsts, holds = self._firsts, self._holds
        while firsts and firsts[0][0] <= now:
            _, rid = heapq.heappop(firsts)
            e, prompt, output = holds[rid]
            e.prefill = p = max(0, e.prefill - prompt)
            e.base = p + e.decode + k * e.requests
            holds[rid] = (e, 0, output)  # its prompt is no longer held
        ends = self._ends
        while ends and ends[0][0] <= now:
            _, rid = heapq.heappop(ends)
            e, prompt, output = self._holds.pop(rid)
            e.requests = r = max(0, e.requests - 1)
            e.prefill = p = max(0, e.prefill - prompt)
            e.decode = d = max(0, e.decode - output)
            e.base = p + d + k * r
        if now >= self._next_scrape:
            if self._unscraped:
                names = set(self._names)
                self._scraped.update(n for n in self._unscraped if n in names)
                self._unscraped = []
            self._next_scrape = (math.floor(now / self.scrape_s) + 1) * self.scrape_s

    # -- routing -------------------------------------------------------------------------

    def pick(self, rid: int, isl: int, osl: int, hash_ids: Sequence[int]) -> str:
        """The director's pick for the request (its hold taken, its blocks counted)."""
        if hash_ids:
            raise ValueError(f"request {rid} shares prefix blocks in a unique-prompt replay")
        active = self._active
        if not active:
            raise LookupError("no endpoint to route to")
        p = self.plan
        w = p.load_weight
        pre = self._pre
        if w is None:
            totals = [0.0 if pre is None else pre] * len(active)
        else:
            # `token-load-scorer`: 1 - min(1, load / t), load = in-flight tokens + k x
            # requests + this prompt there (`placement_tokens`: x (1 + min(1, fill)))
            t = p.threshold
            if p.eviction:
                loads = [e.base + isl * e.fill_term for e in active]
            else:
                loads = [e.base + isl for e in active]
            if pre is None:
                totals = [w * (1.0 - (r if (r := x / t) < 1.0 else 1.0)) for x in loads]
            else:
                totals = [pre + w * (1.0 - (r if (r := x / t) < 1.0 else 1.0)) for x in loads]
        for v in self._after:
            totals = [s + v for s in totals]
        best = max(totals)
        if totals.count(best) == 1:
            i = totals.index(best)
        else:
            tied = [i for i, s in enumerate(totals) if s == best]
            i = tied[self.rng.randrange(len(tied))]
        name = self._names[i]
        e = active[i]
        self._count_blocks(name, e, isl)
        # the director's hold: the whole prompt (nothing is cached) and the output
        e.requests += 1
        e.prefill += isl
        e.decode += osl
        e.base = e.prefill + e.decode + p.per_request * e.requests
        self._holds[rid] = (e, isl, osl)
        return name

    def _count_blocks(self, name: str, e: _Endpoint, isl: int) -> None:
        """The producer's pre-request: the prompt's blocks (at the block size autoTune
        reads from the first candidate) added to the pick's count, up to its capacity."""
        p = self.plan
        size, blocks_per_server = self.geometry
        scraped = self._scraped
        if p.auto_tune and size > 0 and self._names[0] in scraped:
            bt, most = size, p.max_blocks
        else:
            bt, most = p.block_tokens, p.default_max_blocks
        if isl < bt:
            return  # no block: nothing recorded
        blocks = min(-(-isl // bt), most)
        if p.auto_tune and blocks_per_server > 0 and name in scraped:
            capacity = blocks_per_server
        else:
            capacity = p.lru_capacity
        e.capacity = capacity
        h = e.blocks + blocks
        e.blocks = h = h if h < capacity else capacity
        f = h / capacity  # `UniqueChainIndex.fills`
        e.fill_term = 1.0 + (f if f < 1.0 else 1.0)

    def routed(self, rid: int, name: str, engine_request: object) -> None:
        """`EppRouter`'s; here first tokens come by `first_token`."""
