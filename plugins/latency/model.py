"""The latency model: features of (endpoint state, request) → TTFT and TPOT, learned online.

Upstream's `predicted-latency-producer` (GIE `pkg/epp/framework/plugins/requestcontrol/
predictedlatency`) sends every observation to Python sidecars that train XGBoost or a
Bayesian ridge model. Here the model is a linear least-squares fit with numpy, in-process:

    TTFT ≈ w · ttft features,  TPOT ≈ v · tpot features

over the feature set the producer is configured with (`features.py`: the queueing terms
of `queue`, or the plain counts of `basic`),

one fit over the whole pool and one per endpoint with enough samples of its own (a 2×
slower server gets its own coefficients; a new one borrows the pool's). Samples go into a
bounded ring buffer (`SampleBuffer`, O(1) append from the request loop); `fit` reads a copy
and runs off the loop (the producer calls it through `asyncio.to_thread`); the result is an
immutable `Coefficients` swapped in by one assignment, so prediction never waits for a fit.
Prediction is a few multiplications in plain Python (cheaper than numpy for ten numbers).
Before enough samples exist, `cold_ttft_ms` / `cold_tpot_ms` give a formula from the
metrics: llm-d's TTFT gate estimate (pending prefill tokens / peak prefill throughput) and
a flat TPOT scaled by KV use.
"""

from __future__ import annotations

import math
import operator
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished request: the features it was routed with and what it measured."""

    endpoint: str
    ttft_x: tuple[float, ...]
    tpot_x: tuple[float, ...]
    ttft_ms: float  # NaN when unknown
    tpot_ms: float  # NaN when unknown (fewer than two output tokens)


class SampleBuffer:
    """The last `capacity` samples; append from the request loop, copy from the fitter."""

    def __init__(self, capacity: int) -> None:
        self._items: deque[Sample] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.added = 0  # samples ever added (the refit trigger counts from this)

    def add(self, sample: Sample) -> None:
        with self._lock:
            self._items.append(sample)
            self.added += 1

    def copy(self) -> list[Sample]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Fitted weights, pool-wide and per endpoint (None: too few samples yet)."""

    ttft: tuple[float, ...] | None = None
    tpot: tuple[float, ...] | None = None
    ttft_by_endpoint: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    tpot_by_endpoint: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    samples: int = 0
    # Mean absolute percentage error of the fitted models on the samples (NaN: no fit),
    # the accuracy the refit logs.
    ttft_mape: float = math.nan
    tpot_mape: float = math.nan


# Relative weighting never divides by less than this (a 0.1 ms TTFT would otherwise
# outweigh everything).
RELATIVE_FLOOR_MS = 1.0


def _dot(w: Sequence[float], x: Sequence[float]) -> float:
    if len(w) != len(x):
        raise ValueError(f"{len(w)} weights for {len(x)} features")
    return sum(map(operator.mul, w, x))  # ~2x faster than a generator on the request path


def _lstsq(xs: np.ndarray, ys: np.ndarray, ridge: float, relative: bool) -> tuple[float, ...]:
    """Ridge least squares on standardised columns (the intercept unpenalised), so
    collinear load signals (running vs in-flight requests) give stable weights.

    `relative`: each row weighted by 1 / observed, so the fit minimises the squared
    *relative* error (what MAPE and an SLO comparison measure) instead of letting the
    long requests' large absolute errors decide the weights of the short ones. Columns are
    then standardised under the same weights, so the penalty stays `ridge` times each
    column's weighted size (standardised without weights, a column that only the large,
    lightly weighted rows inform was flattened: 10 s predicted as 100 ms)."""
    weight = 1.0 / np.maximum(ys, RELATIVE_FLOOR_MS) if relative else np.ones(len(ys))
    w2 = weight**2
    total = float(w2.sum())
    cols = xs[:, 1:]
    mean = (w2 @ cols) / total
    std = np.sqrt((w2 @ (cols - mean) ** 2) / total)
    std[std == 0] = 1.0
    z = np.hstack([np.ones((len(xs), 1)), (cols - mean) / std]) * weight[:, None]
    penalty = np.sqrt(ridge * total) * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    a = np.vstack([z, penalty])
    b = np.concatenate([ys * weight, np.zeros(z.shape[1])])
    beta, *_ = np.linalg.lstsq(a, b, rcond=None)
    w = beta[1:] / std
    intercept = beta[0] - float(np.dot(w, mean))
    return (float(intercept), *(float(v) for v in w))


def _fit_one(
    rows: list[tuple[tuple[float, ...], float]], min_samples: int, ridge: float, relative: bool
):
    if len(rows) < min_samples:
        return None
    xs = np.array([r[0] for r in rows], dtype=float)
    ys = np.array([r[1] for r in rows], dtype=float)
    return _lstsq(xs, ys, ridge, relative)


def fit(
    samples: Sequence[Sample], min_samples: int, ridge: float = 1e-4, relative: bool = True
) -> Coefficients:
    """Fit the pool-wide and per-endpoint models (pure: no clock, no I/O; runs off-loop)."""
    ttft_rows: dict[str, list[tuple[tuple[float, ...], float]]] = {}
    tpot_rows: dict[str, list[tuple[tuple[float, ...], float]]] = {}
    for s in samples:
        if not math.isnan(s.ttft_ms):
            ttft_rows.setdefault(s.endpoint, []).append((s.ttft_x, s.ttft_ms))
        if not math.isnan(s.tpot_ms):
            tpot_rows.setdefault(s.endpoint, []).append((s.tpot_x, s.tpot_ms))
    all_ttft = [r for rows in ttft_rows.values() for r in rows]
    all_tpot = [r for rows in tpot_rows.values() for r in rows]

    def one(rows):
        return _fit_one(rows, min_samples, ridge, relative)

    by_ttft = {k: w for k, v in ttft_rows.items() if (w := one(v))}
    by_tpot = {k: w for k, v in tpot_rows.items() if (w := one(v))}
    ttft, tpot = one(all_ttft), one(all_tpot)
    return Coefficients(
        ttft=ttft,
        tpot=tpot,
        ttft_by_endpoint=by_ttft,
        tpot_by_endpoint=by_tpot,
        samples=len(samples),
        ttft_mape=_mape(ttft_rows, by_ttft, ttft),
        tpot_mape=_mape(tpot_rows, by_tpot, tpot),
    )


def _mape(rows_by_endpoint, by_endpoint, pool) -> float:
    errors = []
    for name, rows in rows_by_endpoint.items():
        w = by_endpoint.get(name) or pool
        if w is None:
            continue
        errors += [abs(max(0.0, _dot(w, x)) - y) / y for x, y in rows if y > 0]
    return float(np.mean(errors)) if errors else math.nan


@dataclass(frozen=True, slots=True)
class ColdStart:
    """The formula used before a model is fitted (see the module docstring)."""

    prefill_tokens_per_s: float
    tpot_ms: float

    def ttft_ms(self, x: Sequence[float]) -> float:
        # x = ttft_features: pending prefill = this prompt's uncached part + in-flight.
        return 1000.0 * (x[1] + x[2]) / self.prefill_tokens_per_s

    def tpot(self, x: Sequence[float]) -> float:
        return self.tpot_ms * (1.0 + x[3])  # x[3] = KV use: a fuller batch decodes slower


def predict(
    coef: Coefficients,
    cold: ColdStart,
    endpoint: str,
    ttft_x: Sequence[float],
    tpot_x: Sequence[float],
) -> tuple[float, float, bool]:
    """(TTFT ms, TPOT ms, learned?) — never below 0; falls back per dimension."""
    w = coef.ttft_by_endpoint.get(endpoint) or coef.ttft
    v = coef.tpot_by_endpoint.get(endpoint) or coef.tpot
    ttft = _dot(w, ttft_x) if w else cold.ttft_ms(ttft_x)
    tpot = _dot(v, tpot_x) if v else cold.tpot(tpot_x)
    return max(0.0, ttft), max(0.0, tpot), bool(w and v)
