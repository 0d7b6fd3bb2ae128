"""The SLA mode's correction factors: how far the profile's predictions are from what
the pool measured, learned per interval and read by the sizing (`sla_sizing.py`). The
item keeps `sla_mode.py`'s numbering.

3. **Correction factors** (unless `no-correction`), on the SLA statistic
   (`sla-percentile`, default p90, Dynamo: the mean): observed / what the model
   predicts at the observed load and replicas. Both may exceed 1 (Dynamo's
   `min(1, p)` may not); they are clamped to [1/3, 3] and smoothed (half old, half
   new) instead of taken raw, so an overloaded interval (whose latencies say "the
   profile is optimistic" loudly: a trial replay measured TTFTs 100× the model's)
   moves them by a bounded step. They are **frozen while replicas
   start** and for the interval after a scale-up (`freeze-correction-on-startup`;
   cold caches made Dynamo over-compensate, #2511).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from epp.planner.core.config import PlannerConfig
from epp.planner.core.types import Observation, Role, Stats

if TYPE_CHECKING:
    from epp.planner.core.sla_sizing import Sizing

CORRECTION_RANGE = (1 / 3, 3.0)
CORRECTION_WEIGHT = 0.5  # share of a new measurement in the smoothed factor


@dataclass
class Factors:
    """observed / predicted, TTFT (`p`) and ITL (`d`): 1 means the profile is right."""

    p: float = 1.0
    d: float = 1.0


class Corrections:
    """The factors and what freezes them: replicas starting, and the interval after a
    scale-up (`committed`)."""

    def __init__(self, config: PlannerConfig, sizing: Sizing) -> None:
        self.x = config.beyond
        self.roles = config.roles
        self.sizing = sizing
        self.factors = sizing.factors
        self.since_up = 1_000_000

    def committed(self, targets: Mapping[Role, int], obs: Observation) -> None:
        if any(targets.get(r, 0) > obs.replicas_of(r).active for r in self.roles):
            self.since_up = 0
        else:
            self.since_up += 1

    def stat(self, stats: Stats) -> float:
        return stats.at(self.x.sla_percentile)

    def correct(self, obs: Observation, diag: dict[str, float]) -> None:
        """Learn both factors from the interval just closed (nothing while frozen)."""
        s = self.sizing
        starting = any(obs.replicas_of(r).starting for r in self.roles)
        if self.x.freeze_correction_on_startup and (starting or self.since_up < 1):
            diag["correction_frozen"] = 1.0
            return
        if obs.completions == 0:
            return
        lam = obs.arrivals / max(obs.length_s, 1e-9)
        ready_p = obs.replicas_of(s.prefill).ready
        ready_d = obs.replicas_of(s.decode).ready
        ctx = obs.isl.mean + obs.osl.mean / 2
        ttft_obs = self.stat(obs.ttft_ms)
        itl_obs = self.stat(obs.itl_ms)
        if ready_d > 0 and not math.isnan(itl_obs) and not math.isnan(ctx):
            running = obs.role(s.decode).running_mean
            if math.isnan(running):  # Little's law, as Dynamo
                running = obs.completions / obs.length_s * obs.duration_s.mean
            expected = s.profile.decode.itl(running / ready_d, ctx)
            self.factors.d = self.learn(self.factors.d, itl_obs / expected)
            diag["expected_itl_ms"] = expected
        if ready_p > 0 and not math.isnan(ttft_obs):
            samples = s.service_samples(obs.isl.mean, correction=1.0)
            decode_load = 0.0
            if s.agg:
                decode_load = s.decode_load(lam, obs.isl.mean, obs.osl.mean, self.factors.d)[0]
            expected = s.ttft_ms(ready_p, lam, samples, decode_load)
            if math.isfinite(expected) and expected > 0:
                self.factors.p = self.learn(self.factors.p, ttft_obs / expected)
                diag["expected_ttft_ms"] = expected

    def learn(self, old: float, measured: float) -> float:
        """The smoothed factor (half old, half new), both ways: taking a rise at once
        bought nothing on the training traces (docs/planner.md)."""
        return smooth(old, measured)


def smooth(old: float, measured: float) -> float:
    lo, hi = CORRECTION_RANGE
    if not math.isfinite(measured) or measured <= 0:
        return old
    clamped = min(hi, max(lo, measured))
    return (1 - CORRECTION_WEIGHT) * old + CORRECTION_WEIGHT * clamped
