"""`epp plan replay --compare`: one trace through every policy, on equal terms.

Every policy sees the same arrivals, the same simulated servers, the same routing, the
same start-up delay and the same SLA, and is judged by `outcome.summarize` on the same
report intervals. What differs is only the scaling law:

- `static-peak` is the fewest replicas that keep >= 99 % of the trace's requests within
  the SLA over the whole trace (`static_peak`: from the busiest intervals' size, down
  while it holds, up until it does): the "don't autoscale" baseline an operator would
  size. `static-mean` holds the pool sized for an average interval (`static.py`).
- The planners (`load`, `dynamo`, `epp`, from `planner.build_policy`) and the field's
  laws (`keda-queue`, `llm-d-slo`, `laws/`) start from the static-mean pool, ready, as
  an operator would deploy before turning an autoscaler on.
- `oracle` (`laws/oracle.py`) is the exception: it starts with its first interval's
  size and its replicas start at once (start-up 0): the floor, not a deployable policy.

Pure: the caller builds the policies (`factories`) and does the printing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from epp.planner.core.types import Policy
from epp.planner.offline.laws.oracle import Oracle
from epp.planner.offline.outcome import Sla, Summary, summarize
from epp.planner.offline.pool import PoolShape, Spares
from epp.planner.offline.replay import Arrival, MissLimit, Progress, Run, replay
from epp.planner.offline.sla_pick import request_sla
from epp.planner.offline.static import (
    Sizer,
    Sizing,
    StaticPolicy,
    mean_segment,
    peak_segments,
    smallest_ok,
)

PEAK_BUMPS = 3
PEAK_SHARE = 0.99  # static-peak keeps this share of the trace's requests within the SLA
PEAK_GROWTH = 2  # static-peak's search goes no higher than this many times its start
ORDER = ("static-peak", "static-mean", "oracle", "keda-queue", "llm-d-slo", "load", "dynamo", "epp")
STATIC = ("static-peak", "static-mean")

# name -> a policy to replay (built fresh: policies keep state between steps)
PolicyFactory = Callable[[], Policy]


@dataclass(frozen=True)
class Setup:
    """What every policy of a comparison shares."""

    shape: PoolShape
    sla: Sla
    sla_picked: bool  # True: chosen from the trace (`Sizer.default_sla`)
    interval_s: float
    peak: Sizing  # sized on the busiest intervals
    mean: Sizing
    budget_gpus: int | None = None  # the planners' GPU budget (None: unbounded)
    median_isl: int = 1  # of the trace: what a profile of the server should target
    median_osl: int = 1
    # how the SLA was set: "given", "intervals" (`Sizer.default_sla`: p90s in every
    # interval) or "requests" (`sla_pick.request_sla` on static-peak's run)
    sla_rule: str = "intervals"
    # static-peak's size when known (`--static-peak`, e.g. from an earlier run of the same
    # trace and SLA): replayed once instead of searched
    peak_known: int | None = None


@dataclass(frozen=True)
class Result:
    summary: Summary
    run: Run
    initial: int  # replicas the run started with
    note: str = ""


def summary_only(result: Result) -> Result:
    """`result` without its per-request and per-decision records: a comparison's table,
    JSON, plots and sweep points read the summary, and a day's replay holds millions of
    records."""
    run = dataclasses.replace(
        result.run, served=(), rejected=(), actions=(), decisions=(), lifetimes=()
    )
    return dataclasses.replace(result, run=run)


def prepare(
    arrivals: Sequence[Arrival],
    shape: PoolShape,
    interval_s: float,
    sla: Sla | None = None,
    *,
    sizer: Sizer | None = None,
) -> Setup:
    """Size the static pools (and pick an SLA if none is given). Raises
    `static.NoPoolMeetsSla` when no pool meets the SLA at the peak."""
    sizer = sizer or Sizer(arrivals, shape)
    picked = sla is None
    if sla is None:
        sla = sizer.default_sla(interval_s)
    peak = sizer.smallest_for_all(sla, peak_segments(arrivals, interval_s))
    mean = sizer.smallest_pool(sla, mean_segment(arrivals, interval_s))
    isl = sorted(a.isl for a in arrivals)[len(arrivals) // 2]
    osl = sorted(a.osl for a in arrivals)[len(arrivals) // 2]
    return Setup(
        shape, sla, picked, interval_s, peak, mean, median_isl=isl, median_osl=osl,
        sla_rule="intervals" if picked else "given",
    )  # fmt: skip


def pick_request_sla(
    arrivals: Sequence[Arrival],
    setup: Setup,
    *,
    seed: int = 0,
    spares: Spares | None = None,
    progress: Progress | None = None,
) -> tuple[Setup, Result]:
    """Replay static-peak (sized on the interval pick) and set the SLA to the tightest
    one it meets per request (`sla_pick.request_sla`): the setup every policy is then
    judged on, and static-peak's result judged on it (to reuse, not replay again)."""
    peak = static_peak(arrivals, setup, seed=seed, spares=spares, progress=progress)
    sla = request_sla(peak.run.served, setup.sla, setup.interval_s, lost=peak.run.lost)
    setup = dataclasses.replace(setup, sla=sla, sla_rule="requests")
    summary = summarize(peak.run, sla, setup.interval_s, budget_gpus=setup.budget_gpus)
    return setup, Result(summary, peak.run, peak.initial, peak.note)


def run_policy(
    arrivals: Sequence[Arrival],
    policy: Policy,
    setup: Setup,
    initial: int,
    *,
    seed: int = 0,
    spares: Spares | None = None,
    progress: Progress | None = None,
    note: str = "",
    miss_limit: MissLimit | None = None,
) -> Result:
    run = replay(
        arrivals,
        policy,
        setup.shape,
        initial=initial,
        seed=seed,
        spares=spares,
        progress=progress,
        miss_limit=miss_limit,
    )
    summary = summarize(run, setup.sla, setup.interval_s, budget_gpus=setup.budget_gpus)
    return Result(summary, run, initial, note)


def static_peak(
    arrivals: Sequence[Arrival],
    setup: Setup,
    *,
    seed: int = 0,
    spares: Spares | None = None,
    progress: Progress | None = None,
) -> Result:
    """The honest "don't autoscale" pool: the fewest replicas that keep at least
    `PEAK_SHARE` (99 %) of the trace's requests within the SLA, found by replaying the
    whole trace. The search starts at the busiest intervals' size, walks down while
    the share holds (galloping, then bisecting) or up until it holds (at most
    `PEAK_GROWTH` times the start); the share rises with the pool, so the first size
    found is the fewest. A size that has missed more requests than the share allows
    stops there (`MissLimit`): it cannot keep the share, and the search needs no more."""
    start = setup.peak.replicas
    runs: dict[int, Result] = {}
    if setup.peak_known is not None:
        n = setup.peak_known
        policy = StaticPolicy("static-peak", n, setup.interval_s)
        res = run_policy(arrivals, policy, setup, n, seed=seed, spares=spares, progress=progress)
        return Result(res.summary, res.run, n, f"{n} given (--static-peak), not searched")
    limit = MissLimit(setup.sla.met, math.floor((1 - PEAK_SHARE) * len(arrivals) + 1e-9))

    def at(n: int, cut: MissLimit | None = limit) -> Result:
        if n not in runs or (cut is None and runs[n].run.stopped):
            policy = StaticPolicy("static-peak", n, setup.interval_s)
            runs[n] = run_policy(
                arrivals, policy, setup, n, seed=seed, spares=spares, progress=progress,
                miss_limit=cut,
            )  # fmt: skip
        return runs[n]

    def ok(n: int) -> bool:
        res = at(n)
        return not res.run.stopped and res.summary.sla_requests >= PEAK_SHARE

    top = max(start + PEAK_BUMPS, PEAK_GROWTH * start)
    if ok(start):
        hi, step = start, 1
        while hi - step >= 1 and ok(hi - step):
            hi -= step
            step *= 2
        n = smallest_ok(max(0, hi - step), hi, ok)  # hi - step misses (or is 0)
    else:
        n = start
        while not ok(n) and n < top:
            n = min(top, n + max(1, n // 4))
        # the fewest that meets, between the last miss and n
        n = smallest_ok(max(m for m in runs if not ok(m)), n, ok)
    res = at(n, cut=None)  # the size reported is replayed whole
    how = f"{start} from the busiest intervals"
    if n != start:
        how += f", {n - start:+d} for {PEAK_SHARE:.0%} of the trace's requests"
    if res.summary.sla_requests < PEAK_SHARE:
        how += f" (at {n}, the most tried, {res.summary.sla_requests:.1%})"
    stopped = sorted(m for m, r in runs.items() if r.run.stopped)
    if stopped:  # their progress lines end early: say why
        how += f"; {','.join(map(str, stopped))} stopped once past {1 - PEAK_SHARE:.0%} misses"
    return Result(res.summary, res.run, n, how)


def run_factory(
    arrivals: Sequence[Arrival],
    name: str,
    factory: PolicyFactory,
    setup: Setup,
    *,
    seed: int = 0,
    spares: Spares | None = None,
    progress: Progress | None = None,
) -> Result:
    """A built policy from the static-mean pool; the oracle from its own first size,
    with instant start."""
    policy = factory()
    n = setup.mean.replicas
    if isinstance(policy, Oracle):
        instant = dataclasses.replace(setup.shape, startup_s=0.0)
        return run_policy(
            arrivals,
            policy,
            dataclasses.replace(setup, shape=instant),
            policy.initial_replicas,
            seed=seed,
            spares=spares,
            progress=progress,
            note=f"foresight, instant start, {min(policy.sizes)}..{max(policy.sizes)}",
        )
    return run_policy(
        arrivals, policy, setup, n, seed=seed, spares=spares, progress=progress,
        note=f"starts at {n}",
    )  # fmt: skip


# runs a comparison's replays and returns their results in order: in this process one
# after another (`sequential`), or each in its own process (the CLI's `parallel.run_all`)
Job = Callable[[], Result]
Runner = Callable[[Sequence[tuple[str, Job]]], list[Result]]


def sequential(jobs: Sequence[tuple[str, Job]]) -> list[Result]:
    return [job() for _, job in jobs]


def compare(
    arrivals: Sequence[Arrival],
    setup: Setup,
    factories: Mapping[str, PolicyFactory],
    *,
    seed: int = 0,
    spares: Spares | None = None,
    progress: Callable[[str], Progress] | None = None,
    statics: Sequence[str] = STATIC,
    reuse: Mapping[str, Result] | None = None,
    runner: Runner = sequential,
) -> list[Result]:
    """The `statics` asked for (both by default), then each factory's policy, in
    `ORDER`. `reuse`: results to take as they are instead of replaying (in a start-up
    sweep, the static pools, which start ready and never scale, and the oracle, which
    starts instantly: the delay cannot change them). Every replay is independent of the
    others, so `runner` may run them side by side."""
    spares = spares or Spares()
    reuse = reuse or {}

    def hook(name: str) -> Progress | None:
        return progress(name) if progress else None

    n = setup.mean.replicas
    names: list[str] = [s for s in STATIC if s in statics]
    names += sorted(factories, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))

    def job(name: str) -> Job:
        if name == "static-peak":
            return lambda: static_peak(
                arrivals, setup, seed=seed, spares=spares, progress=hook(name)
            )
        if name == "static-mean":
            mean = StaticPolicy("static-mean", n, setup.interval_s)
            return lambda: run_policy(
                arrivals, mean, setup, n, seed=seed, spares=spares, progress=hook(name),
                note=f"{n} from an average interval",
            )  # fmt: skip
        return lambda: run_factory(
            arrivals, name, factories[name], setup, seed=seed, spares=spares,
            progress=hook(name),
        )  # fmt: skip

    jobs = [(name, job(name)) for name in names if name not in reuse]
    done = dict(zip([name for name, _ in jobs], runner(jobs), strict=True))
    return [reuse[name] if name in reuse else done[name] for name in names]
