"""LOAD-v0: Dynamo's threshold planner as Dynamo's planner documents it (reference §5,
`examples/llm/components/planner.py` @3f53a78e0).

Every adjustment interval, from the load samples taken every `metric-pulling-interval`:

- prefill: mean queue per prefill replica (`queue_mean / ready`) against
  `prefill-queue-scale-{up,down}-threshold` (0.5 / 0.2);
- decode (and an aggregated pool, which "scales on the decode rule"): mean KV use plus
  2 % per waiting request per replica (`kv_mean + 0.02 × waiting_per_replica`, the
  hard-coded estimate of upstream's `kv_load + 0.02 * num_requests_waiting`) against
  `decode-kv-scale-{up,down}-threshold` (0.9 / 0.5);
- at most ±1 replica per role per interval; scale-downs first, then prefill up (queueing
  in prefill also raises decode KV), then decode up;
- a scale-up is allowed only if it fits `max-gpu-budget` (the budget is checked on
  scale-up only, as upstream; the wrapper's `fit_budget` still guarantees it);
- `NEW_DECODE_WORKER_GRACE_PERIOD` = 3: after a decode scale-up no decode scale-down.
  Upstream sets the counter to 3 and decrements it in the same adjustment, so the
  block covers the next 2 evaluated intervals; kept as is;
- `NEW_PREFILL_WORKER_QUEUE_BUFFER_PERIOD` = 3: prefill is added only if the queue's
  trend over the interval, `last + (last - first) × 3`, stays above the up threshold
  (raw queue samples against a per-replica threshold, as upstream);
- "workers changed" → no adjustment: upstream's adjustment is blocking, so it never
  decides while a replica starts or drains, and skips an interval whose replica count
  changed under it. Here: no adjustment while any replica is starting or draining, or
  when the ready count differs from the previous interval's. A skipped interval does
  not count down the grace period (upstream returns before the decrement).

Adaptation: upstream never had zero replicas. With `min-endpoint: 0`, a role with no
ready replica adds one when requests arrive or wait (there is no KV use to compare).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from epp.planner.core.config import PlannerConfig
from epp.planner.core.mode import Proposal, current
from epp.planner.core.types import Observation, Role

NEW_DECODE_WORKER_GRACE_PERIOD = 3
NEW_PREFILL_WORKER_QUEUE_BUFFER_PERIOD = 3
KV_PER_WAITING_REQUEST = 0.02


class LoadMode:
    name = "load"

    def __init__(self, config: PlannerConfig) -> None:
        self._t = config.load
        self._b = config.budget
        self._roles = config.roles
        self._gpus = config.budget.gpus_per_replica()
        self._decode = Role.AGGREGATED if config.planner.pool == "aggregated" else Role.DECODE
        self._grace = 0
        self._last_ready: dict[Role, int] | None = None
        self._evaluated = False

    @property
    def grace_remaining(self) -> int:
        return self._grace

    def propose(self, now: float, obs: Observation) -> Proposal:
        cur = current(obs, self._roles)
        ready = {r: obs.replicas_of(r).ready for r in self._roles}
        moving = sum(obs.replicas_of(r).starting + obs.replicas_of(r).draining for r in self._roles)
        changed = self._last_ready is not None and ready != self._last_ready
        self._last_ready = ready
        self._evaluated = False
        if moving or changed:
            why = "replicas starting or draining" if moving else "ready replicas changed"
            return Proposal(cur, f"workers changed during the interval ({why}): no adjustment")
        self._evaluated = True
        targets = dict(ready)
        gpus = sum(ready[r] * self._gpus[r] for r in self._roles)
        notes: list[str] = []
        diag: dict[str, float] = {"decode_grace_remaining": float(self._grace)}

        prefill = Role.PREFILL if Role.PREFILL in self._roles else None
        queue = math.nan
        if prefill is not None:
            queue = self._per_replica_queue(obs, ready[prefill])
            diag["avg_prefill_queue"] = queue
        kv = self._kv_load(obs, ready[self._decode])
        diag["avg_kv_load"] = kv

        # 1. scale-downs
        t = self._t
        down_p = t.prefill_queue_scale_down_threshold
        if prefill is not None and queue < down_p and ready[prefill] > self._b.min_endpoint:
            targets[prefill] -= 1
            gpus -= self._gpus[prefill]
            notes.append(f"prefill queue {queue:.2f}/replica < {down_p}: -1")
        if kv < t.decode_kv_scale_down_threshold and ready[self._decode] > self._b.min_endpoint:
            if self._grace > 0:
                notes.append(f"{self._decode.value} KV {kv:.2f} low but grace {self._grace}: hold")
            else:
                targets[self._decode] -= 1
                gpus -= self._gpus[self._decode]
                notes.append(
                    f"{self._decode.value} KV {kv:.2f} < {t.decode_kv_scale_down_threshold}: -1"
                )
        # 2. scale-ups, prefill first
        if prefill is not None and queue > t.prefill_queue_scale_up_threshold:
            if self._fits(gpus, prefill):
                role = obs.role(prefill)
                trend = role.queue_last + (
                    (role.queue_last - role.queue_first) * NEW_PREFILL_WORKER_QUEUE_BUFFER_PERIOD
                )
                if ready[prefill] == 0 or trend > t.prefill_queue_scale_up_threshold:
                    targets[prefill] += 1
                    gpus += self._gpus[prefill]
                    notes.append(
                        f"prefill queue {queue:.2f}/replica > "
                        f"{t.prefill_queue_scale_up_threshold}, trend {trend:.2f}: +1"
                    )
                else:
                    notes.append(f"prefill queue trend {trend:.2f} falls under threshold: hold")
                diag["predicted_prefill_queue"] = trend
            else:
                notes.append("prefill scale-up would exceed max-gpu-budget: hold")
        if kv > t.decode_kv_scale_up_threshold:
            if self._fits(gpus, self._decode):
                targets[self._decode] += 1
                gpus += self._gpus[self._decode]
                notes.append(
                    f"{self._decode.value} KV {kv:.2f} > {t.decode_kv_scale_up_threshold}: +1"
                )
            else:
                notes.append(f"{self._decode.value} scale-up would exceed max-gpu-budget: hold")
        reason = "; ".join(notes) if notes else "load within thresholds"
        return Proposal(targets, reason, diagnostics=diag)

    def committed(self, targets: Mapping[Role, int], obs: Observation) -> None:
        if not self._evaluated:
            return
        if targets.get(self._decode, 0) > obs.replicas_of(self._decode).ready:
            self._grace = NEW_DECODE_WORKER_GRACE_PERIOD
        if self._grace > 0:
            self._grace -= 1

    def _fits(self, gpus: int, role: Role) -> bool:
        budget = self._b.max_gpu_budget
        return budget is None or gpus + self._gpus[role] <= budget

    @staticmethod
    def _per_replica_queue(obs: Observation, ready: int) -> float:
        q = obs.role(Role.PREFILL).queue_mean
        if math.isnan(q):
            return math.nan  # no sample: no prefill decision (NaN compares False)
        if ready == 0:
            return math.inf if q > 0 or obs.arrivals > 0 else 0.0
        return q / ready

    def _kv_load(self, obs: Observation, ready: int) -> float:
        load = obs.role(self._decode)
        if ready == 0:
            waiting = load.queue_mean if not math.isnan(load.queue_mean) else 0.0
            return math.inf if waiting > 0 or obs.arrivals > 0 else 0.0
        if math.isnan(load.kv_mean):
            return math.nan
        waiting = 0.0 if math.isnan(load.waiting_per_replica) else load.waiting_per_replica
        return load.kv_mean + KV_PER_WAITING_REQUEST * waiting
