"""Sizing for the request target: a feedback term on the share of requests within the SLA.

The SLA mode sizes each interval so its TTFT and ITL *percentile* (`sla-percentile`,
p90) meets the SLA; the planner is judged on the share of *requests* within both (>= 99 %). An
interval at its p90 still lets up to a tenth of its requests miss; sizing at p99
instead reaches the target but over-provisions (the queue model's p99 tail: 1.13x
static-peak on Azure x3, an ablation recorded in docs/BENCHMARKS.md@a73a134). Between
the two, this controller measures what the target is about and adds capacity until it
is met:

- every interval it counts the requests that completed within both SLAs (the
  Observation's per-request TTFT and ITL: the EPP's own measurements live, the
  replay's in virtual time), pooled over the last `attainment-window` seconds;
- **tighten** (integral action): when that share and the last interval's are below
  `attainment-target`, the load factor the sizing plans for grows by
  `attainment-gain` x the shortfall (a window at 97 % with gain 2: +0.04, 4 % more
  load planned for), never above `attainment-max-factor`;
- **hold** while replicas start, and leave that interval out of the window: its misses
  measure the start-up delay (a rise met late), not the sizing, and the last step has
  not arrived yet (anti-windup; counting them kept 11 replicas where 7 met on Azure
  x3); hold too while the share sits between the target and "comfortable";
- **relax** by `RELAX_STEP` per interval when the window is comfortably above (at most
  half the miss budget used), back towards 1, so capacity added for a rise does not
  stay forever;
- **leave out unreachable prompts**: a prompt longer than `reachable_isl` (the longest
  whose batch-1 TTFT in the profile is within the SLA) misses on an idle replica, so no
  number of replicas brings it within the SLA. Counted, a minute with a few of them
  reads as a shortfall that capacity never closes, and the factor winds up to its bound
  for nothing (integral windup on an error the actuator cannot reach).

Why a load factor and not a tighter latency goal: in an aggregated pool the ITL a
request sees is set by the prefills sharing its replica's steps, which the decode
profile (decode alone) does not model; tightening the ITL goal moved the sizing by a
fraction of a replica until the goal fell below every profiled point and the sizing
jumped to the budget (tried first, Azure x3: 6.77 GPU-hours for 97.3 %). Planning for
more load per replica is what lowers both TTFT and ITL, in proportion.

Pure state over Observations; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from epp.planner.core.perf import Profile
from epp.planner.core.types import Observation

# load factor given back per comfortable interval (Azure x3: 0.02 held 11 replicas where 7
# met; 0.05 gave the same attainment for 3 % fewer GPU-hours)
RELAX_STEP = 0.05
MIN_REQUESTS = 20  # fewer completions in the window: no verdict, hold


@dataclass(frozen=True, slots=True)
class Tally:
    """One interval's completed requests against the SLA."""

    end: float
    requests: int
    met: int  # within both

    @classmethod
    def of(
        cls, obs: Observation, ttft_ms: float, itl_ms: float, max_isl: float = math.inf
    ) -> Tally:
        """Count `obs`'s completed requests with TTFT within `ttft_ms` and ITL within
        `itl_ms` (a one-token answer, ITL NaN, is judged on TTFT alone, as
        `outcome.Sla.met`), leaving out prompts longer than `max_isl`."""
        ttft, itl = obs.ttft_ms_samples, obs.itl_ms_by_request
        if len(itl) != len(ttft):  # an Observation built without the aligned ITLs
            itl = (math.nan,) * len(ttft)
        isl = obs.isl_by_request
        if max_isl < math.inf and len(isl) == len(ttft):
            kept = [(t, i) for t, i, n in zip(ttft, itl, isl, strict=True) if n <= max_isl]
        else:
            kept = list(zip(ttft, itl, strict=True))
        met = sum(1 for t, i in kept if t <= ttft_ms and not i > itl_ms)
        return cls(obs.end, len(kept), met)

    @property
    def share(self) -> float:
        return self.met / self.requests if self.requests else math.nan


def reachable_isl(profile: Profile, ttft_ms: float) -> float:
    """The longest prompt whose batch-1 TTFT in the profile is within `ttft_ms`
    (infinite when the longest profiled one is; 0 when even the shortest is not)."""
    prefill = profile.prefill
    lo, hi = int(prefill.isl[0]), int(prefill.max_isl)
    if prefill.ttft(hi) <= ttft_ms:
        return math.inf
    if prefill.ttft(lo) > ttft_ms:
        return 0.0
    while hi - lo > 1:  # ttft(lo) within, ttft(hi) not; the profile's TTFT grows with ISL
        mid = (lo + hi) // 2
        if prefill.ttft(mid) <= ttft_ms:
            lo = mid
        else:
            hi = mid
    return float(lo)


class AttainmentControl:
    """The load factor (in [1, max_factor]) the SLA mode multiplies its forecast by
    when it sizes; `update` once per interval."""

    def __init__(
        self,
        target: float,
        window_s: float,
        gain: float,
        max_factor: float,
        reachable_isl: float = math.inf,
    ) -> None:
        if not 0 < target < 1:
            raise ValueError("attainment target must be in (0, 1)")
        self.target = target
        self.reachable_isl = reachable_isl
        self.window_s = window_s
        self.gain = gain
        self.max_factor = max_factor
        self.factor = 1.0
        self._tallies: deque[Tally] = deque()

    @property
    def comfortable(self) -> float:
        """At most half the miss budget used: 99.5 % for a 99 % target."""
        return 1.0 - (1.0 - self.target) / 2

    def update(
        self, obs: Observation, ttft_ms: float, itl_ms: float, starting: bool
    ) -> dict[str, float]:
        """Count the interval, move the factor; returns the diagnostics."""
        last = Tally.of(obs, ttft_ms, itl_ms, self.reachable_isl)
        tallies = self._tallies
        if not starting:  # misses while replicas start measure the start-up, not the sizing
            tallies.append(last)
        while tallies and tallies[0].end <= obs.end - self.window_s:
            tallies.popleft()
        n = sum(t.requests for t in tallies)
        diag = {"attainment_requests": float(n)}
        if n >= MIN_REQUESTS:
            share = sum(t.met for t in tallies) / n
            diag["attainment"] = share
            if share < self.target and last.share < self.target and not starting:
                step = self.gain * (self.target - share)
                self.factor = min(self.max_factor, self.factor + step)
                diag["attainment_tightened"] = 1.0
            elif share >= self.comfortable:
                self.factor = max(1.0, self.factor - RELAX_STEP)
        diag["attainment_factor"] = self.factor
        return diag
