"""Hand-built planner inputs: observations and a synthetic profile whose numbers a test
can work out on paper."""

from __future__ import annotations

import functools

from epp.planner.core.config import parse_planner_config
from epp.planner.core.perf import Profile
from epp.planner.core.types import EMPTY, EndpointLoad, Observation, Replicas, Role, RoleLoad, Stats

# Prefill: 40 000 tokens/s per GPU at every ISL, so TTFT = isl / 40 000 × 1000 ms
# (25 ms at 1000, 75 ms at 3000). Decode: ITL = 5 + 20 × KV use ms, 10 000 tokens/s
# per GPU at every point (Dynamo's test numbers, reference §8.1).
MAX_KV = 100_000
PREFILL = {
    "prefill_isl": [1000, 2000, 4000, 8000, 16000],
    "prefill_ttft": [25.0, 50.0, 100.0, 200.0, 400.0],
    "prefill_thpt_per_gpu": [40_000.0] * 5,
}
_KV = [0.0, 0.25, 0.5, 0.75, 1.0]
_CTX = [500.0, 3000.0, 6000.0]
DECODE = {
    "x_kv_usage": [kv for _ in _CTX for kv in _KV],
    "y_context_length": [c for c in _CTX for _ in _KV],
    "z_itl": [5 + 20 * kv for _ in _CTX for kv in _KV],
    "z_thpt_per_gpu": [10_000.0] * (len(_KV) * len(_CTX)),
    "max_kv_tokens": [MAX_KV],
}


@functools.cache  # immutable; building the decode grid costs a scipy griddata
def profile() -> Profile:
    return Profile.from_arrays(PREFILL, DECODE, "synthetic")


def config(**settings):
    """A PlannerConfig from kebab-case keys given as snake_case keywords."""
    return parse_planner_config({k.replace("_", "-"): v for k, v in settings.items()})


def const(value: float, n: int) -> Stats:
    """n requests that all had `value` (mean = p90 = value)."""
    return Stats.of([value] * n) if n else EMPTY


def obs(
    end: float = 60.0,
    length: float = 60.0,
    *,
    arrivals: int | None = None,
    completions: int = 0,
    ttft: float = 75.0,
    itl: float = 8.0,
    isl: float = 3000,
    osl: float = 150,
    duration: float = 2.0,
    isl_samples: tuple[int, ...] = (),
    cached: float = 0.0,
    replicas: dict[Role, Replicas] | None = None,
    roles: dict[Role, RoleLoad] | None = None,
    endpoints: tuple[EndpointLoad, ...] = (),
) -> Observation:
    n = completions
    return Observation(
        start=end - length,
        end=end,
        arrivals=n if arrivals is None else arrivals,
        completions=n,
        isl=const(isl, n),
        osl=const(osl, n),
        ttft_ms=const(ttft, n),
        itl_ms=const(itl, n),
        duration_s=const(duration, n),
        cached_tokens=const(cached, n),
        isl_samples=isl_samples,
        roles=roles or {},
        replicas=replicas or {},
        endpoints=endpoints,
    )


def pd(p: int, d: int, *, p_starting: int = 0, d_starting: int = 0) -> dict[Role, Replicas]:
    return {
        Role.PREFILL: Replicas(ready=p, starting=p_starting),
        Role.DECODE: Replicas(ready=d, starting=d_starting),
    }


def agg(n: int, starting: int = 0) -> dict[Role, Replicas]:
    return {Role.AGGREGATED: Replicas(ready=n, starting=starting)}
