"""How a replay is judged: per interval and in total.

Requests are charged to the interval they *arrived* in, so a burst that queues for a
minute counts against the minute it came in, not the one it left in. A request meets
the SLA when its TTFT is within `ttft_ms` and its ITL (its mean gap between output
tokens, the TPOT an SLA promises) within `itl_ms`; a one-token answer has no ITL and
is judged on TTFT alone. An interval is within SLA when its p90 TTFT and p90 ITL are
(the per-interval definition); intervals without requests are not counted either way.
Requests the server rejected (longer than the model's context) are reported apart and
left out of both shares; lost requests count as missing the SLA.

GPU-hours count every replica holding GPUs, starting and draining ones included, from
the decision that started it to the moment it released them, over the whole run (the
trace plus the tail that serves its last requests).

A reversal is a scaling action in the opposite direction of the
previous one, within `reversal_window_s` (10 minutes) of it.

Lost requests ("failed or dropped by a scaling action") are those the run
never answered: the replay's pool drains a removed replica instead of dropping its
requests and cancels only starting replicas (which hold none), so a request is lost
only when the policy leaves it waiting with no replica until the run gives up.

Scale-down lag (the time from the last request of a burst to the minimum pool): a
burst ends at an arrival followed by `burst_gap_s` (2 minutes) without one
(the trace's last arrival is not one: the run ends when it is served). Its lag is the
time from that arrival until the GPUs held (starting and draining replicas included)
first fall to the fewest the run ever held; when they do not before the next arrival,
the gap's length (a lower bound). The summary reports the mean over bursts, NaN for a
trace without quiet gaps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from epp.planner.core.types import Stats
from epp.planner.offline.pool import State
from epp.planner.offline.replay import Run, Served

REVERSAL_WINDOW_S = 600.0
WORST_WINDOW_S = 300.0
BURST_GAP_S = 120.0


@dataclass(frozen=True, slots=True)
class Sla:
    ttft_ms: float
    itl_ms: float

    def __post_init__(self) -> None:
        for name, v in (("ttft_ms", self.ttft_ms), ("itl_ms", self.itl_ms)):
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"SLA {name} must be a positive number of ms, got {v}")

    def met(self, s: Served) -> bool:
        return s.ttft_ms <= self.ttft_ms and (math.isnan(s.itl_ms) or s.itl_ms <= self.itl_ms)

    def within(self, ttft: Stats, itl: Stats) -> bool:
        """An interval's verdict: p90 TTFT and p90 ITL within (no ITL samples: TTFT only)."""
        return ttft.p90 <= self.ttft_ms and (itl.empty or itl.p90 <= self.itl_ms)


@dataclass(frozen=True, slots=True)
class IntervalRow:
    start: float
    end: float
    ready: int  # at the interval's end
    starting: int
    draining: int
    gpus: float  # mean GPUs held over the interval
    requests: int  # arrived in the interval and served
    ttft_ms: Stats
    itl_ms: Stats
    met: float  # share of those requests meeting both SLAs; NaN without requests
    within: bool | None  # p90s within the SLA; None without requests


@dataclass(frozen=True)
class Summary:
    policy: str
    rows: tuple[IntervalRow, ...]
    gpu_hours: float
    sla_intervals: float  # share of intervals (with requests) within SLA, 0..1
    sla_requests: float  # share of requests meeting both SLAs, 0..1
    actions: int
    reversals: int
    lost: int
    rejected: int
    requests: int
    worst_window: float  # lowest request attainment over any 5-minute window
    worst_window_start: float
    peak_gpus: int
    over_budget: int = 0  # intervals whose most GPUs held at once exceeded the budget
    bursts: int = 0  # quiet gaps of `burst_gap_s` or more after an arrival
    to_min_pool_s: float = math.nan  # mean scale-down lag over those bursts (module doc)
    startup_bound: int = 0  # decisions that said the SLA was missed while replicas started

    def as_json(self) -> dict[str, object]:
        """The `--json` record: the per-interval keys first, then the rest of the verdict."""
        return {
            "name": self.policy,
            "gpu_hours": round(self.gpu_hours, 4),
            "sla_intervals": round(self.sla_intervals, 4),
            "sla_requests": round(self.sla_requests, 4),
            "actions": self.actions,
            "reversals": self.reversals,
            "lost": self.lost,
            "rejected": self.rejected,
            "requests": self.requests,
            "worst_5min_requests": round(self.worst_window, 4),
            "peak_gpus": self.peak_gpus,
            "intervals_over_budget": self.over_budget,
            "bursts": self.bursts,
            "to_min_pool_s": (
                None if math.isnan(self.to_min_pool_s) else round(self.to_min_pool_s, 1)
            ),
            "startup_bound_decisions": self.startup_bound,
        }


def summarize(
    run: Run,
    sla: Sla,
    interval_s: float,
    *,
    reversal_window_s: float = REVERSAL_WINDOW_S,
    worst_window_s: float = WORST_WINDOW_S,
    budget_gpus: int | None = None,
    burst_gap_s: float = BURST_GAP_S,
) -> Summary:
    """`budget_gpus`: the GPU budget the policy was given, to count the intervals in
    which the replicas holding GPUs (starting and draining ones too) exceeded it."""
    if not interval_s > 0:
        raise ValueError("interval_s must be positive")
    count = max(1, math.ceil((run.last_arrival + 1e-9) / interval_s))
    buckets: list[list[Served]] = [[] for _ in range(count)]
    for s in run.served:
        buckets[min(count - 1, int(s.arrival // interval_s))].append(s)
    rows = tuple(
        _row(run, sla, k * interval_s, (k + 1) * interval_s, b) for k, b in enumerate(buckets)
    )
    judged = [r for r in rows if r.within is not None]
    met = sum(1 for s in run.served if sla.met(s))
    total = len(run.served) + run.lost
    worst, worst_at = _worst_window(buckets, sla, interval_s, worst_window_s)
    lags = scale_down_lags(run, burst_gap_s)
    return Summary(
        policy=run.policy,
        rows=rows,
        gpu_hours=sum(lt.gpu_seconds(0.0, run.end) for lt in run.lifetimes) / 3600.0,
        sla_intervals=sum(1 for r in judged if r.within) / len(judged) if judged else 1.0,
        sla_requests=met / total if total else 1.0,
        actions=len(run.actions),
        reversals=reversals(run, reversal_window_s),
        lost=run.lost,
        rejected=len(run.rejected),
        requests=len(run.served),
        worst_window=worst,
        worst_window_start=worst_at,
        peak_gpus=_peak_gpus(run),
        over_budget=(
            0
            if budget_gpus is None
            else sum(1 for r in rows if _peak_gpus(run, r.start, r.end) > budget_gpus)
        ),
        bursts=len(lags),
        to_min_pool_s=math.fsum(lags) / len(lags) if lags else math.nan,
        startup_bound=sum(1 for d in run.decisions if d.diagnostics.get("startup_bound")),
    )


def reversals(run: Run, window_s: float = REVERSAL_WINDOW_S) -> int:
    """Actions whose direction is opposite to the previous action's, within `window_s`."""
    count = 0
    prev_dir, prev_at = 0, -math.inf
    for a in run.actions:
        d = 1 if a.after > a.before else -1
        if prev_dir and d != prev_dir and a.at - prev_at <= window_s:
            count += 1
        prev_dir, prev_at = d, a.at
    return count


def gpus_held(run: Run) -> list[tuple[float, int]]:
    """The GPUs held as a step function: (time, GPUs held from then on), one point per
    instant at which replicas started or released GPUs, in time order."""
    deltas: dict[float, int] = {}
    for lt in run.lifetimes:
        if lt.released_at <= lt.started_at:
            continue  # cancelled the instant it started: never held anything
        deltas[lt.started_at] = deltas.get(lt.started_at, 0) + lt.gpus
        deltas[lt.released_at] = deltas.get(lt.released_at, 0) - lt.gpus
    held, out = 0, []
    for t in sorted(deltas):
        held += deltas[t]
        out.append((t, held))
    return out


def scale_down_lags(run: Run, gap_s: float = BURST_GAP_S) -> list[float]:
    """Per burst end, seconds until the GPUs held first reach the run's fewest (the
    gap's length when they do not before the next arrival; see the module doc)."""
    steps = [(t, g) for t, g in gpus_held(run) if t < run.end]
    if not steps:
        return []
    floor = min(g for _, g in steps)
    times = sorted(s.arrival for s in run.served)
    lags = []
    for end, nxt in itertools.pairwise(times):
        if nxt - end < gap_s:
            continue
        held = next((g for t, g in reversed(steps) if t <= end), steps[0][1])
        if held == floor:
            lags.append(0.0)
            continue
        reached = next((t for t, g in steps if end < t < nxt and g == floor), nxt)
        lags.append(reached - end)
    return lags


def _row(run: Run, sla: Sla, start: float, end: float, served: list[Served]) -> IntervalRow:
    at = math.nextafter(end, -math.inf)
    states = [lt.state_at(at) for lt in run.lifetimes]
    ttft = Stats.of([s.ttft_ms for s in served])
    itl = Stats.of([s.itl_ms for s in served if not math.isnan(s.itl_ms)])
    return IntervalRow(
        start=start,
        end=end,
        ready=states.count(State.READY),
        starting=states.count(State.STARTING),
        draining=states.count(State.DRAINING),
        gpus=sum(lt.gpu_seconds(start, end) for lt in run.lifetimes) / (end - start),
        requests=len(served),
        ttft_ms=ttft,
        itl_ms=itl,
        met=sum(1 for s in served if sla.met(s)) / len(served) if served else math.nan,
        within=sla.within(ttft, itl) if served else None,
    )


def _worst_window(
    buckets: Sequence[list[Served]], sla: Sla, interval_s: float, window_s: float
) -> tuple[float, float]:
    """The lowest share of requests meeting the SLA over windows of `window_s` (whole
    intervals, sliding one interval at a time; the whole run if it is shorter)."""
    width = max(1, min(len(buckets), round(window_s / interval_s)))
    worst, worst_at = 1.0, 0.0
    for k in range(len(buckets) - width + 1):
        window = [s for b in buckets[k : k + width] for s in b]
        if not window:
            continue
        share = sum(1 for s in window if sla.met(s)) / len(window)
        if share < worst:
            worst, worst_at = share, k * interval_s
    return worst, worst_at


def _peak_gpus(run: Run, start: float = -math.inf, end: float = math.inf) -> int:
    """Most GPUs held at once within [start, end) (starting and draining included)."""
    held_any = [
        lt
        for lt in run.lifetimes
        if lt.released_at > lt.started_at and lt.started_at < end and lt.released_at > start
    ]
    events = sorted(
        [(max(lt.started_at, start), lt.gpus) for lt in held_any]
        + [(lt.released_at, -lt.gpus) for lt in held_any],
        key=lambda e: (e[0], e[1]),  # a release before a start at the same instant
    )
    held = peak = 0
    for _, g in events:
        held += g
        peak = max(peak, held)
    return peak
