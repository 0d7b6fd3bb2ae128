"""The aggregated replica's TTFT, from the profile alone.

The SLA mode's first TTFT model treats a replica as a prefill server: each prompt is
served for its batch-1 TTFT, stretched by the share of time decoding takes, in an
M/G/c queue. What an aggregated vLLM replica does instead (V1 scheduler, chunked
prefill): every step carries all running decodes plus as many prompt tokens as the
step's token budget (`max_num_batched_tokens`) leaves, running prompts first, then the
waiting ones in order. So a prompt

1. waits for the step in flight (it cannot join a step already running);
2. rides in the next step with the decodes and with every prompt that arrived during
   the step it waited on (they are batched, not queued one by one);
3. takes ceil(u / budget) steps when its u uncached tokens exceed the budget, each
   step carrying the decodes too.

With the profile's two curves (batch-1 TTFT against ISL; decode ITL against
concurrency and context) and nothing of the engine's internals:

- `base` = the decode ITL at no load: what a step costs whatever it holds (weights,
  launch), which a batch-1 prefill of k chunks pays k times;
- `work(u)` = TTFT1(u) - k(u) x base: the prompt's own compute beyond those steps;
- `itl` = the decode ITL at the replica's concurrency: a step carrying the decodes;
- `own(u)` = TTFT1(u) + k(u) x (itl - base): the prompt's k steps, each with the
  decodes in it;
- rho = prompt rate per replica x E[work]: the share of a replica's time in prompt
  work. A step's length T is the decode step plus the prompt work that arrived during
  the step before it, so E[T] = itl / (1 - rho) and, the arrivals being Poisson, the
  length-biased step E[T^2]/E[T] = E[T] + rate x E[work^2] / (1 - rho^2) (the
  variance of a compound Poisson sum, fed back through the previous step's length);
- the wait before its first step = the residual of the step in flight, half a
  length-biased step, plus the work of the prompts batched with it (those that arrived
  during that same step): (1/2 + rho) x E[T^2]/E[T].

A request's TTFT = own(u) + wait; over the interval's sampled prompt lengths and an
exponential wait of that mean this is a distribution, and the SLA statistic (p90) or
the share of requests within a TTFT limit is read from it (`quantile`,
`share_within`), not from a sum of percentiles.

Beyond the profile's longest ISL the batch-1 TTFT is extended along its last segment
(`ttft1_ms`): the profile's interpolator clamps (Dynamo's), which priced a 40,000-token
Mooncake prompt at the 15,860-token point's 721 ms.

Pure arithmetic over the profile; no state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from epp.planner.core.perf import Profile

DEFAULT_BUDGET = 8192  # vLLM's max_num_batched_tokens for the OpenAI server on H100-class GPUs
MAX_RHO = 0.95  # a replica whose prompts would take more of its time is unstable: inf
LITTLE_ROUNDS = 8  # fixed-point rounds for the decodes in flight (Little's law)
BISECT_ROUNDS = 50


def chunks(u: float, budget: int) -> int:
    """Steps a prompt of `u` uncached tokens takes (at least one)."""
    return max(1, math.ceil(u / budget - 1e-9))


def ttft1_ms(profile: Profile, lengths: Sequence[float]) -> np.ndarray:
    """Batch-1 TTFT (ms) per prompt length: the profile within its range, extended
    along its last segment beyond it (clamped below, as the profile's own lookup)."""
    pre = profile.prefill
    x = np.asarray(lengths, dtype=float)
    inside = pre.ttft_many(x)
    top = float(pre.isl[-1])
    if not np.any(x > top):
        return inside
    slope = float(pre.ttft_ms[-1] - pre.ttft_ms[-2]) / float(pre.isl[-1] - pre.isl[-2])
    beyond = pre.ttft(top) + max(0.0, slope) * (x - top)
    return np.where(x > top, beyond, inside)


@dataclass(frozen=True, slots=True)
class StepRegime:
    """One aggregated replica's steps at a prompt rate (ms; `rho` a share)."""

    base_ms: float  # a step holding one sequence (decode ITL at no load)
    itl_ms: float  # a step holding the replica's decodes
    rho: float  # share of the replica's time in prompt work
    mean_step_ms: float  # itl / (1 - rho)
    biased_step_ms: float  # E[T^2] / E[T]: the step an arrival lands in
    wait_ms: float  # mean wait before the prompt's first step

    @property
    def stable(self) -> bool:
        return math.isfinite(self.wait_ms)


@dataclass(frozen=True, eq=False)
class AggregatedTtft:
    """The TTFT distribution of one interval's prompts on one replica: each prompt's
    own steps (`own_ms`, one per sampled length) plus an exponential wait of mean
    `regime.wait_ms`."""

    own_ms: np.ndarray
    regime: StepRegime
    works_ms: np.ndarray  # each prompt's work beyond the steps it pays anyway (`work(u)`)

    def quantile(self, q: float) -> float:
        """The TTFT (ms) a share `q` of requests stay within (inf when unstable)."""
        return mixture_quantile(self.own_ms, self.regime.wait_ms, q)

    def mean(self) -> float:
        if len(self.own_ms) == 0:
            return math.nan
        return float(np.mean(self.own_ms)) + self.regime.wait_ms

    def share_within(self, limit_ms: float) -> float:
        """The share of requests whose TTFT is at most `limit_ms`."""
        return mixture_share(self.own_ms, self.regime.wait_ms, limit_ms)


def regime(
    rate: float,
    works_ms: Sequence[float],
    itl_ms: float,
    base_ms: float,
) -> StepRegime:
    """The step regime of a replica receiving `rate` prompts/s whose prompt work
    (ms each, `work(u)`) is sampled by `works_ms`, its decode step `itl_ms`."""
    if rate <= 0 or not works_ms:
        return StepRegime(base_ms, itl_ms, 0.0, itl_ms, itl_ms, itl_ms / 2)
    n = len(works_ms)
    w1 = math.fsum(works_ms) / n / 1000.0  # s
    w2 = math.fsum(w * w for w in works_ms) / n / 1e6  # s^2
    rho = rate * w1
    if rho >= MAX_RHO:
        return StepRegime(base_ms, itl_ms, rho, math.inf, math.inf, math.inf)
    mean = itl_ms / (1.0 - rho)
    biased = mean + rate * w2 / (1.0 - rho * rho) * 1000.0
    return StepRegime(base_ms, itl_ms, rho, mean, biased, (0.5 + rho) * biased)


def aggregated_ttft(
    profile: Profile,
    rate: float,
    lengths: Sequence[float],
    osl: float,
    context: float,
    budget: int = DEFAULT_BUDGET,
    decodes: float | None = None,
) -> AggregatedTtft:
    """The TTFT distribution on one replica receiving `rate` prompts/s whose uncached
    lengths are sampled by `lengths`, answers of mean `osl` tokens at mean `context`.
    `decodes` (per replica) when measured; else Little's law on the step length
    (rate x osl x E[T]), solved by a few fixed-point rounds."""
    if not lengths:
        empty = np.zeros(0)
        return AggregatedTtft(empty, StepRegime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0), empty)
    decode = profile.decode
    ctx = max(context, 1.0)
    base = decode.itl(0.0, ctx)
    t1 = ttft1_ms(profile, lengths)
    ks = [chunks(u, budget) for u in lengths]
    works = [max(0.0, float(t) - k * base) for t, k in zip(t1, ks, strict=True)]
    if decodes is not None:
        itl = decode.itl(max(decodes, 0.0), ctx)
        reg = regime(rate, works, itl, base)
    else:
        itl = base
        reg = regime(rate, works, itl, base)
        for _ in range(LITTLE_ROUNDS):
            if not reg.stable or not osl > 0:
                break
            itl = decode.itl(rate * osl * reg.mean_step_ms / 1000.0, ctx)
            reg = regime(rate, works, itl, base)
    own = t1 + np.asarray(ks, dtype=float) * max(0.0, reg.itl_ms - base)
    return AggregatedTtft(own, reg, np.asarray(works))


def mixture_share(own_ms: Sequence[float], wait_ms: float, limit_ms: float) -> float:
    """P(own + wait <= limit) over the sampled prompts, the wait exponential of mean
    `wait_ms` (0: no wait; inf: none within)."""
    if len(own_ms) == 0:
        return math.nan
    if not math.isfinite(wait_ms):
        return 0.0
    room = limit_ms - np.asarray(own_ms, dtype=float)
    if wait_ms <= 0:
        return float(np.mean(room >= 0))
    within = np.where(room >= 0, -np.expm1(-np.maximum(room, 0.0) / wait_ms), 0.0)
    return float(np.mean(within))


def mixture_quantile(own_ms: Sequence[float], wait_ms: float, q: float) -> float:
    """The smallest t with `mixture_share(own, wait, t) >= q` (bisection between the
    shortest prompt's own time and the longest's plus the wait's q-quantile)."""
    if len(own_ms) == 0:
        return math.nan
    if not math.isfinite(wait_ms):
        return math.inf
    own = np.asarray(own_ms, dtype=float)
    hi = float(own.max()) + max(wait_ms, 0.0) * -math.log(max(1e-12, 1.0 - q)) + 1e-9
    return smallest_reaching(lambda t: mixture_share(own, wait_ms, t), q, float(own.min()), hi)


def smallest_reaching(
    share_at: Callable[[float], float], q: float, lo: float, hi: float, rounds: int = BISECT_ROUNDS
) -> float:
    """The smallest t in [lo, hi] with `share_at(t) >= q`, by bisection (`share_at`
    non-decreasing, `share_at(hi) >= q`)."""
    for _ in range(rounds):
        mid = (lo + hi) / 2
        if share_at(mid) >= q:
            hi = mid
        else:
            lo = mid
    return hi
