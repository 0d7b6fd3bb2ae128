"""The static baselines of `epp plan replay --compare`, and how big they are.

A static pool never changes; what matters is its size, which the replay measures on the
trace itself ("static at peak", "static at mean"):

- `static-peak`: the fewest replicas whose p90 TTFT and p90 ITL meet the SLA in each
  of the trace's busiest intervals (the 3 with the most arrivals and the 3 with the
  most tokens), each replayed with the interval before it as warm-up so the pool is
  not empty when it begins. (One busiest interval is not enough: on the Azure trace
  the pool sized for it misses the ITL SLA, by 3 %, in the third busiest.)
- `static-mean`: the same search on the interval whose arrival count is nearest the
  trace's mean per interval (empty intervals included, so a bursty trace's mean is
  low): the pool an operator sizing for average traffic would deploy.

The search replays only those intervals: it starts a quarter of the way to a lightly
loaded pool (`light_pool`), halves while the SLA holds, doubles while it does not, then
bisects (latency falls with replicas). It costs seconds, not a full replay per size, and
avoids measuring a pool far too small (a deep queue is the expensive replay); a sizing
replay gives up two intervals after its segment, counting what is unanswered as failing.

`Sizer.default_sla` picks an SLA when the user gives none: the p90 TTFT and ITL of the
busiest interval on a pool large enough that doubling it changes them by under 5 %
(the server's floor at that traffic; the doubling starts at `light_pool`, about 8
requests in flight per replica by Little's law), times `TTFT_HEADROOM` (2: as much
queueing as service) and `ITL_HEADROOM` (1.5: steps half again as slow as an idle
pool's, as batches grow), rounded up to a round number (`nice_up`, at most 25 % more).
Tighter ITL targets leave the SLA planners nothing to size with: at 1.25x (12 ms for
the 8B preset on the Azure trace) a correction factor of 1.3 puts the corrected target
below the profile's fastest point (9 ms at one request in flight). Some pool meets it
by construction; how large is what the search finds.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from epp.planner.core.types import Decision, Observation, Role, Stats
from epp.planner.offline.outcome import Sla
from epp.planner.offline.pool import PoolShape, Spares
from epp.planner.offline.replay import Arrival, Served, replay
from epp.sim.latency import StepCostModel

STATIC_NAMES = ("static-peak", "static-mean")
TTFT_HEADROOM = 2.0
ITL_HEADROOM = 1.5
MAX_REPLICAS = 256
LIGHT_BATCH = 8  # requests in flight per replica that `light_pool` aims at
TAIL_INTERVALS = 2  # a sizing replay stops this many intervals after the segment's end
NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


class NoPoolMeetsSla(ValueError):
    """No pool of up to `MAX_REPLICAS` replicas meets the SLA at the peak."""


class StaticPolicy:
    """A fixed replica count: never scales (a `types.Policy`)."""

    def __init__(self, name: str, replicas: int, interval_s: float) -> None:
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        self.name = name
        self.replicas = replicas
        self.interval_s = interval_s
        # It reads nothing, but the replay stops on a sample tick: ticking each second as
        # the planners do keeps every policy's run (and GPU-hours) ending alike.
        self.sample_interval_s = min(interval_s, 1.0)

    def step(self, now: float, obs: Observation) -> Decision:
        return Decision(
            at=now,
            targets={Role.AGGREGATED: self.replicas},
            reason=f"{self.name}: {self.replicas} replicas, always",
        )


@dataclass(frozen=True, slots=True)
class Segment:
    """One interval of the trace to size a pool on, with its warm-up."""

    start: float
    end: float
    arrivals: int
    why: str  # "peak" or "mean"


@dataclass(frozen=True, slots=True)
class Sizing:
    replicas: int
    segment: Segment
    ttft_ms: Stats  # at that size
    itl_ms: Stats


def counts_per_interval(arrivals: Sequence[Arrival], interval_s: float) -> list[int]:
    n = max(1, math.ceil((arrivals[-1].t_s + 1e-9) / interval_s))
    counts = [0] * n
    for a in arrivals:
        counts[min(n - 1, int(a.t_s // interval_s))] += 1
    return counts


def peak_segment(arrivals: Sequence[Arrival], interval_s: float) -> Segment:
    """The interval with the most arrivals (ties: the earliest)."""
    return peak_segments(arrivals, interval_s, top=1)[0]


def peak_segments(arrivals: Sequence[Arrival], interval_s: float, top: int = 3) -> list[Segment]:
    """The `top` intervals by arrivals and the `top` by tokens (prompt + output), busiest
    first, without repeats: the peak is where the pool is busiest, by either measure."""
    counts = counts_per_interval(arrivals, interval_s)
    tokens = [0] * len(counts)
    for a in arrivals:
        tokens[min(len(counts) - 1, int(a.t_s // interval_s))] += a.isl + a.osl
    by_count = sorted(range(len(counts)), key=lambda i: (-counts[i], i))[:top]
    by_tokens = sorted(range(len(counts)), key=lambda i: (-tokens[i], i))[:top]
    chosen = list(dict.fromkeys(by_count + by_tokens))
    return [Segment(k * interval_s, (k + 1) * interval_s, counts[k], "peak") for k in chosen]


def mean_segment(arrivals: Sequence[Arrival], interval_s: float) -> Segment:
    counts = counts_per_interval(arrivals, interval_s)
    mean = sum(counts) / len(counts)
    k = min(range(len(counts)), key=lambda i: (abs(counts[i] - mean), i))
    return Segment(k * interval_s, (k + 1) * interval_s, counts[k], "mean")


class Sizer:
    """Measures static pools on segments of one trace, remembering every measurement
    (the SLA pick and both searches share them) and lending engines across replays."""

    def __init__(
        self, arrivals: Sequence[Arrival], shape: PoolShape, spares: Spares | None = None
    ) -> None:
        self.arrivals = arrivals
        self.shape = shape
        self.spares = spares or Spares()
        self._seen: dict[tuple[float, int], tuple[Stats, Stats]] = {}
        # per judged request, the same replays: (TTFTs, ITLs) in ms, an unanswered
        # request's TTFT infinite, a one-token answer's ITL NaN (`share_met`)
        self._latencies: dict[tuple[float, int], tuple[array[float], array[float]]] = {}
        # arrival times when sorted (a trace always is): a segment is found by bisection,
        # not by a pass over a day's requests per sizing replay
        times = [a.t_s for a in arrivals]
        self._times = times if all(a <= b for a, b in pairwise(times)) else None

    def measure(self, segment: Segment, replicas: int) -> tuple[Stats, Stats]:
        """p50/p90/p99 TTFT and ITL of the segment's requests on `replicas` static
        replicas (the interval before it replayed as warm-up, its requests not judged)."""
        key = (segment.start, replicas)
        if key not in self._seen:
            ttfts, itls = self._measure(segment, replicas)
            self._latencies[key] = (ttfts, itls)
            self._seen[key] = (
                Stats.of(ttfts),
                Stats.of([v for v in itls if not math.isnan(v)]),
            )
        return self._seen[key]

    def share_met(self, segment: Segment, replicas: int, sla: Sla) -> float:
        """The share of the segment's requests meeting both SLAs on `replicas` static
        replicas (`misses`); 1.0 when the segment has none."""
        missed, judged = self.misses(segment, replicas, sla)
        return 1.0 - missed / judged if judged else 1.0

    def misses(self, segment: Segment, replicas: int, sla: Sla) -> tuple[int, int]:
        """(requests missing either SLA, requests judged) of the segment on `replicas`
        static replicas: the replay `measure` makes, each request judged as `outcome`
        judges it (an unanswered one a miss)."""
        self.measure(segment, replicas)
        ttfts, itls = self._latencies[(segment.start, replicas)]
        met = sum(
            1
            for t, i in zip(ttfts, itls, strict=True)
            if t <= sla.ttft_ms and (math.isnan(i) or i <= sla.itl_ms)
        )
        return len(ttfts) - met, len(ttfts)

    def measured_sizes(self, segment: Segment) -> list[int]:
        """The pool sizes measured on the segment so far, ascending (a search can
        bracket its answer with them at no cost)."""
        return sorted(n for start, n in self._seen if start == segment.start)

    def _measure(self, segment: Segment, replicas: int) -> tuple[array[float], array[float]]:
        warm = segment.start - (segment.end - segment.start)
        times = self._times
        if times is not None:  # sorted: the segment's requests are one slice
            part = list(self.arrivals[bisect_left(times, warm) : bisect_left(times, segment.end)])
        else:
            part = [a for a in self.arrivals if warm <= a.t_s < segment.end]
        if not part:
            return array("d"), array("d")
        t0 = part[0].t_s
        shifted = [_Shifted(a.t_s - t0, a.isl, a.osl, a.hash_ids) for a in part]
        length = segment.end - segment.start
        policy = StaticPolicy("sizing", replicas, length)
        run = replay(
            shifted, policy, self.shape, initial=replicas, spares=self.spares,
            max_tail_s=TAIL_INTERVALS * length,
        )  # fmt: skip
        judged: list[Served] = [s for s in run.served if s.arrival + t0 >= segment.start]
        # A pool too small for the segment is still serving its backlog when the replay
        # gives up: those requests count as never answered (an infinite TTFT), which
        # fails the SLA without simulating an overloaded pool's hour-long drain.
        ttfts = array("d", [s.ttft_ms for s in judged] + [math.inf] * run.lost)
        itls = array("d", [s.itl_ms for s in judged] + [math.nan] * run.lost)
        return ttfts, itls

    def smallest_for_all(self, sla: Sla, segments: Sequence[Segment]) -> Sizing:
        """The fewest replicas meeting `sla` on every segment: the largest of their
        sizes (latency falls with replicas, so that size meets each), the first segment
        to need it on a tie. Only the largest is wanted, so a segment the size found so
        far already serves costs one measurement (its own smallest is no larger) and one
        that it does not is searched from there up: at 50 replicas this is most of what
        the SLA pick saved (an ablation recorded in docs/BENCHMARKS.md@a73a134)."""
        best: Sizing | None = None
        for seg in segments:
            if best is not None and self._meets(sla, seg, best.replicas):
                continue
            best = self.smallest_pool(sla, seg, fails_at=best.replicas if best else 0)
        if best is None:
            raise ValueError("no segment to size a pool on")
        return best

    def _meets(self, sla: Sla, segment: Segment, replicas: int) -> bool:
        ttft, itl = self.measure(segment, replicas)
        return ttft.empty or sla.within(ttft, itl)

    def smallest_pool(
        self,
        sla: Sla,
        segment: Segment,
        *,
        max_replicas: int = MAX_REPLICAS,
        fails_at: int = 0,
    ) -> Sizing:
        """The fewest replicas meeting `sla` (p90 TTFT and ITL) on the segment;
        `fails_at`: a size known to miss it (the search starts above)."""

        def ok(n: int) -> bool:
            return self._meets(sla, segment, n)

        # What is measured already brackets the answer (the SLA pick's doubling measures
        # the busiest interval at light pools): the largest size known to miss, the
        # smallest known to meet. Latency falls with replicas, so any bracket gives the
        # same answer; starting from one skips the overloaded small pools, which are the
        # expensive measurements (a deep queue: 11 CPU-s at 8 replicas of Azure x20's
        # busiest minute against 3 at 16-32).
        known = self.measured_sizes(segment)
        lo = max([fails_at] + [n for n in known if not ok(n)])
        met = [n for n in known if n > lo and ok(n)]
        if met:
            hi = met[0]
            return self._bisect(segment, lo, hi, ok)
        # Else start a quarter of the way to a lightly loaded pool and walk down while it
        # holds: a pool far too small is the expensive measurement, so the search avoids
        # measuring one.
        hi = max(lo + 1, min(max_replicas, self.light_pool(segment) // 4))
        if hi > max_replicas:
            raise NoPoolMeetsSla(
                f"no pool of up to {max_replicas} replicas meets TTFT {sla.ttft_ms:g} ms / "
                f"ITL {sla.itl_ms:g} ms (p90) in the trace's {segment.why} interval: raise "
                "--ttft/--itl"
            )
        if ok(hi):
            while hi // 2 > lo and ok(hi // 2):
                hi //= 2
            return self._bisect(segment, max(lo, hi // 2), hi, ok)  # hi // 2 missed, or <= lo
        while not ok(hi):
            if hi >= max_replicas:
                ttft, itl = self.measure(segment, hi)
                raise NoPoolMeetsSla(
                    f"no pool of up to {max_replicas} replicas meets TTFT {sla.ttft_ms:g} ms / "
                    f"ITL {sla.itl_ms:g} ms (p90) in the trace's {segment.why} interval; at "
                    f"{hi} replicas p90 TTFT is {ttft.p90:.0f} ms and p90 ITL "
                    f"{itl.p90:.1f} ms: raise --ttft/--itl"
                )
            lo, hi = hi, min(max_replicas, hi * 2)
        return self._bisect(segment, lo, hi, ok)

    def _bisect(self, segment: Segment, lo: int, hi: int, ok: Callable[[int], bool]) -> Sizing:
        """The smallest size in (lo, hi] that is `ok`, given `lo` is not (or 0) and `hi` is."""
        hi = smallest_ok(lo, hi, ok)
        ttft, itl = self.measure(segment, hi)
        return Sizing(hi, segment, ttft, itl)

    def light_pool(self, segment: Segment) -> int:
        """A power of two of replicas that leaves each about `LIGHT_BATCH` requests in
        flight in the segment, by Little's law: concurrency = arrival rate x mean output
        tokens x the step time of a one-sequence decode step (`decode_terms`)."""
        part = [a for a in self.arrivals if segment.start <= a.t_s < segment.end]
        if not part:
            return 1
        step_s = StepCostModel(self.shape.sim).decode_terms(1)[0]
        rate = len(part) / (segment.end - segment.start)
        concurrency = rate * (sum(a.osl for a in part) / len(part)) * step_s
        return 1 << max(0, math.ceil(math.log2(max(1.0, concurrency / LIGHT_BATCH))))

    def default_sla(self, interval_s: float) -> Sla:
        """An SLA the static-peak pool meets (see the module doc)."""
        segment = peak_segment(self.arrivals, interval_s)
        n = min(MAX_REPLICAS, self.light_pool(segment))
        prev = self.measure(segment, n)
        while n < MAX_REPLICAS:
            n *= 2
            cur = self.measure(segment, n)
            settled = cur[0].p90 >= 0.95 * prev[0].p90 and cur[1].p90 >= 0.95 * prev[1].p90
            prev = cur
            if settled:
                break
        ttft, itl = prev
        itl_p90 = itl.p90 if not itl.empty else 1.0
        return Sla(nice_up(TTFT_HEADROOM * ttft.p90), nice_up(ITL_HEADROOM * itl_p90))


def nice_up(x: float) -> float:
    """The smallest step of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 (x 10^k) at or above `x`:
    a round number, at most 25 % above it."""
    if not x > 0:
        return 1.0
    e = math.floor(math.log10(x))
    for m in NICE:
        v = round(m * 10.0**e, 9)
        if v >= x * (1 - 1e-12):
            return v
    return 10.0 ** (e + 1)


@dataclass(frozen=True, slots=True)
class _Shifted:
    t_s: float
    isl: int
    osl: int
    hash_ids: tuple[int, ...]


def smallest_ok(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The smallest size in (lo, hi] that is `ok`, by bisection, given `lo` is not (or is
    0) and `hi` is, and `ok` holds from some size on."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi
