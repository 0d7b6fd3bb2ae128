"""`epp plan replay`'s core: a trace through a policy and a simulated pool, in virtual
time, in one process.

The loop is the live planner's, with the clock replaced: every `sample_interval_s` of
the policy it reads the pool's load into an `IntervalWindow` (Dynamo's
metric-pulling-interval), every `interval_s` it closes the window into an
`Observation`, calls `policy.step(now, obs)` and carries out the `Decision` on the pool
(`pool.Pool.scale_to`: start, cancel starting first, drain). Between samples, the
trace's requests arrive at their own times and are routed the moment they arrive.
Requests are recorded in the window when they complete, as the EPP's response path
would; a request whose prompt and output exceed the model's context is rejected by the
server, as vLLM does (an `ok=False` record), and reported apart: no policy can serve it.

The run ends when every request has been served; `max_tail_s` after the last arrival
it gives up and counts what is left as lost (a policy that never brings a replica back
after scaling to zero loses its held requests; any other loss is a bug).

Pure and deterministic for a seed: the routing's tie-break and the window's ISL
sample draw from seeded generators; `progress(now, last_arrival)` is the caller's hook.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from epp.planner.core.types import Decision, Policy, Role
from epp.planner.core.window import IntervalWindow, PoolSample, RequestRecord
from epp.planner.offline.pool import Pool, PoolShape, Replica, Spares, State
from epp.sim.virtual import Finished

Progress = Callable[[float, float], None]


class Arrival(Protocol):
    """One trace request (`epp.planner.offline.traces.Arrival`): seconds from the trace's start,
    prompt and output tokens, and the Mooncake prefix-block ids (empty when unknown)."""

    @property
    def t_s(self) -> float: ...
    @property
    def isl(self) -> int: ...
    @property
    def osl(self) -> int: ...
    @property
    def hash_ids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class Served:
    """One request's outcome, times from its arrival at the EPP."""

    rid: int
    arrival: float
    ttft_ms: float
    itl_ms: float  # its mean gap between output tokens; NaN with one output token
    finish: float
    isl: int
    osl: int
    cached_tokens: int
    replica: str


@dataclass(frozen=True, slots=True)
class Action:
    """A change of a role's target (ready + starting), as carried out."""

    at: float
    role: Role
    before: int
    after: int
    reason: str


@dataclass(frozen=True, slots=True)
class Lifetime:
    """When one replica held GPUs and in which state (see `pool.Replica`)."""

    name: str
    role: Role
    gpus: int
    started_at: float
    ready_at: float
    drain_from: float
    released_at: float

    def state_at(self, t: float) -> State:
        if t < self.started_at or t >= self.released_at:
            return State.GONE
        if t < self.ready_at:
            return State.STARTING
        if t >= self.drain_from:
            return State.DRAINING
        return State.READY

    def gpu_seconds(self, start: float, end: float) -> float:
        lo, hi = max(start, self.started_at), min(end, self.released_at)
        return max(0.0, hi - lo) * self.gpus


@dataclass(frozen=True)
class Run:
    """Everything one replay produced; `outcome.summarize` turns it into the report."""

    policy: str
    served: tuple[Served, ...]
    rejected: tuple[int, ...]  # rids the server refused (longer than the model's context)
    lost: int
    actions: tuple[Action, ...]
    decisions: tuple[Decision, ...]
    lifetimes: tuple[Lifetime, ...]
    end: float  # when the run stopped (the last completion, rounded up to a sample)
    last_arrival: float
    steps: int  # engine steps simulated, all replicas
    stopped: bool = False  # cut short by a `MissLimit`: the figures cover a prefix only


@dataclass(frozen=True, slots=True)
class MissLimit:
    """Stop the replay once more than `misses` served requests failed `met`: a search
    that only asks whether a pool keeps a share of the trace's requests has its answer
    then, and a pool far too small would otherwise replay the whole trace to say so."""

    met: Callable[[Served], bool]
    misses: int


def replay(
    arrivals: Sequence[Arrival],
    policy: Policy,
    shape: PoolShape,
    *,
    initial: int,
    seed: int = 0,
    max_tail_s: float = 3600.0,
    progress: Progress | None = None,
    spares: Spares | None = None,
    lazy: bool = True,
    miss_limit: MissLimit | None = None,
) -> Run:
    """Replay `arrivals` (sorted by time) through `policy` on a pool that starts with
    `initial` ready replicas of `shape`. `spares` lends idle engines across runs;
    `lazy=False` advances every replica at every arrival (`pool.Pool`, the reference
    the lazy pool is tested against). `miss_limit` ends the run early (`Run.stopped`)."""
    if not arrivals:
        raise ValueError("no arrivals to replay")
    if initial < 0:
        raise ValueError("initial must be >= 0")
    unique = not any(a.hash_ids for a in arrivals)  # ServeGen, Azure: no shared blocks
    pool = Pool(shape, seed=seed, spares=spares, lazy=lazy, unique_prompts=unique)
    run = _Replay(arrivals, policy, pool, initial, seed, max_tail_s, progress, miss_limit)
    return run.run()


class _Replay:
    def __init__(
        self,
        arrivals: Sequence[Arrival],
        policy: Policy,
        pool: Pool,
        initial: int,
        seed: int,
        max_tail_s: float,
        progress: Progress | None,
        miss_limit: MissLimit | None = None,
    ) -> None:
        self.arrivals = arrivals
        self.miss_limit = miss_limit
        self.misses = 0
        self.policy = policy
        self.pool = pool
        self.role = pool.role
        for _ in range(initial):
            pool.start(0.0, ready=True)
        self.window = IntervalWindow(0.0, rng=random.Random(seed))
        self.model_len = pool.shape.sim.model_len
        self.max_tail_s = max_tail_s
        self.progress = progress
        self.held: deque[int] = deque()  # rids waiting for a ready replica
        self.done: list[tuple[float, int, Finished]] = []  # heap: finished, not yet recorded
        self.served: list[Served] = []
        self.rejected: list[int] = []
        self.actions: list[Action] = []
        self.decisions: list[Decision] = []
        self.where: dict[int, str] = {}

    def run(self) -> Run:
        policy = self.policy
        dt = float(policy.sample_interval_s)
        if not dt > 0 or not policy.interval_s > 0:
            raise ValueError(f"policy {policy.name}: intervals must be positive")
        per = max(1, round(policy.interval_s / dt))
        arrivals = self.arrivals
        last = arrivals[-1].t_s
        i, tick, n = 0, 0, len(arrivals)
        next_report = 0.0
        lost = 0
        limit = self.miss_limit.misses if self.miss_limit is not None else math.inf
        stopped = False
        while True:
            tick += 1
            t = tick * dt
            while i < n and arrivals[i].t_s < t:
                self._arrive(i, arrivals[i])
                i += 1
            self._advance(t)
            self._record(t)
            self._sample()
            if tick % per == 0:
                self._decide(t)
            if self.progress is not None and t >= next_report:
                self.progress(min(t, last), last)
                next_report = t + 60.0
            if self.misses > limit:
                stopped = True
                break
            if i == n and not self.held and not self.done and self._idle():
                break
            if i == n and t > last + self.max_tail_s:
                self._record(math.inf)
                lost = len(self.held) + sum(r.in_flight for r in self.pool.replicas)
                break
        end = t
        lifetimes = tuple(_lifetime(r, end) for r in self.pool.replicas)
        self.pool.close()
        steps = self.pool.steps
        return Run(
            policy=policy.name,
            served=tuple(sorted(self.served, key=lambda s: s.rid)),
            rejected=tuple(self.rejected),
            lost=lost,
            actions=tuple(self.actions),
            decisions=tuple(self.decisions),
            lifetimes=lifetimes,
            end=end,
            last_arrival=last,
            steps=steps,
            stopped=stopped,
        )

    # -- requests ----------------------------------------------------------------------

    def _arrive(self, rid: int, a: Arrival) -> None:
        self._advance(a.t_s)
        self.window.admit(a.isl)
        if a.isl + a.osl > self.model_len or a.isl < 1 or a.osl < 1:
            self.rejected.append(rid)
            nan = math.nan
            self.window.complete(RequestRecord(a.t_s, a.isl, a.osl, nan, nan, 0.0, ok=False))
            return
        if not self.held and self.pool.has_ready():  # the common case: route it now
            self.where[rid] = self.pool.route(rid, a.isl, a.osl, a.t_s, a.hash_ids).name
            return
        self.held.append(rid)
        self._route_held(a.t_s)

    def _route_held(self, now: float) -> None:
        if not self.held or not self.pool.has_ready():
            return
        while self.held:
            rid = self.held.popleft()
            a = self.arrivals[rid]
            rep = self.pool.route(rid, a.isl, a.osl, now, a.hash_ids)
            self.where[rid] = rep.name

    def _advance(self, t: float) -> None:
        """Run the pool to `t`; newly ready replicas take the held requests at their
        ready time."""
        pool = self.pool
        for rep in sorted(pool.starting(), key=lambda r: r.ready_at) if self.held else ():
            if rep.ready_at <= t and self.held:
                self._collect(pool.advance_to(rep.ready_at))
                pool.update(rep.ready_at)
                self._route_held(rep.ready_at)
        self._collect(pool.advance_to(t))
        pool.update(t)
        self._route_held(t)

    def _collect(self, finished: list[Finished]) -> None:
        for f in finished:
            heapq.heappush(self.done, (f.finish, f.rid, f))

    def _record(self, now: float) -> None:
        """Completions up to `now` reach the window (a step in progress at a sample ends
        after it; its tokens count in the next interval, as a live EPP would see them)."""
        done = self.done
        while done and done[0][0] <= now:
            _, rid, f = heapq.heappop(done)
            a = self.arrivals[rid]
            ttft_ms = (f.first_token - a.t_s) * 1000.0
            itl_ms = f.itl_s * 1000.0
            served = Served(
                rid,
                a.t_s,
                ttft_ms,
                itl_ms,
                f.finish,
                f.isl,
                f.osl,
                f.cached_tokens,
                self.where.pop(rid),
            )
            self.served.append(served)
            if self.miss_limit is not None and not self.miss_limit.met(served):
                self.misses += 1
            self.window.complete(
                RequestRecord(
                    f.finish, f.isl, f.osl, ttft_ms, itl_ms, f.finish - a.t_s, f.cached_tokens
                )
            )

    def _idle(self) -> bool:
        return all(r.in_flight == 0 for r in self.pool.replicas)

    # -- the planner -------------------------------------------------------------------

    def _sample(self) -> None:
        ready = self.pool.of(State.READY)
        now = self.pool.now
        # (waiting, running, KV use) per replica: `load()`'s values without the tokens left
        gauges = [r.engine.gauges(now) for r in ready]
        kv = math.fsum(g[2] for g in gauges) / len(gauges) if gauges else 0.0
        self.window.sample(
            [
                PoolSample(
                    self.role,
                    waiting=sum(g[0] for g in gauges) + len(self.held),
                    running=sum(g[1] for g in gauges),
                    kv_mean=kv,
                    ready=len(ready),
                )
            ]
        )

    def _decide(self, now: float) -> None:
        pool = self.pool
        obs = self.window.close(now, {self.role: pool.counts()}, pool.endpoints())
        decision = self.policy.step(now, obs)
        self.decisions.append(decision)
        other = sorted(r.value for r in decision.targets if r is not self.role)
        if other or self.role not in decision.targets:
            raise ValueError(
                f"policy {self.policy.name} sized roles {sorted(map(str, decision.targets))}; "
                f"the replay models one {self.role.value} pool (P/D is not modelled yet)"
            )
        target = decision.target(self.role)
        if target < 0:
            raise ValueError(f"policy {self.policy.name} asked for {target} replicas")
        before = pool.counts().active
        if target != before:
            pool.scale_to(target, now, decision.drain)
            self.actions.append(Action(now, self.role, before, target, decision.reason))


def _lifetime(r: Replica, end: float) -> Lifetime:
    released = min(r.released_at, end)
    return Lifetime(r.name, r.role, r.gpus, r.started_at, r.ready_at, r.drain_from, released)
