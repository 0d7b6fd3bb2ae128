"""The planner's boundary: what one interval looked like, and what to do about it.

Pure data, no I/O, no clock. Every policy (this project's load and SLA modes, the
Dynamo-faithful baseline, static pools, the other autoscaling laws of the comparison)
is a `Policy`: `step(now, obs) -> Decision`, with `now` given by the caller. The live
thread inside `epp serve` calls it on the wall clock; `epp plan replay` calls it on a
simulated clock and runs hours of trace per second. Neither may reach around these
types, so a policy that works in the replay works live.

Units are in the field names: `_ms` for latencies (Dynamo's SLA flags are in ms),
`_s` for durations, plain counts for tokens and requests. A statistic over no values
is NaN, never 0: "no traffic" and "zero latency" are different facts (Dynamo #6985).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epp.records import Role

NAN = math.nan


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of one quantity over an interval; NaN fields when `count == 0`."""

    count: int = 0
    mean: float = NAN
    p50: float = NAN
    p90: float = NAN
    p99: float = NAN

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        """Nearest-rank percentiles (the value a share q of the samples is at or below)."""
        n = len(values)
        if n == 0:
            return EMPTY
        ordered = sorted(values)

        def rank(q: float) -> float:
            return float(ordered[max(0, math.ceil(q * n) - 1)])

        return cls(n, math.fsum(ordered) / n, rank(0.50), rank(0.90), rank(0.99))

    def at(self, percentile: str) -> float:
        """`"mean"`, `"p50"`, `"p90"` or `"p99"`: how a config names the statistic."""
        return float(getattr(self, percentile))

    @property
    def empty(self) -> bool:
        return self.count == 0


EMPTY = Stats()


@dataclass(frozen=True, slots=True)
class RoleLoad:
    """One role's load signals over an interval, from the pool samples taken every
    `metric-pulling-interval` (Dynamo's planner). Queue values are pool totals (requests
    waiting summed over the role's ready replicas); KV use is the mean over samples
    and replicas, in [0, 1].

    `queue_first`/`queue_last` are the first and last samples: LOAD-v0 projects the
    queue's trend from them (`last + (last - first) * 3`).
    """

    samples: int = 0
    queue_mean: float = NAN
    queue_first: float = NAN
    queue_last: float = NAN
    kv_mean: float = NAN
    waiting_per_replica: float = NAN  # mean over samples of queue / ready replicas
    running_mean: float = NAN  # requests running, pool total


@dataclass(frozen=True, slots=True)
class Replicas:
    """How many replicas a role has, by state. Starting and draining replicas hold GPUs
    (they count against the budget) but take no new requests."""

    ready: int = 0
    starting: int = 0
    draining: int = 0

    @property
    def active(self) -> int:
        """Ready plus starting: the count a new target is compared with."""
        return self.ready + self.starting

    @property
    def holding_gpus(self) -> int:
        return self.ready + self.starting + self.draining


@dataclass(frozen=True, slots=True)
class EndpointLoad:
    """One ready replica's in-flight work when the interval closed: how a scale-down
    chooses which replica to drain (the one with the least work)."""

    name: str
    role: Role
    in_flight_requests: int = 0
    in_flight_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Observation:
    """One adjustment interval `[start, end)` as the EPP saw it.

    Request statistics cover the requests that *completed* in the interval (their
    output length is known); `arrivals` counts requests *admitted* in it, the demand
    Dynamo's completion counter hides under backpressure (its #11693). `isl_samples`
    is a bounded sample of admitted requests' prompt lengths (the forecast's ISL is
    their mean); `cached_tokens` is per completed request (prompt tokens served from cache).
    `ttft_ms_samples` / `itl_ms_samples` are the completed requests' own values (the
    ones `ttft_ms` / `itl_ms` summarise), so a law whose percentile spans several
    intervals (llm-d's p90 over a 1-minute window, read every 15 s) can pool them.
    `itl_ms_by_request` is aligned with `ttft_ms_samples` (NaN for a one-token answer,
    which has no ITL), so a policy can count the requests that met *both* SLAs: the
    share the SLA promises per request (`attainment.py`), which no percentile of either
    quantity alone gives; `isl_by_request` is aligned with them too (the prompt lengths,
    so a request no replica could serve within the TTFT SLA can be told apart).
    """

    start: float
    end: float
    arrivals: int = 0
    completions: int = 0
    failures: int = 0
    isl: Stats = EMPTY
    osl: Stats = EMPTY
    ttft_ms: Stats = EMPTY
    itl_ms: Stats = EMPTY
    duration_s: Stats = EMPTY
    cached_tokens: Stats = EMPTY
    isl_samples: tuple[int, ...] = ()
    ttft_ms_samples: tuple[float, ...] = ()
    itl_ms_samples: tuple[float, ...] = ()
    itl_ms_by_request: tuple[float, ...] = ()
    isl_by_request: tuple[int, ...] = ()
    roles: Mapping[Role, RoleLoad] = field(default_factory=dict)
    replicas: Mapping[Role, Replicas] = field(default_factory=dict)
    endpoints: tuple[EndpointLoad, ...] = ()

    @property
    def length_s(self) -> float:
        return self.end - self.start

    @property
    def idle(self) -> bool:
        """No request arrived and none completed: the interval Dynamo skips (#6985)."""
        return self.arrivals == 0 and self.completions == 0

    def role(self, role: Role) -> RoleLoad:
        return self.roles.get(role, RoleLoad())

    def replicas_of(self, role: Role) -> Replicas:
        return self.replicas.get(role, Replicas())


@dataclass(frozen=True, slots=True)
class PredictedLoad:
    """What a policy expected of the next interval(s) when it decided."""

    requests: float = NAN  # per interval
    isl: float = NAN
    osl: float = NAN
    horizon_s: float = NAN  # how far ahead the prediction looks

    @property
    def rate(self) -> float:
        """Requests per second, if the horizon is known."""
        if not self.horizon_s or math.isnan(self.horizon_s):
            return NAN
        return self.requests / self.horizon_s


@dataclass(frozen=True, slots=True)
class Decision:
    """What a policy wants after an interval: a target per role, why, and which
    replicas to drain if a target went down (names from `Observation.endpoints`; a
    driver drains others of its choosing if the list is short).

    `diagnostics` carries the numbers behind the decision (correction factors, the
    interpolated throughput, the budget's cut) for the decision log and metrics.
    """

    at: float
    targets: Mapping[Role, int]
    reason: str
    predicted: PredictedLoad = PredictedLoad()
    drain: tuple[str, ...] = ()
    diagnostics: Mapping[str, float] = field(default_factory=dict)

    def target(self, role: Role) -> int:
        return self.targets.get(role, 0)

    def gpus(self, gpus_per_replica: Mapping[Role, int]) -> int:
        return sum(n * gpus_per_replica.get(r, 1) for r, n in self.targets.items())


class Policy(Protocol):
    """A scaling law. `interval_s` is how often it wants an `Observation` (its
    adjustment interval); `sample_interval_s` how often the driver samples pool load
    into the window that builds it. `step` must not do I/O or read a clock."""

    name: str
    interval_s: float
    sample_interval_s: float

    def step(self, now: float, obs: Observation) -> Decision: ...
