"""One interval's completed requests against the SLA: the share the SLA promises per
request (>= 99 % within both TTFT and ITL), which no percentile of either quantity alone
gives. The SLA mode's `startup_bound` signal reads it (`sla_mode.py`).

Pure over Observations; no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from epp.planner.core.types import Observation


@dataclass(frozen=True, slots=True)
class Tally:
    """One interval's completed requests against the SLA."""

    end: float
    requests: int
    met: int  # within both

    @classmethod
    def of(cls, obs: Observation, ttft_ms: float, itl_ms: float) -> Tally:
        """Count `obs`'s completed requests with TTFT within `ttft_ms` and ITL within
        `itl_ms` (a one-token answer, ITL NaN, is judged on TTFT alone, as
        `outcome.Sla.met`)."""
        ttft, itl = obs.ttft_ms_samples, obs.itl_ms_by_request
        if len(itl) != len(ttft):  # an Observation built without the aligned ITLs
            itl = (math.nan,) * len(ttft)
        met = sum(1 for t, i in zip(ttft, itl, strict=True) if t <= ttft_ms and not i > itl_ms)
        return cls(obs.end, len(ttft), met)

    @property
    def share(self) -> float:
        return self.met / self.requests if self.requests else math.nan
