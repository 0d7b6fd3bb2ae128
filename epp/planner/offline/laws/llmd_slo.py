"""`llm-d-slo`: llm-d's SLO-aware KEDA control law on the EPP's latency.

Source: `llm-d/llm-d` `guides/workload-autoscaling/README.slo-aware.md` (reference
autoscalers.md §2, "Replacement path"). Every 15 s (`interval_s`, the recording rules'
evaluation):

1. signal: `s_raw = max(p90 TTFT / S_ttft, p90 TPOT / S_tpot)`, each p90 over the last
   minute of requests (`histogram_quantile(0.9, rate(...[1m]))`; the guide prefers the
   EPP's predicted latency and falls back to measured: the replay has measured only);
   NaN / no traffic -> 0; clamped at `C = 2.0`; `s` = the mean of the clamped values
   over 45 s (`avg_over_time[45s]`: this evaluation and the two before it);
2. desired: with `n` provisioned (ready + starting) and `r` ready replicas, credit
   `c = r/n` when `0 < r < n`, else 1:
   `s > 0.55`: `d = n + ceil(n·(s·c/0.55 − 1))`; `s < 0.40`: `d = n − floor(n·(1 − s/0.40))`
   (uncredited); in between, `d = n` (the hysteresis band);
3. HPA: `d` is the ScaledObject's composite metric with an `AverageValue` target of 1,
   so the HPA's 10 % tolerance applies to `d/n` (`hpa.desired_for_average`), then the
   guide's behaviour: up at most max(+100 %, +4 pods) per 60 s with a 30 s stabilization
   window, down at most 1 pod per 120 s with a 180 s window; then [min, max] replicas
   (the guide's benchmark used 3..8; here min 1 like the other policies, max the
   comparison's budget).

P/D: the guide lists "TTFT would drive prefill and TPOT decode" as future work; this law
does it: a prefill role's signal is the TTFT term alone, a decode role's the TPOT term
alone, an aggregated pool's the max of both; each role has its own HPA.

The p90 is nearest-rank over the requests that completed in the last minute (the
Observation's per-request samples), not interpolated within histogram buckets.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from epp.config.params import param
from epp.planner.core.types import Decision, Observation, Role, Stats
from epp.planner.offline.laws.hpa import (
    TOLERANCE,
    Behavior,
    Hpa,
    RatePolicy,
    Rules,
    desired_for_average,
)

NAME = "llm-d-slo"

BEHAVIOR = Behavior(
    up=Rules(30.0, (RatePolicy("percent", 100, 60.0), RatePolicy("pods", 4, 60.0))),
    down=Rules(180.0, (RatePolicy("pods", 1, 120.0),)),
)


@dataclass(frozen=True, slots=True)
class LlmdSloParams:
    ttft_slo_ms: float = param(3000.0, min=1e-9, doc="S_ttft (the guide's benchmark: 3 s)")
    tpot_slo_ms: float = param(100.0, min=1e-9, doc="S_tpot (the guide's benchmark: 100 ms)")
    evaluation_interval_s: float = param(15.0, min=1e-9, doc="recording-rule evaluation, s")
    quantile_window_s: float = param(60.0, min=1e-9, doc="the p90's rate window, s")
    smoothing_s: float = param(45.0, min=1e-9, doc="avg_over_time window, s")
    clamp: float = param(2.0, min=1e-9, doc="C: cap on one sample of the signal")
    theta_up: float = param(0.55, min=1e-9, doc="scale up above")
    theta_down: float = param(0.40, min=1e-9, doc="scale down below")
    min_replicas: int = param(1, min=1, doc="minReplicaCount (the guide's benchmark: 3)")
    max_replicas: int = param(100, min=1, doc="maxReplicaCount (the guide's benchmark: 8)")
    tolerance: float = param(TOLERANCE, min=0, doc="the HPA controller's tolerance")


def law(n: int, ready: int, s: float, theta_up: float, theta_down: float) -> int:
    """Step 2: the desired replicas for smoothed signal `s` (before the HPA)."""
    if n <= 0:
        return 0
    if s > theta_up:
        c = ready / n if 0 < ready < n else 1.0
        return n + math.ceil(n * (s * c / theta_up - 1.0))
    if s < theta_down:
        return n - math.floor(n * (1.0 - s / theta_down))
    return n


class LlmdSlo:
    """The guide's law as a `types.Policy`, one HPA per role."""

    name = NAME
    sample_interval_s = 1.0

    def __init__(
        self,
        params: LlmdSloParams | None = None,
        roles: Sequence[Role] = (Role.AGGREGATED,),
    ) -> None:
        self.params = p = params or LlmdSloParams()
        if p.min_replicas > p.max_replicas:
            raise ValueError(
                f"llm-d-slo: min_replicas {p.min_replicas} > max_replicas {p.max_replicas}"
            )
        if not p.theta_down < p.theta_up < p.clamp:
            raise ValueError("llm-d-slo needs theta_down < theta_up < clamp")
        self.roles = tuple(roles)
        self.interval_s = p.evaluation_interval_s
        self._hpa = {r: Hpa(BEHAVIOR, p.min_replicas, p.max_replicas) for r in self.roles}
        keep = max(1, math.ceil(p.quantile_window_s / p.evaluation_interval_s - 1e-9))
        self._recent: deque[Observation] = deque(maxlen=keep)
        points = max(1, math.ceil(p.smoothing_s / p.evaluation_interval_s - 1e-9))
        self._signal: dict[Role, deque[float]] = {r: deque(maxlen=points) for r in self.roles}

    def step(self, now: float, obs: Observation) -> Decision:
        p = self.params
        self._recent.append(obs)
        ttft = Stats.of([v for o in self._recent for v in o.ttft_ms_samples]).p90
        tpot = Stats.of([v for o in self._recent for v in o.itl_ms_samples]).p90
        terms = {"ttft": _ratio(ttft, p.ttft_slo_ms), "tpot": _ratio(tpot, p.tpot_slo_ms)}
        targets: dict[Role, int] = {}
        notes: list[str] = []
        diag: dict[str, float] = {"p90_ttft_ms": ttft, "p90_tpot_ms": tpot}
        for role in self.roles:
            raw = _raw(role, terms)
            window = self._signal[role]
            window.append(min(raw, p.clamp))
            s = math.fsum(window) / len(window)
            rep = obs.replicas_of(role)
            n = rep.active
            d = law(n, rep.ready, s, p.theta_up, p.theta_down)
            if n == 0:
                target = p.min_replicas  # below the HPA's floor: it restores it at once
            else:
                wanted = desired_for_average(n, float(d), 1.0, p.tolerance)
                target = self._hpa[role].normalize(now, n, wanted)
                self._hpa[role].record(now, n, target)
            targets[role] = target
            diag[f"s_{role.value}"] = s
            notes.append(f"{role.value}: s {s:.3f} (raw {raw:.3f}), n {n}, law {d}, set {target}")
        return Decision(at=now, targets=targets, reason="; ".join(notes), diagnostics=diag)


def _ratio(p90: float, slo: float) -> float:
    return 0.0 if math.isnan(p90) else p90 / slo


def _raw(role: Role, terms: dict[str, float]) -> float:
    if role is Role.PREFILL:
        return terms["ttft"]
    if role is Role.DECODE:
        return terms["tpot"]
    return max(terms["ttft"], terms["tpot"])
