"""The replay's model-server pool: replicas that start, serve and drain, each one a
`VirtualEngine` (the simulator's own scheduler in virtual time), and the EPP's default
routing in front of them.

Lifecycle (what the live connectors do): a replica the planner adds
holds its GPUs from the decision on, but serves only after `startup_s` (a new vLLM
loads weights and captures graphs for minutes). A replica it removes is drained: it
takes no new request, finishes those it holds, and frees its GPUs when the last one
completes. No request is ever dropped; requests that arrive while no replica is ready
wait in the EPP (as `director.py`'s scale-from-zero hold queue does) and are routed
when one is.

Routing is the EPP's own (`routing.EppRouter`): the `Director` and scheduler of the
config `epp serve` would run (config/default.yaml unless the replay names another), told
the pool's membership, scrapes and the requests it holds as `epp serve` would be. Every
plugin of the config runs on every request: the cache hits and queueing of a replay are
the ones the EPP would produce.

Fleet scale: routing reads every ready replica at every arrival, but most
replicas are inside a planned decode run that nothing needs carried out yet. The pool
keeps a heap of each engine's `due_after` time and advances only the engines whose
time has passed; the others are read in closed form at the arrival (`load(at)`). The
ready list and the replicas that may change state (starting, draining) are kept as
they change instead of filtered from every replica per arrival. `lazy=False` walks
every replica as before: the tests check both give the same replay to the bit.

Pure: no clock, no I/O; the caller moves time forward.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from epp.config.loader import DEFAULT_CONFIG
from epp.planner.core.types import EndpointLoad, Replicas, Role
from epp.planner.offline.counted_routing import CountedRouter, router_for
from epp.planner.offline.routing import EppRouter
from epp.sim.config import SimConfig
from epp.sim.virtual import Finished, Load, VirtualEngine


class State(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"  # released its GPUs (drained, or cancelled while starting)


@dataclass(eq=False)
class Replica:
    name: str
    role: Role
    engine: VirtualEngine
    gpus: int
    started_at: float  # GPUs held from here
    ready_at: float
    state: State = State.STARTING
    released_at: float = math.inf  # GPUs freed here
    drain_from: float = math.inf  # asked to drain here
    last_finish: float = 0.0
    in_flight: int = 0  # requests routed here and not yet finished
    seq: int = 0  # start order (the order every per-replica walk keeps)
    due_version: int = 0  # the pool's heap entry for this replica that is current
    scraped: object = None  # the engine's `steady()` token at its last scrape

    def gpu_seconds(self, start: float, end: float) -> float:
        """GPU-seconds this replica held within [start, end)."""
        lo, hi = max(start, self.started_at), min(end, self.released_at)
        return max(0.0, hi - lo) * self.gpus


@dataclass(frozen=True, slots=True)
class Routing:
    """The EPP config the replay routes with: its YAML text and where it came from."""

    text: str
    source: str


# `epp serve` without --config (config/default.yaml)
DEFAULT_ROUTING = Routing(DEFAULT_CONFIG, "<built-in default>")


@dataclass(frozen=True, slots=True)
class PoolShape:
    """What every replica is: the simulated server, its GPUs, how long it takes to start,
    and the EPP config in front of the pool."""

    sim: SimConfig
    gpus_per_replica: int = 1
    startup_s: float = 120.0
    block_tokens: int = 512  # the trace's prefix-block size (Mooncake: 512)
    routing: Routing = DEFAULT_ROUTING

    def router(self, seed: int, *, unique_prompts: bool = False) -> EppRouter | CountedRouter:
        """A fresh router for one replay (empty prefix index, seeded tie-breaks);
        `unique_prompts`: no request shares a prefix block (`unique_prompts.py`), and
        the picks are counted where the config allows (`counted_routing.py`)."""
        return router_for(
            self.routing.text,
            self.routing.source,
            seed=seed,
            block_tokens=self.block_tokens,
            cache_block_size=self.sim.block_size,
            cache_num_blocks=self.sim.num_gpu_blocks,
            unique=unique_prompts,
        )

    def __post_init__(self) -> None:
        if self.gpus_per_replica < 1:
            raise ValueError("gpus_per_replica must be >= 1")
        if self.startup_s < 0 or not math.isfinite(self.startup_s):
            raise ValueError("startup_s must be a non-negative number of seconds")


class Spares:
    """Idle engines kept for reuse, per server shape (`VirtualEngine.reset` makes them
    fresh replicas): replays that start replicas often, or run one after another, skip
    rebuilding the KV block pool each time."""

    def __init__(self, *, macro: bool = True) -> None:
        self.macro = macro  # False: step every engine step singly (to measure the jump)
        self._idle: dict[tuple[SimConfig, int], list[VirtualEngine]] = {}

    def get(self, sim: SimConfig, block_tokens: int) -> VirtualEngine:
        stack = self._idle.get((sim, block_tokens))
        if stack:
            return stack.pop()
        return VirtualEngine(sim, block_tokens=block_tokens, macro=self.macro)

    def put(self, engine: VirtualEngine) -> None:
        if not engine.idle:
            return  # still busy (a run that gave up): not reusable
        engine.reset()
        self._idle.setdefault((engine.config, engine.block_tokens), []).append(engine)


class Pool:
    """One role's replicas (an aggregated pool: every replica prefills and decodes)."""

    def __init__(
        self,
        shape: PoolShape,
        *,
        role: Role = Role.AGGREGATED,
        seed: int = 0,
        spares: Spares | None = None,
        lazy: bool = True,
        unique_prompts: bool = False,
    ) -> None:
        self.shape = shape
        self.router = shape.router(seed, unique_prompts=unique_prompts)
        # the counted router is told first tokens as the engines produce them (and reads
        # no scrape); the director's reads each engine request's first-token time
        self._counted = isinstance(self.router, CountedRouter)
        self._by_name: dict[str, Replica] = {}
        self.role = role
        self.spares = spares or Spares()
        self.replicas: list[Replica] = []  # every replica the run started (lifetimes)
        self._live: list[Replica] = []  # those not GONE: what every per-arrival loop walks
        self.steps = 0  # engine steps of retired replicas (the rest: ask their engines)
        self._next = 0
        self.lazy = lazy
        self.now = 0.0  # the last advance_to target
        self._due: list[tuple[float, int, int, Replica]] = []  # (due_after, version, seq, r)
        self._ready: list[Replica] | None = None  # READY replicas in start order (cache)
        self._pending: list[Replica] = []  # STARTING or DRAINING: what update() looks at

    # -- membership --------------------------------------------------------------------

    def start(self, now: float, *, ready: bool = False) -> Replica:
        """A new replica holding its GPUs from `now`, serving after the start-up delay
        (at once with `ready`: the pool a run begins with)."""
        name = f"{self.role.value}-{self._next}"
        self._next += 1
        engine = self.spares.get(self.shape.sim, self.shape.block_tokens)
        engine.first_tokens = [] if self._counted else None
        ready_at = now if ready else now + self.shape.startup_s
        rep = Replica(name, self.role, engine, self.shape.gpus_per_replica, now, ready_at)
        rep.seq = self._next - 1
        self._by_name[name] = rep
        if ready:
            rep.state = State.READY
            self._ready = None
            self.router.join(name)
        else:
            self._pending.append(rep)
        self.replicas.append(rep)
        self._live.append(rep)
        return rep

    def live(self) -> list[Replica]:
        return list(self._live)

    def of(self, state: State) -> list[Replica]:
        if state is State.READY:
            return list(self._ready_list())
        pool = self.replicas if state is State.GONE else self._live
        return [r for r in pool if r.state is state]

    def has_ready(self) -> bool:
        return bool(self._ready_list())

    def starting(self) -> list[Replica]:
        """`of(State.STARTING)`, in start order, from the few replicas that may change
        state instead of every live one (asked at every arrival)."""
        return [r for r in self._pending if r.state is State.STARTING]

    def _ready_list(self) -> list[Replica]:
        if self._ready is None:
            self._ready = [r for r in self._live if r.state is State.READY]
        return self._ready

    def load(self, r: Replica) -> Load:
        """`r`'s load now (as of the last `advance_to`)."""
        return r.engine.load(self.now)

    def counts(self) -> Replicas:
        c = {s: 0 for s in State}
        for r in self._live:
            c[r.state] += 1
        return Replicas(c[State.READY], c[State.STARTING], c[State.DRAINING])

    def update(self, now: float) -> None:
        """Starting replicas whose delay has passed become ready; drained ones free
        their GPUs (at their last completion)."""
        if not self._pending:
            return
        gone = False
        for r in self._pending:  # in start order, as every walk of the replicas
            if r.state is State.STARTING and r.ready_at <= now:
                r.state = State.READY
                self._ready = None
                self.router.join(r.name)
            elif r.state is State.DRAINING and r.in_flight == 0:
                r.state = State.GONE
                r.released_at = max(r.last_finish, r.drain_from)
                self._retire(r)
                self.router.leave(r.name)
                gone = True
        self._pending = [r for r in self._pending if r.state in (State.STARTING, State.DRAINING)]
        if gone:
            self._prune()

    def _prune(self) -> None:
        self._live = [r for r in self._live if r.state is not State.GONE]

    def _retire(self, r: Replica) -> None:
        self.steps += r.engine.scheduler.stats.steps
        self.spares.put(r.engine)

    def close(self) -> None:
        """The run is over: hand every idle engine back to the spares."""
        for r in self._live:
            self._retire(r)

    def scale_to(self, target: int, now: float, prefer_drain: Sequence[str] = ()) -> int:
        """Bring ready + starting to `target`: start new replicas, or cancel starting
        ones (newest first: they hold no work) and then drain ready ones (those named
        first, then the least in-flight work). Returns the change in replicas."""
        starting = self.of(State.STARTING)
        ready = self.of(State.READY)
        have = len(starting) + len(ready)
        if target > have:
            for _ in range(target - have):
                self.start(now)
            return target - have
        excess = have - target
        for r in reversed(starting):
            if excess == 0:
                break
            r.state = State.GONE
            r.released_at = now
            self._retire(r)
            excess -= 1
        self._prune()
        self._ready = None
        named = {n: i for i, n in enumerate(prefer_drain)}
        order = sorted(
            ready,
            key=lambda r: (
                named.get(r.name, len(named)),
                r.in_flight,
                r.engine.load(max(self.now, now)).in_flight_tokens,
                r.name,
            ),
        )
        for r in order[:excess]:
            r.state = State.DRAINING
            r.drain_from = now
            self.router.drain(r.name)
        self._pending = sorted(
            [r for r in self._pending if r.state is not State.GONE] + order[:excess],
            key=lambda r: r.seq,
        )
        return target - have

    # -- time --------------------------------------------------------------------------

    def advance_to(self, t: float) -> list[Finished]:
        """Run every live replica up to `t`; what completed (finish times may pass `t` by
        the step in progress). Lazily: only the engines due before `t` (module doc)."""
        self.now = max(self.now, t)
        done: list[Finished] = []
        if not self.lazy:
            for r in self._live:
                if r.state is not State.STARTING:
                    self._step(r, t, done)
            return done
        heap, moved = self._due, []
        while heap and heap[0][0] < t:
            _, version, _, r = heapq.heappop(heap)
            if version == r.due_version and r.state is not State.GONE:
                self._step(r, t, done)
                moved.append(r)
        for r in moved:
            self._schedule(r)
        return done

    def _step(self, r: Replica, t: float, done: list[Finished]) -> None:
        engine = r.engine
        engine.advance_to(t)
        firsts = engine.first_tokens
        if firsts:
            first_token = self.router.first_token  # type: ignore[union-attr]
            for rid, at in firsts:
                first_token(rid, at)
            firsts.clear()
        finished = engine.drain_finished()
        if finished:
            r.in_flight -= len(finished)
            r.last_finish = max(r.last_finish, max(f.finish for f in finished))
            done += finished
            for f in finished:
                self.router.finished(f.rid, f.finish)

    def _schedule(self, r: Replica) -> None:
        """(Re)enter `r` in the heap at its engine's `due_after` (older entries lapse)."""
        r.due_version += 1
        due = r.engine.due_after()
        if due < math.inf:
            heapq.heappush(self._due, (due, r.due_version, r.seq, r))

    # -- routing -----------------------------------------------------------------------

    def route(self, rid: int, isl: int, osl: int, at: float, hash_ids: Sequence[int]) -> Replica:
        """Send a request where the EPP picks (call `advance_to(at)` first);
        raises LookupError when none is ready."""
        ready = self._ready_list()
        if not ready:
            raise LookupError("no ready replica")
        now = max(self.now, at)
        router = self.router
        if self._counted:
            router.settle(now)
            rep = self._by_name[router.pick(rid, isl, osl, hash_ids)]
            rep.engine.add(rid, isl, osl, at, hash_ids)
            if self.lazy:
                self._schedule(rep)
            rep.in_flight += 1
            return rep

        def loads():
            # a replica whose engine has stayed steady since its last scrape would give
            # the values the router holds already (it writes only changes): skipped
            for r in ready:
                engine = r.engine
                token = engine.steady()
                if token is not None and token is r.scraped:
                    continue
                gauges = engine.gauges(now)
                r.scraped = engine.steady()
                yield r.name, *gauges

        router.settle(now, loads)
        rep = self._by_name[router.pick(rid, isl, osl, hash_ids)]
        engine = rep.engine
        engine.add(rid, isl, osl, at, hash_ids)
        router.routed(rid, rep.name, engine.scheduler.waiting[-1])
        if self.lazy:
            self._schedule(rep)
        rep.in_flight += 1
        return rep

    # -- what the planner sees ---------------------------------------------------------

    def endpoints(self) -> list[EndpointLoad]:
        out = []
        for r in self.of(State.READY):
            load = r.engine.load(self.now)
            out.append(EndpointLoad(r.name, r.role, load.in_flight_requests, load.in_flight_tokens))
        return out

    def gpu_seconds(self, start: float, end: float) -> float:
        return sum(r.gpu_seconds(start, end) for r in self.replicas)
