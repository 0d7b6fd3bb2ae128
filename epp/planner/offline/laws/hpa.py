"""The Kubernetes HorizontalPodAutoscaler's arithmetic, which every KEDA law ends in.

KEDA only computes a metric; the HPA it generates turns the metric into replicas.
Ported from `kubernetes/pkg/controller/podautoscaler` (autoscaling/v2):

- `replica_calculator.go` `GetExternalPerPodMetricReplicas` (a KEDA trigger is an
  External metric, `AverageValue` by default): `ratio = metric / (target × current)`;
  when `|ratio − 1| ≤ tolerance` (the controller's `--horizontal-pod-autoscaler-tolerance`,
  default 0.1) the count stays, else `desired = ceil(metric / target)`
  (= `ceil(current × per-replica average / target)`). `current` is the scale's replica
  count, not-yet-ready pods included: here ready + starting.
- `horizontal.go` `normalizeDesiredReplicasWithBehaviors`: first
  `stabilizeRecommendationWithBehaviors` (a scale-up goes no higher than the *lowest*
  recommendation within the scale-up window; a scale-down no lower than the *highest*
  within the scale-down window; the raw recommendation is recorded; an HPA with no
  history starts with one recommendation of the current count, so it never scales down
  within its first window: `maybeInitScaleDownStabilizationWindow`), then
  `convertDesiredReplicasWithBehaviorRate`: each rate policy allows, from the count at the
  start of its period (`current − added + removed` within the last `period_s`),
  `+value` pods or `×(1 + value %)` rounded up when going up, `−value` pods or
  `×(1 − value %)` truncated when going down; `select: max` takes the policy allowing
  the largest change, `min` the smallest; then `[min, max]` replicas.
- `DEFAULT_BEHAVIOR`: the HPA's defaults when a ScaledObject sets no `behavior`
  (Kubernetes docs "Horizontal Pod Autoscaling", Default Behavior): up with no window,
  at most max(+100 %, +4 pods) per 15 s; down after a 300 s window, up to 100 % per 15 s.

Time is given by the caller (`now`, seconds); "within the last p seconds" is strictly
after `now − p`, as Go's `timestamp.After(cutoff)`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

TOLERANCE = 0.1


@dataclass(frozen=True, slots=True)
class RatePolicy:
    """`HPAScalingPolicy`: at most `value` pods (`kind="pods"`) or `value` percent
    (`kind="percent"`) of change per `period_s`."""

    kind: Literal["pods", "percent"]
    value: int
    period_s: float

    def __post_init__(self) -> None:
        if self.kind not in ("pods", "percent"):
            raise ValueError(f"rate policy kind must be 'pods' or 'percent', got {self.kind!r}")
        if self.value < 0 or not self.period_s > 0:
            raise ValueError("a rate policy needs value >= 0 and period_s > 0")


@dataclass(frozen=True, slots=True)
class Rules:
    """`HPAScalingRules` for one direction."""

    stabilization_s: float
    policies: tuple[RatePolicy, ...]
    select: Literal["max", "min"] = "max"


@dataclass(frozen=True, slots=True)
class Behavior:
    up: Rules
    down: Rules


DEFAULT_BEHAVIOR = Behavior(
    up=Rules(0.0, (RatePolicy("pods", 4, 15.0), RatePolicy("percent", 100, 15.0))),
    down=Rules(300.0, (RatePolicy("percent", 100, 15.0),)),
)


def desired_for_average(
    current: int, metric: float, target: float, tolerance: float = TOLERANCE
) -> int:
    """The replica calculator for an `AverageValue` target: `metric` is the total
    (the per-replica average × `current`). `current` must be >= 1: at 0 replicas the HPA
    is idle and KEDA alone activates the workload."""
    if current < 1:
        raise ValueError("the HPA computes from at least one replica")
    ratio = metric / (target * current)
    if abs(1.0 - ratio) <= tolerance:
        return current
    return math.ceil(metric / target)


class Hpa:
    """One HPA's memory (recommendations and scale events) and its normalization."""

    def __init__(self, behavior: Behavior, min_replicas: int, max_replicas: int) -> None:
        if not 1 <= min_replicas <= max_replicas:
            raise ValueError(
                f"HPA bounds need 1 <= min <= max replicas, got {min_replicas}..{max_replicas}"
            )
        self.behavior = behavior
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self._recs: deque[tuple[float, int]] = deque()
        self._ups: deque[tuple[float, int]] = deque()
        self._downs: deque[tuple[float, int]] = deque()

    def normalize(self, now: float, current: int, desired: int) -> int:
        """The replica count the HPA sets, given the calculator's `desired`."""
        if current > self.max_replicas or current < self.min_replicas:
            # `reconcileAutoscaler`: out of bounds, the HPA goes to the bound at once.
            return min(max(current, self.min_replicas), self.max_replicas)
        if not self._recs and self.behavior.down.stabilization_s > 0:
            self._recs.append((now, current))
        longest = max((p.period_s for r in (self.behavior.up, self.behavior.down)
                       for p in r.policies), default=0.0)  # fmt: skip
        for events in (self._ups, self._downs):
            while events and events[0][0] <= now - longest:
                events.popleft()
        stabilized = self._stabilize(now, current, desired)
        return self._rate_limit(now, current, stabilized)

    def record(self, now: float, before: int, after: int) -> None:
        """A change the HPA made (`storeScaleEvent`): the rate policies count it."""
        if after > before:
            self._ups.append((now, after - before))
        elif after < before:
            self._downs.append((now, before - after))

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        b = self.behavior
        up_cut, down_cut = now - b.up.stabilization_s, now - b.down.stabilization_s
        up, down = desired, desired
        for at, rec in self._recs:
            if at > up_cut:
                up = min(up, rec)
            if at > down_cut:
                down = max(down, rec)
        oldest = min(up_cut, down_cut)
        while self._recs and self._recs[0][0] <= oldest:
            self._recs.popleft()
        self._recs.append((now, desired))
        return min(max(current, up), down)

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            limit = max(current, self._limit(now, current, self.behavior.up, up=True))
            return min(desired, limit, self.max_replicas)
        if desired < current:
            limit = min(current, self._limit(now, current, self.behavior.down, up=False))
            return max(desired, limit, self.min_replicas)
        return min(max(desired, self.min_replicas), self.max_replicas)

    def _limit(self, now: float, current: int, rules: Rules, *, up: bool) -> int:
        proposals = []
        for p in rules.policies:
            added = _within(self._ups, now, p.period_s)
            removed = _within(self._downs, now, p.period_s)
            start = current - added + removed
            if p.kind == "pods":
                proposals.append(start + p.value if up else start - p.value)
            elif up:
                proposals.append(math.ceil(start * (1 + p.value / 100)))
            else:
                proposals.append(int(start * (1 - p.value / 100)))
        if not proposals:
            return current
        # "max" picks the policy allowing the largest change: the highest limit going
        # up, the lowest going down; "min" the reverse.
        widest = (rules.select == "max") == up
        return max(proposals) if widest else min(proposals)


def _within(events: deque[tuple[float, int]], now: float, period_s: float) -> int:
    cut = now - period_s
    return sum(n for at, n in events if at > cut)
