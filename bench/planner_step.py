"""Planner step time: what one `policy.step(now, observation)` costs, per mode and load
predictor, on the observations of a real trace.

The Azure conversation trace (../shared/traces) is cut into adjustment intervals (60 s
by default); each interval becomes the `Observation` the live planner would close: its
requests' ISL/OSL (from the trace), TTFT/ITL near the profile's (TTFT 1.2 x the
synthetic profile's at the interval's mean ISL, ITL 10 ms), the pool's per-role load
(queue 2, KV 0.5 per role) and the replicas the previous decision asked for (ready).
Every policy walks the whole trace once; a step is timed with `time.process_time_ns`
(CPU of this process: the machine is shared, wall time would time the neighbours) and
with `perf_counter_ns` (wall). P/D pool; the profile is the synthetic one of
tests/planner_helpers.py (the step's cost does not depend on its numbers).

    .venv/bin/python bench/planner_step.py                       # every mode and predictor
    .venv/bin/python bench/planner_step.py --policies load,sla-constant --interval 30
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bench/predictors.py: no spinning BLAS

import argparse
import math
import statistics
import time
from pathlib import Path

from epp.planner.core.config import parse_planner_config
from epp.planner.core.perf import Profile
from epp.planner.core.planner import build_policy
from epp.planner.core.types import Observation, Replicas, Role, RoleLoad, Stats
from epp.planner.tracefile import load_trace

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "azure-llm-conv-2023.csv"
PREFILL = {
    "prefill_isl": [1000, 2000, 4000, 8000, 16000],
    "prefill_ttft": [25.0, 50.0, 100.0, 200.0, 400.0],
    "prefill_thpt_per_gpu": [40_000.0] * 5,
}
_KV, _CTX = [0.0, 0.25, 0.5, 0.75, 1.0], [500.0, 3000.0, 6000.0]
DECODE = {
    "x_kv_usage": [kv for _ in _CTX for kv in _KV],
    "y_context_length": [c for c in _CTX for _ in _KV],
    "z_itl": [5 + 20 * kv for _ in _CTX for kv in _KV],
    "z_thpt_per_gpu": [10_000.0] * (len(_KV) * len(_CTX)),
    "max_kv_tokens": [100_000],
}
ROLE_LOAD = RoleLoad(samples=60, queue_mean=2, queue_first=2, queue_last=2, kv_mean=0.5,
                     waiting_per_replica=1, running_mean=4)  # fmt: skip
# name -> (policy, extra planner-file keys)
POLICIES: dict[str, tuple[str, dict]] = {
    "load": ("load", {"mode": "load"}),
    "dynamo-arima": ("dynamo", {"mode": "dynamo", "load-predictor": "arima"}),
    "sla-constant": ("epp", {"mode": "sla", "load-predictor": "constant"}),
    "sla-kalman": ("epp", {"mode": "sla", "load-predictor": "kalman"}),
    "sla-arima": ("epp", {"mode": "sla", "load-predictor": "arima"}),
    "sla-prophet": ("epp", {"mode": "sla", "load-predictor": "prophet"}),
}


def observations(interval: float, targets: dict[Role, int], profile: Profile):
    """Yields one Observation per interval of the trace; `targets` is read each time
    (the caller updates it with each decision), so replicas follow the policy."""
    arrivals = load_trace(TRACE)
    end = arrivals[-1].t_s
    k = 0
    i = 0
    while k * interval < end:
        start, stop = k * interval, (k + 1) * interval
        mine = []
        while i < len(arrivals) and arrivals[i].t_s < stop:
            mine.append(arrivals[i])
            i += 1
        isl = [float(a.isl) for a in mine]
        mean_isl = statistics.fmean(isl) if isl else math.nan
        ttft = 1.2 * profile.prefill.ttft(mean_isl) if isl else math.nan
        n = len(mine)
        yield Observation(
            start=start,
            end=stop,
            arrivals=n,
            completions=n,
            isl=Stats.of(isl),
            osl=Stats.of([float(a.osl) for a in mine]),
            ttft_ms=Stats.of([ttft] * n),
            itl_ms=Stats.of([10.0] * n),
            duration_s=Stats.of([2.0] * n),
            cached_tokens=Stats.of([0.0] * n),
            isl_samples=tuple(int(x) for x in isl[:1024]),
            roles=dict.fromkeys(targets, ROLE_LOAD),
            replicas={r: Replicas(ready=want) for r, want in targets.items()},
        )
        k += 1


def run(name: str, interval: float, profile: Profile) -> dict[str, float]:
    policy_name, keys = POLICIES[name]
    raw = {"pool": "disaggregated", "adjustment-interval": interval, "max-gpu-budget": 64,
           "min-endpoint": 1, **keys}  # fmt: skip
    config = parse_planner_config(raw)
    policy = build_policy(policy_name, config, profile if policy_name != "load" else None)
    targets = {Role.PREFILL: 1, Role.DECODE: 1}
    cpu, wall = [], []
    for obs in observations(interval, targets, profile):
        c0, w0 = time.process_time_ns(), time.perf_counter_ns()
        decision = policy.step(obs.end, obs)
        cpu.append((time.process_time_ns() - c0) / 1e3)
        wall.append((time.perf_counter_ns() - w0) / 1e3)
        targets.update(decision.targets)
    return {
        "steps": len(cpu),
        "cpu_median_us": statistics.median(cpu),
        "cpu_p90_us": sorted(cpu)[math.ceil(0.9 * len(cpu)) - 1],
        "cpu_max_us": max(cpu),
        "wall_median_us": statistics.median(wall),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--interval", type=float, default=60.0)
    a = p.parse_args()
    profile = Profile.from_arrays(PREFILL, DECODE, "synthetic")
    print(f"trace {TRACE.name}, interval {a.interval:g} s, P/D pool; µs per step")
    print("| policy | steps | CPU median | CPU p90 | CPU max | wall median |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in a.policies.split(","):
        r = run(name, a.interval, profile)
        print(f"| {name} | {r['steps']} | {r['cpu_median_us']:,.0f} | {r['cpu_p90_us']:,.0f} | "
              f"{r['cpu_max_us']:,.0f} | {r['wall_median_us']:,.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
