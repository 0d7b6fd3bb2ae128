"""`oracle`: perfect foresight and instant start, the floor GPU-hours are reported against.

Not deployable, and not meant to be: it knows each interval's arrivals before they come,
and its replicas serve the moment it asks for them. What it answers is "how few GPUs
could this trace have been served with, interval by interval, at this SLA?", so a
policy's GPU-hours can be read as a multiple of the floor (issue 15 items 1 and 3).

Per report interval `k` (`[k·I, (k+1)·I)`), `sizes[k]` is the fewest replicas whose p90
TTFT and p90 ITL meet the SLA on the interval's own requests, measured by replaying that
interval on a static pool of that size with the interval before it as warm-up
(`static.Sizer.measure`, the exact replay static-peak is sized by). An interval with no
request gets `min_replicas` (1, the floor every other policy keeps; 0 gives the
scale-to-zero floor). The search starts from the previous interval's size (neighbouring
intervals rarely differ much), gallops away from it, then bisects; latency falls with
replicas, so the smallest passing size is found.

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

from collections.abc import Sequence

from epp.planner.outcome import Sla
from epp.planner.replay import Arrival
from epp.planner.static import MAX_REPLICAS, Segment, Sizer, counts_per_interval
from epp.planner.types import Decision, Observation, Role

NAME = "oracle"


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
    min_replicas: int = 1,
    max_replicas: int = MAX_REPLICAS,
) -> list[int]:
    """The fewest replicas meeting `sla` in each interval of the trace (see the module
    doc); `max_replicas` where none up to it does."""
    counts = counts_per_interval(arrivals, interval_s)
    sizes: list[int] = []
    hint = 1
    for k, count in enumerate(counts):
        if count == 0:
            sizes.append(min_replicas)
            continue
        seg = Segment(k * interval_s, (k + 1) * interval_s, count, "oracle")
        n = max(min_replicas, _smallest_near(sizer, sla, seg, hint, max_replicas))
        sizes.append(n)
        hint = n
    return sizes


def _smallest_near(sizer: Sizer, sla: Sla, seg: Segment, hint: int, max_replicas: int) -> int:
    def ok(n: int) -> bool:
        ttft, itl = sizer.measure(seg, n)
        return ttft.empty or sla.within(ttft, itl)

    hint = min(max(1, hint), max_replicas)
    if ok(hint):
        hi, step = hint, 1  # passes: gallop down to a failing size (or 0)
        lo = hint - step
        while lo >= 1 and ok(lo):
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(0, lo)
    else:
        lo, step = hint, 1  # fails: gallop up to a passing size
        hi = hint + step
        while True:
            if hi >= max_replicas:
                if not ok(max_replicas):
                    return max_replicas
                hi = max_replicas
                break
            if ok(hi):
                break
            lo, step = hi, step * 2
            hi = lo + step
    while hi - lo > 1:  # lo fails (or is 0), hi passes
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
