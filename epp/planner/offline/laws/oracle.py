"""`oracle`: perfect foresight and instant start, the floor GPU-hours are reported against.

Not deployable, and not meant to be: it knows each interval's arrivals before they come,
and its replicas serve the moment it asks for them. What it answers is "how few GPUs
could this trace have been served with, interval by interval, at this SLA?", so a
policy's GPU-hours can be read as a multiple of the floor.

Per report interval `k` (`[k·I, (k+1)·I)`), `sizes[k]` is the fewest replicas that serve
the interval's own requests at the bar the comparison judges, measured by replaying that
interval on a static pool of that size with the interval before it as warm-up
(`static.Sizer.measure`, the exact replay static-peak is sized by). The bar
(`--oracle-target`, `target` below):

- a share of requests, default `DEFAULT_TARGET` (0.99, the request target):
  at least that share of the interval's requests meet both SLAs, each request judged
  as `outcome` judges it (its TTFT and its ITL within; an unanswered one misses);
- `run:SHARE` (`run:0.99`): the bar itself, on the run rather than on each
  interval: at least SHARE of all requests and `WINDOW_SHARE` (95 %) of every 5-minute
  window's within both SLAs. Meeting it in every interval is sufficient, not necessary:
  an interval whose last replica saves few misses can give them up for another's. So
  the per-interval sizes are the start, and the misses are then spread (`spread_misses`):
  one replica fewer at a time where it costs the fewest extra misses (each step saves
  one replica for one interval), while the run's and every window's allowance hold. With
  each interval's misses convex in its replicas (each replica removed costs more than
  the last) the greedy order is optimal for these replays; one sizing replay per step.
- `p90` (`P90`): the interval's p90 TTFT and p90 ITL within the SLA (the per-interval
  verdict; the oracle of the earlier comparisons, kept so their tables can be
  reproduced). It answers a weaker question: on Azure x3 it kept 95.1 % of requests.

At a target of 0.9 or more the request bar implies the p90 bar whenever a share of at
least `10·(1 − target)` of the interval's requests have an ITL (10 % at 0.99): the p90s are
nearest-rank, so the p90 TTFT is within once 90 % of TTFTs are, and the requests
missing the bar are at most `(1 − target)` of all, so at most 10 % of those with an
ITL. With latency falling with replicas, each interval's request size is then at least
its p90 size (`tests/unit/test_planner_laws.py` checks it on a small trace).

An interval with no request gets `min_replicas` (1, the floor every other policy keeps;
0 gives the scale-to-zero floor). The search takes the sizes already measured on the
interval (static sizing measures the busiest ones) as a bracket when they give one,
else starts from the previous interval's size (neighbouring intervals rarely differ
much), gallops away from it, then bisects; latency falls with replicas, so the smallest
passing size is found. Each measurement replays two intervals: at least two per
interval (the size and one below it), which at ~50 replicas is most of the oracle's cost.

Replayed, the policy sets `sizes[k]` at the start of interval `k` (the replay calls it
at `k·I`, before that interval's first arrival), the run begins with `sizes[0]` ready
(`initial_replicas`), and `compare` runs it with a start-up delay of 0 (`instant_start`).
A replica it removes still drains its requests (and holds its GPUs while it does), as in
every run. After the trace it asks for `min_replicas`.

Caveat: the size is measured with a warm-up at the same size; in the run the pool
arrives from the previous interval's size (a backlog, colder prefix caches), so the
oracle's own run may miss the SLA in an interval where the sizing replay met it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epp.planner.core.types import Decision, Observation, Role
from epp.planner.offline.outcome import Sla
from epp.planner.offline.replay import Arrival
from epp.planner.offline.static import MAX_REPLICAS, Segment, Sizer, counts_per_interval

NAME = "oracle"
P90 = "p90"  # the interval's p90s within the SLA: the earlier comparisons' oracle
INTERVAL, RUN = "interval", "run"
WINDOW_S, WINDOW_SHARE = 300.0, 0.95  # the judge: >= 95 % in every 5-minute window


@dataclass(frozen=True, slots=True)
class OracleTarget:
    """The oracle's bar (module doc): `rule` "interval", "run" or "p90"; `share` of
    requests within both SLAs (not read for p90)."""

    rule: str
    share: float = 0.99

    def __str__(self) -> str:
        """As `--oracle-target` takes it (and the JSON records it)."""
        if self.rule == P90:
            return P90
        return f"{self.share:g}" if self.rule == INTERVAL else f"{RUN}:{self.share:g}"


DEFAULT_TARGET = OracleTarget(INTERVAL, 0.99)  # the judge: >= 99 % of requests
P90_TARGET = OracleTarget(P90)


def parse_target(text: str) -> OracleTarget:
    """`--oracle-target`: a share of each interval's requests in (0, 1] (`0.99`),
    `run:SHARE` (of the run's, `run:0.99`) or `p90`; a ValueError naming the flag and
    what it takes otherwise."""
    word = text.strip().lower()
    if word == P90:
        return P90_TARGET
    rule, _, number = word.rpartition(":")
    try:
        v = float(number)
    except ValueError:
        v = math.nan
    if rule not in ("", RUN) or not 0 < v <= 1:
        raise ValueError(
            f"--oracle-target {text!r}: expected a share of requests in (0, 1], like 0.99 "
            "(each interval's), run:0.99 (the run's) or p90 (each interval's p90s)"
        )
    return OracleTarget(RUN if rule else INTERVAL, v)


class Oracle:
    """Replays precomputed per-interval sizes (a `types.Policy`)."""

    name = NAME
    instant_start = True  # compare.py replays it with startup_s = 0
    sample_interval_s = 1.0

    def __init__(self, sizes: Sequence[int], interval_s: float, *, min_replicas: int = 1) -> None:
        if not sizes or min(sizes) < 0:
            raise ValueError("oracle needs one non-negative size per interval")
        if not interval_s > 0:
            raise ValueError("oracle interval_s must be positive")
        self.sizes = tuple(sizes)
        self.interval_s = interval_s
        self.min_replicas = min_replicas

    @property
    def initial_replicas(self) -> int:
        return self.sizes[0]

    def step(self, now: float, obs: Observation) -> Decision:
        k = round(now / self.interval_s)
        if k < len(self.sizes):
            n, why = self.sizes[k], f"interval {k} needs {self.sizes[k]} (foresight)"
        else:
            n, why = self.min_replicas, "after the trace: the floor"
        return Decision(at=now, targets={Role.AGGREGATED: n}, reason=why)


def oracle_sizes(
    sizer: Sizer,
    sla: Sla,
    arrivals: Sequence[Arrival],
    interval_s: float,
    *,
    target: OracleTarget = DEFAULT_TARGET,
    min_replicas: int = 1,
    max_replicas: int = MAX_REPLICAS,
    progress: Callable[[float, float], None] | None = None,
) -> list[int]:
    """The fewest replicas meeting `sla` at `target` in each interval of the trace (see
    the module doc); `max_replicas` where none up to it does. `progress(end of the
    interval sized, end of the last)`: sizing replays every interval several times."""
    counts = counts_per_interval(arrivals, interval_s)
    segs = [
        Segment(k * interval_s, (k + 1) * interval_s, c, "oracle") for k, c in enumerate(counts)
    ]
    sizes: list[int] = []
    hint = 1
    for seg in segs:
        if seg.arrivals == 0:
            sizes.append(min_replicas)
            continue
        ok = meets_target(sizer, sla, seg, target)
        n = smallest_passing(ok, hint, max_replicas, known=sizer.measured_sizes(seg))
        sizes.append(max(min_replicas, n))
        hint = n
        if progress is not None:
            progress(seg.end, segs[-1].end)
    if target.rule == RUN:
        return spread_misses(sizer, sla, segs, sizes, target.share, interval_s, min_replicas)
    return sizes


def meets_target(
    sizer: Sizer, sla: Sla, seg: Segment, target: OracleTarget
) -> Callable[[int], bool]:
    """Whether `n` replicas serve the segment at the bar (its sizing replay); a run
    bar starts from its share in every interval."""
    if target.rule == P90:

        def p90_ok(n: int) -> bool:
            ttft, itl = sizer.measure(seg, n)
            return ttft.empty or sla.within(ttft, itl)

        return p90_ok
    return lambda n: sizer.share_met(seg, n, sla) >= target.share


def spread_misses(
    sizer: Sizer,
    sla: Sla,
    segs: Sequence[Segment],
    sizes: Sequence[int],
    share: float,
    interval_s: float,
    min_replicas: int = 1,
) -> list[int]:
    """From sizes meeting `share` in every interval, one replica fewer at a time where
    it adds the fewest misses, while >= `share` of all requests and >= `WINDOW_SHARE` of
    every `WINDOW_S` window's (whole intervals, sliding by one, as `outcome` judges the
    worst window) stay within both SLAs (module doc)."""
    out = list(sizes)
    missed, judged = [0] * len(segs), [0] * len(segs)
    for k, seg in enumerate(segs):
        if seg.arrivals:
            missed[k], judged[k] = sizer.misses(seg, out[k], sla)
    width = max(1, min(len(segs), round(WINDOW_S / interval_s)))
    starts = range(len(segs) - width + 1)
    room = [math.floor((1 - WINDOW_SHARE) * sum(judged[j : j + width])) - sum(missed[j : j + width])
            for j in starts]  # fmt: skip
    total_room = math.floor((1 - share) * sum(judged)) - sum(missed)
    floor = max(1, min_replicas)

    def step(k: int) -> tuple[int, int] | None:  # (extra misses one replica fewer, k)
        if not segs[k].arrivals or out[k] <= floor:
            return None
        return sizer.misses(segs[k], out[k] - 1, sla)[0] - missed[k], k

    heap = [c for k in range(len(segs)) if (c := step(k)) is not None]
    heapq.heapify(heap)
    while heap:
        extra, k = heapq.heappop(heap)
        if extra > total_room:
            break  # the cheapest step left does not fit: no dearer one does
        windows = range(max(0, k - width + 1), min(k, len(starts) - 1) + 1)
        if any(extra > room[j] for j in windows):
            continue  # this interval's window is spent; others may still give
        out[k] -= 1
        missed[k] += extra
        total_room -= extra
        for j in windows:
            room[j] -= extra
        if (c := step(k)) is not None:
            heapq.heappush(heap, c)
    return out


def smallest_passing(
    ok: Callable[[int], bool], hint: int, max_replicas: int, *, known: Sequence[int] = ()
) -> int:
    """The smallest `n` in [1, max_replicas] that is `ok`, `ok` rising with `n`
    (`max_replicas` when none is). `known`: sizes whose verdict costs nothing (measured
    already): the largest failing and the smallest passing above it bracket the answer;
    else the search gallops from `hint`."""
    lo = max([0, *(n for n in known if not ok(n))])  # fails (0: below every size)
    passing = [n for n in known if n > lo and ok(n)]
    if passing:
        hi = passing[0]
    else:
        start = min(max(lo + 1, hint), max_replicas)
        if ok(start):  # gallop down to a failing size (or lo)
            hi, step = start, 1
            while hi - step > lo and ok(hi - step):
                hi, step = hi - step, step * 2
            lo = max(lo, hi - step)
        else:  # gallop up to a passing size
            lo, step = start, 1
            while True:
                if lo >= max_replicas:
                    return max_replicas  # none passes
                hi = min(max_replicas, lo + step)
                if ok(hi):
                    break
                lo, step = hi, step * 2
    while hi - lo > 1:  # lo fails (or is 0), hi passes
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
