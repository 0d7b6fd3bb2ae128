"""`keda-queue`: the vLLM production-stack recipe, KEDA on the waiting-request queue.

Source: `vllm-project/production-stack` `docs/source/use_cases/autoscaling-keda.rst`
(chart >= 0.1.9; reference autoscalers.md §5): a Prometheus trigger on
`vllm:num_requests_waiting` with `threshold: '5'` (KEDA's default `metricType`
`AverageValue`: 5 waiting requests per replica), `pollingInterval: 15`,
`cooldownPeriod: 360`, `minReplicaCount: 1`; scale-to-zero with `minReplicaCount: 0`
plus the keep-alive trigger `sum(rate(vllm:num_incoming_requests_total[1m]) > bool 0)`.
The recipe sets no HPA `behavior`, so the HPA's defaults apply (`hpa.DEFAULT_BEHAVIOR`).

Every 15 s (`interval_s`), on the queue read at that instant (the last pool sample:
Prometheus' latest value):

- at >= 1 replica, the HPA: `desired = ceil(current × per-replica waiting / 5)`
  unless within the 10 % tolerance (`hpa.desired_for_average`), then the default
  behaviour: scale-up at once (+100 % or +4 pods per 15 s, whichever is more),
  scale-down only to the highest recommendation of the last 300 s;
- `cooldownPeriod` is KEDA's, and KEDA applies it only to the step to zero (KEDA
  ScaledObject spec: "the period to wait after the last trigger reported active before
  scaling the resource back to 0"); between 1 and N replicas the HPA's 300 s window is
  what delays a scale-down. The recipe's prose ("wait 360 seconds before scaling down
  after scaling up") describes more than KEDA does; this law does what KEDA does. So with
  `min_replicas=1` (the recipe's default) the 360 s never acts;
- with `min_replicas=0`: at zero replicas, KEDA activates (to 1) when a trigger is
  active (queue > 0, or a request arrived in the last minute: the keep-alive trigger;
  activation thresholds 0); at >= 1, it scales to 0 once no trigger has been active for
  more than 360 s. Adaptation: at zero replicas there is no vLLM to export either
  metric, so the replay reads them from the EPP (requests it holds for the pool, and its
  arrivals), as a gateway-side metric would provide.

`max_replicas` is the HPA's `maxReplicaCount` (KEDA's default 100; the recipe's
example 3; the replay passes the comparison's GPU budget).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from epp.config.params import param
from epp.planner.core.types import Decision, Observation, Role
from epp.planner.offline.laws.hpa import DEFAULT_BEHAVIOR, TOLERANCE, Hpa, desired_for_average

NAME = "keda-queue"
KEEPALIVE_WINDOW_S = 60.0  # rate(...[1m])


@dataclass(frozen=True, slots=True)
class KedaQueueParams:
    target: float = param(5.0, min=1e-9, doc="waiting requests per replica (trigger threshold)")
    polling_interval_s: float = param(15.0, min=1e-9, doc="KEDA pollingInterval, s")
    cooldown_period_s: float = param(360.0, min=0, doc="KEDA cooldownPeriod (to zero only), s")
    min_replicas: int = param(1, min=0, doc="minReplicaCount; 0 = scale to zero + keep-alive")
    max_replicas: int = param(100, min=1, doc="maxReplicaCount")
    tolerance: float = param(TOLERANCE, min=0, doc="the HPA controller's tolerance")


class KedaQueue:
    """The recipe as a `types.Policy` for one role (an aggregated pool by default)."""

    name = NAME
    sample_interval_s = 1.0

    def __init__(self, params: KedaQueueParams | None = None, role: Role = Role.AGGREGATED) -> None:
        self.params = p = params or KedaQueueParams()
        if p.min_replicas > p.max_replicas:
            raise ValueError(
                f"keda-queue: min_replicas {p.min_replicas} > max_replicas {p.max_replicas}"
            )
        self.role = role
        self.interval_s = p.polling_interval_s
        self._hpa = Hpa(DEFAULT_BEHAVIOR, max(1, p.min_replicas), p.max_replicas)
        self._arrivals: deque[tuple[float, int]] = deque()  # (interval end, arrivals)
        self._last_active: float | None = None

    def step(self, now: float, obs: Observation) -> Decision:
        p = self.params
        current = obs.replicas_of(self.role).active
        waiting = obs.role(self.role).queue_last
        waiting = 0.0 if math.isnan(waiting) else waiting
        self._arrivals.append((obs.end, obs.arrivals))
        while self._arrivals and self._arrivals[0][0] <= now - KEEPALIVE_WINDOW_S:
            self._arrivals.popleft()
        keepalive = any(n > 0 for _, n in self._arrivals)
        active = waiting > 0 or (p.min_replicas == 0 and keepalive)
        if active:
            self._last_active = now
        diag = {"waiting": waiting, "per_replica": waiting / current if current else math.nan}

        if current == 0:
            target = 1 if active else 0
            why = "a trigger is active: activate to 1" if active else "no trigger active: stay at 0"
            return self._decide(now, 0, target, f"0 replicas, {why}", diag)
        desired = desired_for_average(current, waiting, p.target, p.tolerance)
        target = self._hpa.normalize(now, current, desired)
        why = (
            f"{waiting:g} waiting over {current} = {waiting / current:.2f}/replica vs "
            f"{p.target:g}: HPA wants {desired}, sets {target}"
        )
        if p.min_replicas == 0 and not active:
            idle_for = math.inf if self._last_active is None else now - self._last_active
            if idle_for > p.cooldown_period_s:
                target = 0
                why += f"; no trigger active for more than {p.cooldown_period_s:g} s: to 0"
        return self._decide(now, current, target, why, diag)

    def _decide(
        self, now: float, current: int, target: int, why: str, diag: dict[str, float]
    ) -> Decision:
        if current >= 1 and target >= 1:
            self._hpa.record(now, current, target)
        diag["desired"] = float(target)
        return Decision(at=now, targets={self.role: target}, reason=why, diagnostics=diag)
