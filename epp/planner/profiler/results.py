"""What `epp profile` measured, as Dynamo's arrays, and what it recommends.

Arrays and their names are those of Dynamo's interpolation files (reference
dynamo-planner.md §3.1, written by `benchmarks/profiler/utils/profile_{prefill,decode}.py`),
so `epp.planner.core.perf` and Dynamo's `perf_interpolation.py` read the same files:

- prefill: `prefill_isl`, `prefill_ttft` (ms, batch size 1),
  `prefill_thpt_per_gpu = isl / ttft_ms * 1000 / num_gpus` (tokens/s/GPU);
- decode (scattered points): `x_kv_usage = (isl + osl/2) * num_request / max_kv_tokens`,
  `y_context_length = isl + osl/2`, `z_itl` (ms), `z_thpt_per_gpu` (output tokens/s/GPU),
  `max_kv_tokens` (shape (1,)).

The recommendation follows Dynamo's profiler (§4): among the points meeting the SLA,
the best throughput per GPU; if none meets it, the lowest latency, flagged as such.
The load-planner thresholds use the May-2025 profiler's formulas (§4 "Old version",
`benchmarks/profiler/profile_sla.py` @ 3f53a78e0), which is what Dynamo's profiler prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epp.planner.profiler.plan import DecodeLoad

PREFILL_ARRAYS = ("prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu")
DECODE_ARRAYS = ("x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine configuration under test: where it is and how many GPUs it uses.
    `label` names it in the recommendation (the seed's "TP:4")."""

    url: str
    num_gpus: int = 1
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or f"TP:{self.num_gpus}"


@dataclass(frozen=True, slots=True)
class PrefillResult:
    isl: int
    ttft_ms: float
    num_gpus: int = 1
    server_ttft_ms: float | None = None  # the server's own TTFT, when it reports one

    @property
    def thpt_per_gpu(self) -> float:
        """Dynamo: `isl / ttft * 1000 / num_gpus` (attention DP = 1)."""
        return self.isl / self.ttft_ms * 1000 / self.num_gpus


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """One decode point: `load` streams, mean ITL over the steady part, and the output
    tokens per second per GPU over that part."""

    load: DecodeLoad
    itl_ms: float
    thpt_per_gpu: float
    server_itl_ms: float | None = None  # the server's own mean ITL, when it reports one


def prefill_arrays(points: Sequence[PrefillResult]) -> dict[str, np.ndarray]:
    return {
        "prefill_isl": np.array([p.isl for p in points], dtype=np.int64),
        "prefill_ttft": np.array([p.ttft_ms for p in points], dtype=np.float64),
        "prefill_thpt_per_gpu": np.array([p.thpt_per_gpu for p in points], dtype=np.float64),
    }


def decode_arrays(points: Sequence[DecodeResult], max_kv_tokens: int) -> dict[str, np.ndarray]:
    return {
        "x_kv_usage": np.array([p.load.kv_usage(max_kv_tokens) for p in points], dtype=float),
        "y_context_length": np.array([p.load.context_length for p in points], dtype=float),
        "z_itl": np.array([p.itl_ms for p in points], dtype=np.float64),
        "z_thpt_per_gpu": np.array([p.thpt_per_gpu for p in points], dtype=np.float64),
        "max_kv_tokens": np.array([max_kv_tokens], dtype=np.int64),
    }


def json_ready(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The JSON fallback (`prefill_raw_data.json`, `decode_raw_data.json`): the same
    keys as lists, `max_kv_tokens` a scalar int (as Dynamo's ConfigMap)."""
    out: dict[str, Any] = {k: v.tolist() for k, v in arrays.items()}
    if "max_kv_tokens" in out:
        out["max_kv_tokens"] = int(arrays["max_kv_tokens"][0])
    return out


# ------------------------------------------------------------------ recommendation


@dataclass(frozen=True, slots=True)
class Candidate:
    """One endpoint's phase-A results at the target ISL/OSL."""

    endpoint: Endpoint
    max_kv_tokens: int
    prefill: PrefillResult
    decode: tuple[DecodeResult, ...]


@dataclass(frozen=True, slots=True)
class Pick:
    """The chosen endpoint for one role, the point it was chosen at, and whether that
    point meets the SLA (if not, it is the lowest-latency point: Dynamo's fallback)."""

    candidate: Candidate
    latency_ms: float
    thpt_per_gpu: float
    meets_sla: bool
    num_request: int = 1


def pick_prefill(candidates: Sequence[Candidate], ttft_ms: float) -> Pick:
    """Best `thpt_per_gpu` with `ttft <= ttft_ms`; else the lowest TTFT."""
    if not candidates:
        raise ValueError("no candidates to pick from")
    ok = [c for c in candidates if c.prefill.ttft_ms <= ttft_ms]
    if ok:
        best = max(ok, key=lambda c: c.prefill.thpt_per_gpu)
    else:
        best = min(candidates, key=lambda c: c.prefill.ttft_ms)
    return Pick(best, best.prefill.ttft_ms, best.prefill.thpt_per_gpu, bool(ok))


def pick_decode(candidates: Sequence[Candidate], itl_ms: float) -> Pick:
    """Best `thpt_per_gpu` over every (endpoint, in-flight count) with `itl <= itl_ms`;
    else the lowest ITL."""
    points = [(c, p) for c in candidates for p in c.decode]
    if not points:
        raise ValueError("no decode points to pick from")
    ok = [(c, p) for c, p in points if p.itl_ms <= itl_ms]
    if ok:
        c, p = max(ok, key=lambda cp: cp[1].thpt_per_gpu)
    else:
        c, p = min(points, key=lambda cp: cp[1].itl_ms)
    return Pick(c, p.itl_ms, p.thpt_per_gpu, bool(ok), p.load.num_request)


@dataclass(frozen=True, slots=True)
class Bounds:
    upper: float
    lower: float


def prefill_queue_bounds(ttft_sla_ms: float, ttft_ms: float) -> Bounds:
    """`upper = max(0.1, sla*1.2/ttft - 1)`, `lower = max(0.1, sla*0.8/ttft - 1)`:
    the queue (in requests per prefill engine) that still leaves the SLA a 20 % margin."""
    return Bounds(
        max(0.1, ttft_sla_ms * 1.2 / ttft_ms - 1), max(0.1, ttft_sla_ms * 0.8 / ttft_ms - 1)
    )


def decode_kv_bounds(num_request: int, isl: int, osl: int, max_kv_tokens: int) -> Bounds:
    """`util = n * (isl + osl/2) / kv_size`; `upper = min(1, util + 0.2)`,
    `lower = max(0.1, util - 0.2)`."""
    util = num_request * (isl + osl / 2) / max_kv_tokens
    return Bounds(min(1.0, util + 0.2), max(0.1, util - 0.2))


@dataclass(frozen=True, slots=True)
class Recommendation:
    prefill: Pick
    decode: Pick
    prefill_queue: Bounds
    decode_kv: Bounds
    ttft_sla_ms: float
    itl_sla_ms: float

    @property
    def meets_sla(self) -> bool:
        return self.prefill.meets_sla and self.decode.meets_sla

    def lines(self) -> list[str]:
        """The seed's four lines, then the planner flags they translate to."""
        p, d = self.prefill, self.decode
        out = []
        if not p.meets_sla:
            out.append(
                f"No engine configuration satisfies the TTFT requirement ({self.ttft_sla_ms:g}"
                " ms); suggesting the lowest TTFT"
            )
        out += [
            f"Suggested prefill {p.candidate.endpoint.name} (TTFT {p.latency_ms:.2f} ms,"
            f" throughput {p.thpt_per_gpu:.2f} tokens/s/GPU)",
            "Suggested planner upper/lower bound for prefill queue size:"
            f" {self.prefill_queue.upper:.2f}/{self.prefill_queue.lower:.2f}",
        ]
        if not d.meets_sla:
            out.append(
                f"No engine configuration satisfies the ITL requirement ({self.itl_sla_ms:g}"
                " ms); suggesting the lowest ITL"
            )
        out += [
            f"Suggested decode {d.candidate.endpoint.name} (ITL {d.latency_ms:.2f} ms,"
            f" throughput {d.thpt_per_gpu:.2f} tokens/s/GPU)",
            "Suggested planner upper/lower bound for decode kv cache utilization:"
            f" {self.decode_kv.upper:.2f}/{self.decode_kv.lower:.2f}",
            "Planner flags: " + " ".join(f"--{k} {v}" for k, v in self.planner_flags().items()),
        ]
        return out

    def planner_flags(self) -> dict[str, str]:
        """Dynamo's option names for the values above."""
        return {
            "prefill-engine-num-gpu": str(self.prefill.candidate.endpoint.num_gpus),
            "decode-engine-num-gpu": str(self.decode.candidate.endpoint.num_gpus),
            "prefill-queue-scale-up-threshold": f"{self.prefill_queue.upper:.2f}",
            "prefill-queue-scale-down-threshold": f"{self.prefill_queue.lower:.2f}",
            "decode-kv-scale-up-threshold": f"{self.decode_kv.upper:.2f}",
            "decode-kv-scale-down-threshold": f"{self.decode_kv.lower:.2f}",
        }


def recommend(
    candidates: Sequence[Candidate], *, ttft_ms: float, itl_ms: float, isl: int, osl: int
) -> Recommendation:
    p = pick_prefill(candidates, ttft_ms)
    d = pick_decode(candidates, itl_ms)
    return Recommendation(
        prefill=p,
        decode=d,
        prefill_queue=prefill_queue_bounds(ttft_ms, p.latency_ms),
        decode_kv=decode_kv_bounds(d.num_request, isl, osl, d.candidate.max_kv_tokens),
        ttft_sla_ms=ttft_ms,
        itl_sla_ms=itl_ms,
    )


# The share of the ITL target one step with a long prompt's chunk may take: the rest is
# for the decoding batch that shares the step. Chosen on ServeGen day 0 (language
# m-small, hours 4-16, 70B-4xH100 preset, 500/50 ms SLA, the planner's defaults): of
# chunks of 128, 256 and 512 tokens (shares 0.44, 0.71 and 1.26 there), 128 alone met
# both of its targets (99.49 % of requests, worst 5 minutes 95.8 %; 256: 99.46 / 94.5,
# 512: 98.99 / 89.9, no threshold: 98.68 / 88.6).
CHUNK_ITL_SHARE = 0.44


def long_prefill_threshold(
    points: Sequence[PrefillResult], itl_ms: float, share: float = CHUNK_ITL_SHARE
) -> int | None:
    """vLLM's `--long-prefill-token-threshold` for an ITL target: the largest prompt
    chunk whose step fits in `share` of it, from a straight line through the prefill
    sweep (TTFT = step cost + per-token cost x ISL). With it, a long prompt is chunked
    thin and every request decoding beside it keeps its pace (Sarathi-Serve's token
    budget from the TBT SLO, Agrawal et al., OSDI 2024); without it one long prompt's
    8k-token steps pass the ITL target of every request in its batch. None when the
    sweep has fewer than two lengths or even a one-token step overruns the share."""
    isl = np.array([p.isl for p in points], dtype=np.float64)
    ttft = np.array([p.ttft_ms for p in points], dtype=np.float64)
    if len(np.unique(isl)) < 2:
        return None
    per_token, fixed = np.polyfit(isl, ttft, 1)
    if not per_token > 0:
        return None
    tokens = math.floor((share * itl_ms - fixed) / per_token + 1e-9)  # the fit is exact to 1e-9
    return tokens if tokens >= 1 else None


def comparison_table(candidates: Sequence[Candidate], *, ttft_ms: float, itl_ms: float) -> str:
    """One row per endpoint: its TTFT at the target ISL, and its best decode point
    within the ITL SLA (or its lowest ITL, marked `-`)."""
    header = (
        f"{'endpoint':<10} {'gpus':>4} {'TTFT ms':>9} {'prefill tok/s/GPU':>18} "
        f"{'in-flight':>9} {'ITL ms':>8} {'decode tok/s/GPU':>17}  url"
    )
    rows = [header]
    for c in candidates:
        ok = [p for p in c.decode if p.itl_ms <= itl_ms]
        best = (
            max(ok, key=lambda p: p.thpt_per_gpu) if ok else min(c.decode, key=lambda p: p.itl_ms)
        )
        t_mark = "" if c.prefill.ttft_ms <= ttft_ms else "-"
        i_mark = "" if ok else "-"
        rows.append(
            f"{c.endpoint.name:<10} {c.endpoint.num_gpus:>4} "
            f"{t_mark + format(c.prefill.ttft_ms, '.2f'):>9} {c.prefill.thpt_per_gpu:>18.2f} "
            f"{best.load.num_request:>9} {i_mark + format(best.itl_ms, '.2f'):>8} "
            f"{best.thpt_per_gpu:>17.2f}  {c.endpoint.url}"
        )
    return "\n".join(rows)
