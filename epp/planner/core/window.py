"""One adjustment interval being gathered: requests as they are admitted and finish,
pool load as it is sampled; `close(now, ...)` turns it into an `Observation`.

Pure: the window never reads a clock (every call says when), so the replay feeds it
simulated time and the live thread the wall clock. Memory is bounded by one interval's
requests, and the ISL sample by `isl_sample_cap` (reservoir sampling with the caller's
random source, so a seeded replay is reproducible).

ITL here is per request: the mean gap between its output tokens (its TPOT), so
"p90 ITL" is the ITL that 90 % of requests stayed within, the figure an SLA promises.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping

from epp.planner.core.types import EndpointLoad, Observation, Replicas, Role, RoleLoad, Stats
from epp.records import PoolSample, RequestRecord


class IntervalWindow:
    def __init__(
        self, start: float, *, isl_sample_cap: int = 1024, rng: random.Random | None = None
    ) -> None:
        if isl_sample_cap < 0:
            raise ValueError("isl_sample_cap must be >= 0")
        self._cap = isl_sample_cap
        self._rng = rng or random.Random(0)
        self._reset(start)

    def _reset(self, start: float) -> None:
        self.start = start
        self._arrivals = 0
        self._isl_sample: list[int] = []
        self._failures = 0
        self._isl: list[float] = []
        self._osl: list[float] = []
        self._ttft: list[float] = []
        self._itl: list[float] = []
        self._itl_by_request: list[float] = []
        self._duration: list[float] = []
        self._cached: list[float] = []
        self._samples: dict[Role, list[PoolSample]] = {}

    def admit(self, isl: int) -> None:
        """A request was admitted (routed) with this prompt length."""
        self._arrivals += 1
        if len(self._isl_sample) < self._cap:
            self._isl_sample.append(isl)
        elif self._cap:
            j = self._rng.randrange(self._arrivals)
            if j < self._cap:
                self._isl_sample[j] = isl

    def complete(self, rec: RequestRecord) -> None:
        if not rec.ok:
            self._failures += 1
            return
        self._isl.append(rec.isl)
        self._osl.append(rec.osl)
        self._ttft.append(rec.ttft_ms)
        if not math.isnan(rec.itl_ms):
            self._itl.append(rec.itl_ms)
        self._itl_by_request.append(rec.itl_ms)
        self._duration.append(rec.duration_s)
        self._cached.append(rec.cached_tokens)

    def sample(self, samples: Iterable[PoolSample]) -> None:
        """One tick's reading, one sample per role present in the pool."""
        for s in samples:
            self._samples.setdefault(s.role, []).append(s)

    def close(
        self,
        now: float,
        replicas: Mapping[Role, Replicas],
        endpoints: Iterable[EndpointLoad] = (),
    ) -> Observation:
        """The interval `[start, now)` as an Observation; the window restarts at `now`."""
        obs = Observation(
            start=self.start,
            end=now,
            arrivals=self._arrivals,
            completions=len(self._ttft),
            failures=self._failures,
            isl=Stats.of(self._isl),
            osl=Stats.of(self._osl),
            ttft_ms=Stats.of(self._ttft),
            itl_ms=Stats.of(self._itl),
            duration_s=Stats.of(self._duration),
            cached_tokens=Stats.of(self._cached),
            isl_samples=tuple(self._isl_sample),
            ttft_ms_samples=tuple(self._ttft),
            itl_ms_samples=tuple(self._itl),
            itl_ms_by_request=tuple(self._itl_by_request),
            isl_by_request=tuple(self._isl),
            roles={role: _role_load(samples) for role, samples in self._samples.items()},
            replicas=dict(replicas),
            endpoints=tuple(endpoints),
        )
        self._reset(now)
        return obs


def _role_load(samples: list[PoolSample]) -> RoleLoad:
    n = len(samples)
    per_replica = [s.waiting / s.ready for s in samples if s.ready > 0]
    return RoleLoad(
        samples=n,
        queue_mean=math.fsum(s.waiting for s in samples) / n,
        queue_first=float(samples[0].waiting),
        queue_last=float(samples[-1].waiting),
        kv_mean=math.fsum(s.kv_mean for s in samples) / n,
        waiting_per_replica=math.fsum(per_replica) / len(per_replica) if per_replica else math.nan,
        running_mean=math.fsum(s.running for s in samples) / n,
    )
