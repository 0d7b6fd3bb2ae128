"""Generated and rescaled traces, for replays the recorded traces cannot give. PURE and
seeded: the same arguments give the same arrivals.

`bursty` is production's shape that neither recorded trace has (../shared/traces/
README.md): quiet minutes with no request at all, then bursts at several times the mean
rate. The layout, starting quiet:

    quiet gap  ~ U(0.5, 1.5) x mean_gap_s, zero requests
    burst      ~ U(burst_s) long, Poisson arrivals at U(burst_factor) x mean_rate
    ... repeated until duration_s

`mean_gap_s` is solved so the long-run rate is `mean_rate`:
E[burst length x factor] = E[burst length] + E[gap]  (with the defaults,
75 s x 6 = 450 s of mean-rate traffic per cycle, so the mean gap is 450 - 75 = 375 s).
ISL/OSL are log-normal, by default matched to the Azure 2023 conversation trace
(ISL mean 1155, median 1020 -> sigma 0.5; OSL mean 211, median 129 -> sigma 1.0),
clipped to [1, max]. No prefix sharing (`hash_ids` empty, as Azure's).

`scale_rate` multiplies a trace's rate for fleet-scale replays.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from epp.planner.offline.traces import Arrival


def bursty(
    seed: int,
    duration_s: float,
    mean_rate: float,
    *,
    burst_s: tuple[float, float] = (30.0, 120.0),
    burst_factor: tuple[float, float] = (4.0, 8.0),
    isl_mean: float = 1155.0,
    isl_sigma: float = 0.5,
    osl_mean: float = 211.0,
    osl_sigma: float = 1.0,
    max_isl: int = 32768,
    max_osl: int = 4096,
) -> list[Arrival]:
    _positive(duration_s=duration_s, mean_rate=mean_rate, isl_mean=isl_mean, osl_mean=osl_mean)
    _range("burst_s", burst_s)
    _range("burst_factor", burst_factor)
    mean_burst = sum(burst_s) / 2
    mean_gap = mean_burst * sum(burst_factor) / 2 - mean_burst
    if mean_gap <= 0:
        raise ValueError("burst_factor must average above 1 (bursts above the mean rate)")
    rng = random.Random(seed)
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.uniform(0.5, 1.5) * mean_gap  # quiet
        if t >= duration_s:
            break
        end = min(duration_s, t + rng.uniform(*burst_s))
        rate = rng.uniform(*burst_factor) * mean_rate
        t += rng.expovariate(rate)
        while t < end:
            out.append(
                Arrival(
                    t_s=t,
                    isl=_lognormal(rng, isl_mean, isl_sigma, max_isl),
                    osl=_lognormal(rng, osl_mean, osl_sigma, max_osl),
                )
            )
            t += rng.expovariate(rate)
        t = end
    return out


def scale_rate(
    arrivals: Sequence[Arrival], k: float, seed: int = 0, *, jitter_s: float = 1.0
) -> list[Arrival]:
    """About `k` times the arrival rate: each request is kept once and copied
    `floor(k) - 1` more times, plus once more with probability `k - floor(k)` (k < 1
    thins the trace the same way). Copy j > 0 arrives U(-jitter_s, +jitter_s) from the
    original (at >= 0) and gets its own prefix ids (`id + j x (max id + 1)`), so prefix
    reuse stays within a copy, as K users replaying the same conversations would have.
    `k = 1` returns the arrivals unchanged."""
    if not (k > 0 and math.isfinite(k)):
        raise ValueError(f"rate scale must be a positive number, got {k}")
    if jitter_s < 0:
        raise ValueError(f"jitter_s must be >= 0, got {jitter_s}")
    if k == 1:
        return list(arrivals)
    rng = random.Random(seed)
    stride = 1 + max((h for a in arrivals for h in a.hash_ids), default=-1)
    whole, frac = int(k), k - int(k)
    out: list[Arrival] = []
    for a in arrivals:
        copies = whole + (1 if rng.random() < frac else 0)
        for j in range(copies):
            if j == 0:
                out.append(a)
                continue
            t = max(0.0, a.t_s + rng.uniform(-jitter_s, jitter_s))
            ids = tuple(h + j * stride for h in a.hash_ids)
            out.append(Arrival(t, a.isl, a.osl, ids))
    out.sort(key=lambda x: x.t_s)
    return out


def _lognormal(rng: random.Random, mean: float, sigma: float, cap: int) -> int:
    mu = math.log(mean) - sigma * sigma / 2  # so that E[X] = mean
    return max(1, min(cap, round(rng.lognormvariate(mu, sigma))))


def _positive(**values: float) -> None:
    for name, v in values.items():
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a positive number, got {v}")


def _range(name: str, r: tuple[float, float]) -> None:
    lo, hi = r
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {r}")
