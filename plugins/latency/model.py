"""The latency model: features of (endpoint state, request) → TTFT and TPOT, learned online.

Upstream's `predicted-latency-producer` (GIE `pkg/epp/framework/plugins/requestcontrol/
predictedlatency`) sends every observation to Python sidecars that train XGBoost or a
Bayesian ridge model. Here the model is a linear least-squares fit with numpy, in-process:

    TTFT ≈ w · [1, uncached prompt, EPP in-flight prefill tokens, waiting, running, KV use]
    TPOT ≈ v · [1, running, waiting, KV use, EPP in-flight requests, in-flight decode kTok]

one fit over the whole pool and one per endpoint with enough samples of its own (a 2×
slower server gets its own coefficients; a new one borrows the pool's). Samples go into a
bounded ring buffer (`SampleBuffer`, O(1) append from the request loop); `fit` reads a copy
and runs off the loop (the producer calls it through `asyncio.to_thread`); the result is an
immutable `Coefficients` swapped in by one assignment, so prediction never waits for a fit.
Prediction is a few multiplications in plain Python (cheaper than numpy for six numbers).
Before enough samples exist, `cold_ttft_ms` / `cold_tpot_ms` give a formula from the
metrics: llm-d's TTFT gate estimate (pending prefill tokens / peak prefill throughput) and
a flat TPOT scaled by KV use.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from epp.datastore import EndpointSnapshot

TTFT_FEATURES = ("1", "uncached_prompt", "inflight_prefill", "waiting", "running", "kv")
TPOT_FEATURES = ("1", "running", "waiting", "kv", "inflight_requests", "inflight_decode_ktok")


def ttft_features(e: EndpointSnapshot, uncached_prompt: int) -> tuple[float, ...]:
    m = e.metrics
    return (
        1.0,
        float(uncached_prompt),
        float(e.inflight_prefill_tokens),
        float(m.waiting_queue_size),
        float(m.running_requests),
        m.kv_cache_usage,
    )


def tpot_features(e: EndpointSnapshot) -> tuple[float, ...]:
    m = e.metrics
    decode = max(0, e.inflight_tokens - e.inflight_prefill_tokens)
    return (
        1.0,
        float(m.running_requests),
        float(m.waiting_queue_size),
        m.kv_cache_usage,
        float(e.inflight_requests),
        decode / 1000.0,
    )


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


def _dot(w: Sequence[float], x: Sequence[float]) -> float:
    return sum(a * b for a, b in zip(w, x, strict=True))


def _lstsq(xs: np.ndarray, ys: np.ndarray, ridge: float) -> tuple[float, ...]:
    """Ridge least squares on standardised columns (the intercept unpenalised), so
    collinear load signals (running vs in-flight requests) give stable weights."""
    mean = xs[:, 1:].mean(axis=0)
    std = xs[:, 1:].std(axis=0)
    std[std == 0] = 1.0
    z = np.hstack([np.ones((len(xs), 1)), (xs[:, 1:] - mean) / std])
    penalty = np.sqrt(ridge * len(xs)) * np.eye(z.shape[1])
    penalty[0, 0] = 0.0
    a = np.vstack([z, penalty])
    b = np.concatenate([ys, np.zeros(z.shape[1])])
    beta, *_ = np.linalg.lstsq(a, b, rcond=None)
    w = beta[1:] / std
    intercept = beta[0] - float(np.dot(w, mean))
    return (float(intercept), *(float(v) for v in w))


def _fit_one(rows: list[tuple[tuple[float, ...], float]], min_samples: int, ridge: float):
    if len(rows) < min_samples:
        return None
    xs = np.array([r[0] for r in rows], dtype=float)
    ys = np.array([r[1] for r in rows], dtype=float)
    return _lstsq(xs, ys, ridge)


def fit(samples: Sequence[Sample], min_samples: int, ridge: float = 1e-4) -> Coefficients:
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
    by_ttft = {k: w for k, v in ttft_rows.items() if (w := _fit_one(v, min_samples, ridge))}
    by_tpot = {k: w for k, v in tpot_rows.items() if (w := _fit_one(v, min_samples, ridge))}
    ttft, tpot = _fit_one(all_ttft, min_samples, ridge), _fit_one(all_tpot, min_samples, ridge)
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
