"""A prefill pool as a G/G/c queue: how long a prompt waits before its prefill starts.

Dynamo sizes prefill on throughput alone and clamps the TTFT correction at 1, so
queueing never adds a replica; under bursts its TTFT reached ~160 s against a 3 s SLA
(#10528; reference §1.5, §10.2). Here each replica serves one prefill at a time with
service time S (the profile's batch-1 TTFT for the prompt), requests arrive at rate λ,
and the waiting time follows the Allen-Cunneen approximation of the M/M/c wait scaled
by the variability of arrivals and service:

    a = λ·E[S]                          offered load, in replicas
    C(c, a)                             Erlang C: P(a request waits), from Erlang B
    P(Wq > t) ≈ C · exp(-t · (c - a)/E[S] · 2/(ca² + cs²))
    E[Wq]    ≈ C · E[S]/(c - a) · (ca² + cs²)/2

with ca², cs² the squared coefficients of variation of inter-arrival and service
times (1 and 1 give M/M/c exactly). The exponential tail is the heavy-traffic form
(Kingman); it errs on the safe side at light load, where waits are rare anyway.

Pure arithmetic, no state.
"""

from __future__ import annotations

import math

MAX_EXTRA_SERVERS = 10_000  # search bound past the stability floor; never reached in practice


def erlang_c(c: int, a: float) -> float:
    """P(wait > 0) in M/M/c with offered load `a` (Erlang B recursion, stable for large c).
    1.0 when the queue is unstable (a >= c)."""
    if c <= 0 or a >= c:
        return 1.0
    if a <= 0:
        return 0.0
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1.0 - b))


def wait_quantile(c: int, a: float, mean_service: float, q: float, scv: float) -> float:
    """Waiting time (same unit as `mean_service`) that a share `q` of requests stay
    within; `scv` = (ca² + cs²)/2. Infinite when unstable."""
    if a <= 0:
        return 0.0
    if a >= c:
        return math.inf
    p_wait = erlang_c(c, a)
    if p_wait <= 1.0 - q:
        return 0.0
    rate = (c - a) / mean_service / max(scv, 1e-9)
    return math.log(p_wait / (1.0 - q)) / rate


def wait_mean(c: int, a: float, mean_service: float, scv: float) -> float:
    if a <= 0:
        return 0.0
    if a >= c:
        return math.inf
    return erlang_c(c, a) * mean_service / (c - a) * scv


def smallest_servers(
    a: float, mean_service: float, wait_budget: float, q: float | None, scv: float
) -> int:
    """The fewest replicas whose waiting time (quantile `q`, or the mean when `q` is
    None) stays within `wait_budget`. 0 when there is no load."""
    if a <= 0:
        return 0
    c = math.floor(a) + 1  # the stability floor: a < c
    for _ in range(MAX_EXTRA_SERVERS):
        w = (
            wait_mean(c, a, mean_service, scv)
            if q is None
            else wait_quantile(c, a, mean_service, q, scv)
        )
        if w <= wait_budget:
            return c
        c += 1
    return c
