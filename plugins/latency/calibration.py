"""Online calibration of latency predictions: observed / predicted, per endpoint and class.

A router only ever observes the endpoints it picked, and it picks where the prediction
was lowest: an endpoint whose estimate is optimistic attracts the requests that then
miss (the winner's curse, or the optimizer's curse: Smith & Winkler, Management Science
2006). On `bench/slo_family.py` chats sent to a slow server that only just met their
TPOT target came out 2.3-2.8x worse than predicted. Each finished request therefore
updates, for its endpoint and its class (`tight` / `loose` / `none` by its own targets),
an EWMA of log(observed / predicted) and of its square; the next predictions there are
multiplied by

    exp(m + z·sd),   m = (n·m_endpoint + k·m_pool) / (n + k)

with the same shrinkage for the variance: an endpoint with `n` samples counts n / (n + k)
and the pool's ratio for the class the rest (empirical-Bayes shrinkage, James-Stein
style), so an endpoint seen a few lucky times cannot look better than the pool; `z` > 0
adds a margin for the spread (z = 1: about the 84th percentile of the ratio under a
log-normal error). Samples are clamped to ratios within [1/`CLAMP`, `CLAMP`] so one
stalled request cannot swing the EWMA. O(1) per request; memory per endpoint × class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CLAMP = 10.0
REFRESH_EVERY = 8  # samples between recomputing every endpoint's factor
_LOG_CLAMP = math.log(CLAMP)
CLASSES = ("tight", "loose", "none")


def request_class(ttft_ms: float | None, tpot_ms: float | None, tight_ttft_ms: float) -> str:
    """`tight`: a TPOT target, or a TTFT target of at most `tight_ttft_ms` (interactive);
    `loose`: only a longer TTFT target; `none`: no target."""
    if tpot_ms is not None or (ttft_ms is not None and ttft_ms <= tight_ttft_ms):
        return "tight"
    return "loose" if ttft_ms is not None else "none"


@dataclass(slots=True)
class _Stat:
    mean: float = 0.0  # EWMA of log(observed / predicted)
    square: float = 0.0  # EWMA of its square
    n: int = 0

    def fold(self, x: float, alpha: float) -> None:
        a = max(alpha, 1.0 / (self.n + 1))  # a plain mean until 1/alpha samples
        self.mean += a * (x - self.mean)
        self.square += a * (x * x - self.square)
        self.n += 1

    @property
    def var(self) -> float:
        return max(0.0, self.square - self.mean * self.mean)


class Calibrator:
    """Multiplicative corrections per (endpoint, class, metric); metric `ttft` or `tpot`."""

    def __init__(self, alpha: float, prior_samples: float, z: float) -> None:
        self.alpha = alpha
        self.k = prior_samples
        self.z = z
        self._by: dict[tuple[str, str, str], _Stat] = {}
        self._pool: dict[tuple[str, str], _Stat] = {}
        # Factors as computed (the request path reads them). A sample drops its endpoint's
        # own entry at once; every endpoint's, for the pool's share, only every
        # `REFRESH_EVERY` samples: otherwise every finished request would make the next
        # pick recompute all of them (+26 µs per request on 8 endpoints), for a pool ratio
        # that one sample moves by at most `alpha` of its distance.
        self._cache: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._since_refresh = 0

    def observe(
        self, endpoint: str, cls: str, metric: str, predicted: float, observed: float
    ) -> None:
        if not (predicted > 0 and observed > 0) or math.isinf(observed):
            return
        x = min(_LOG_CLAMP, max(-_LOG_CLAMP, math.log(observed / predicted)))
        self._by.setdefault((endpoint, cls, metric), _Stat()).fold(x, self.alpha)
        self._pool.setdefault((cls, metric), _Stat()).fold(x, self.alpha)
        self._since_refresh += 1
        if self._since_refresh >= REFRESH_EVERY:
            self._since_refresh = 0
            self._cache.clear()
        else:
            self._cache.pop((endpoint, cls, metric), None)

    def factor(self, endpoint: str, cls: str, metric: str) -> float:
        """What to multiply the next prediction by (1.0 before any sample of the class)."""
        return self.factors(endpoint, cls, metric)[0]

    def factors(self, endpoint: str, cls: str, metric: str) -> tuple[float, float]:
        """(with the margin: exp(m + z·sd), the central estimate: exp(m))."""
        key = (endpoint, cls, metric)
        f = self._cache.get(key)
        if f is None:
            f = self._cache[key] = self._factors(endpoint, cls, metric)
        return f

    def _factors(self, endpoint: str, cls: str, metric: str) -> tuple[float, float]:
        pool = self._pool.get((cls, metric))
        if pool is None:
            return 1.0, 1.0
        own = self._by.get((endpoint, cls, metric))
        n = own.n if own is not None else 0
        w = n / (n + self.k) if n else 0.0
        mean = pool.mean + (w * (own.mean - pool.mean) if own is not None else 0.0)
        var = pool.var + (w * (own.var - pool.var) if own is not None else 0.0)
        return math.exp(mean + self.z * math.sqrt(var)), math.exp(mean)

    def samples(self, endpoint: str, cls: str, metric: str) -> int:
        s = self._by.get((endpoint, cls, metric))
        return s.n if s is not None else 0

    def retain(self, names: set[str]) -> None:
        for key in [k for k in self._by if k[0] not in names]:
            del self._by[key]
        self._cache.clear()
