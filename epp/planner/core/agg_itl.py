"""A request's ITL in an aggregated replica, per request, from the profile alone: what
the request-level sizing (`request-target`) reads the share of
requests within the ITL SLA from.

The prefill-interference model (`sla_sizing.py` item 7) gives the *mean* step: the
decode step `itl` stretched by 1/(1 - rho). A request's ITL is the mean gap between its
own output tokens, over its g = osl - 1 steps: `itl + S/g`, S the prompt work batched
into those steps, i.e. the work of the prompts that reached its replica while it was
decoding. Prompts arrive as a Poisson stream of `rate` per replica, so over its decode
(g x itl / (1 - rho) on average) S is a compound Poisson sum: K ~ Poisson(lambda =
rate x g x itl / (1 - rho)) prompts, each of work w drawn from the interval's prompts
(`agg_ttft.StepRegime`: batch-1 TTFT less the steps it pays anyway). Hence

    P(ITL <= L) = P(S <= g (L - itl)) = sum_k P(K = k) P(w_1 + ... + w_k <= g (L - itl))

with the k = 1 term from the sampled works themselves (a short answer that meets one
long prompt: Mooncake's 375 ms ITL p99 with 8,192-token chunks), k >= 2 by the normal
approximation of a sum, and lambda > LARGE_LAMBDA (long answers) by the normal
approximation of S itself. The mean of this over lambda matches the mean model: E[S]/g
= rate x E[w] x itl / (1 - rho) = rho x itl / (1 - rho).

Requests of one output token have no ITL (judged on TTFT alone, as `outcome.Sla.met`).
Pure arithmetic; no state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from epp.planner.core.agg_ttft import smallest_reaching

LARGE_LAMBDA = 25.0  # expected prompts during a decode past which S is taken as normal
MAX_TERMS = 60  # Poisson terms summed below LARGE_LAMBDA (P(K > 60) < 1e-12 there)
BISECT_ROUNDS = 40


@dataclass(frozen=True, eq=False)
class DecodeSteps:
    """What a request decodes among on one replica: the decode step `itl_ms`, the share
    `rho` of the replica's time in prompt work, `rate` prompts/s arriving, each bringing
    a work drawn from `works_ms` (`agg_ttft.AggregatedTtft.works_ms`)."""

    itl_ms: float
    rho: float
    rate: float
    works_ms: Sequence[float]


def within(steps: DecodeSteps, limit_ms: float, osls: Sequence[float]) -> np.ndarray:
    """Per request (answer lengths `osls`), the probability its ITL is within
    `limit_ms`; 1 for one-token answers."""
    itl_ms, rho, rate = steps.itl_ms, steps.rho, steps.rate
    o = np.asarray(osls, dtype=float)
    out = np.ones(len(o))
    multi = o >= 2
    if not np.any(multi) or not math.isfinite(itl_ms):
        return out if math.isfinite(itl_ms) else np.where(multi, 0.0, 1.0)
    g = o[multi] - 1.0
    slack = g * (limit_ms - itl_ms)  # ms of prompt work its steps can absorb
    w = np.sort(np.asarray(steps.works_ms, dtype=float))
    if rate <= 0 or len(w) == 0 or rho >= 1:
        out[multi] = np.where(slack >= 0, 1.0, 0.0) if rho < 1 else 0.0
        return out
    mu = float(w.mean())
    var = float(w.var())
    lam = rate * g * itl_ms / 1000.0 / (1.0 - rho)
    p_k = np.exp(-lam)
    total = p_k.copy()  # k = 0: no prompt, within iff the bare step is
    for k in range(1, MAX_TERMS + 1):
        p_k = p_k * lam / k
        if k == 1:
            cdf = np.searchsorted(w, slack, side="right") / len(w)
        elif var > 0:
            cdf = ndtr((slack - k * mu) / math.sqrt(k * var))
        else:
            cdf = (slack >= k * mu).astype(float)
        total += p_k * cdf
    big = lam > LARGE_LAMBDA
    if np.any(big):
        m2 = var + mu * mu
        total[big] = ndtr((slack[big] - lam[big] * mu) / np.sqrt(lam[big] * m2))
    out[multi] = np.where(slack >= 0, np.minimum(total, 1.0), 0.0)
    return out


def share(steps: DecodeSteps, limit_ms: float, osls: Sequence[float]) -> float:
    """The share of requests whose ITL is within `limit_ms` (one-token answers count)."""
    if len(osls) == 0:
        return math.nan
    return float(np.mean(within(steps, limit_ms, osls)))


def quantile(steps: DecodeSteps, q: float, osls: Sequence[float]) -> float:
    """The ITL (ms) a share `q` of the requests with an ITL (two or more output
    tokens) stay within; NaN when there are none."""
    itl_ms, rho = steps.itl_ms, steps.rho
    multi = [o for o in osls if o >= 2]
    if not multi or not math.isfinite(itl_ms) or rho >= 1:
        return math.nan if not multi else math.inf
    lo, hi = itl_ms, itl_ms / (1.0 - rho) * 2.0
    for _ in range(BISECT_ROUNDS):  # widen until the q-share is inside
        if share(steps, hi, multi) >= q:
            break
        lo, hi = hi, hi * 2.0
    return smallest_reaching(lambda t: share(steps, t, multi), q, lo, hi, BISECT_ROUNDS)
