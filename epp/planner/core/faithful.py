"""Dynamo SLA-v1 reproduced, warts included: the baseline this project must beat.

Frozen on purpose: when `sla_mode` improves, this file does not. Each step follows
`planner_core.py` @0d5c8dfc4 (reference §1.2-§1.6):

1. Observe the interval's *averages* (TTFT, ITL, ISL, OSL, request duration) and the
   request count. Dynamo's count is `increase(requests_total)`, a completion counter,
   so it is `obs.completions` here (not the admitted demand, #11693).
2. Feed the three predictors *before* the validity check, NaN as 0 (§1.2 step 2.5).
3. No traffic: if TTFT, ITL, ISL or OSL is NaN (no request completed), skip the whole
   interval: nothing is scaled, not even down (#6985).
4. Correction factors unless `no-correction`: `p = ttft / ttft_profile(isl)`;
   `d = itl / itl_profile(concurrency, isl + osl/2)` with the concurrency per decode
   replica from Little's law, `num_req / num_d × duration / interval` (§1.4). No
   smoothing, no clamp; each interval's factors come from that interval alone.
5. Predict one interval ahead and size (§1.5):
   `num_p = ceil(req × isl / interval × min(1, p) / thpt_per_gpu(isl) / p_gpu)`;
   `num_d = ceil(req × osl / interval / best_thpt(itl_sla / d, isl + osl/2) / d_gpu)`,
   without checking that the decode point met the ITL target (§3.3).
6. Floor at `min-endpoint`, then SLA-v1's budget (§1.6): proportional with round(),
   decode takes the rest. It can exceed `max-gpu-budget`; the common wrapper
   (`planner.py`) then enforces the budget and the decision says by how much
   Dynamo's own numbers overshot.

Adaptations, each where SLA-v1 has no answer:

- **Aggregated pool.** SLA-v1 is disaggregated only (Dynamo's planner documentation).
  On an aggregated pool this mode sizes the one role with the decode formula alone, as
  Dynamo's later `mode: agg` does (only its decode planner runs); the prefill correction and
  formula are not used. The budget is the single-component form with round().
- **Zero throughput.** If the interpolated throughput is 0 (the ITL target is below
  every profiled cell and the fallback cell has no throughput), SLA-v1 divides by zero
  and the planner loop dies. Here the role falls back to `min-endpoint`, as Dynamo
  did from #5622 for `p_thpt_per_gpu <= 0`.
- **Correction failure.** SLA-v1 catches any exception while computing corrections
  (no decode replica, say) and skips the interval; so does this mode.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from epp.planner.core.config import PlannerConfig
from epp.planner.core.mode import Proposal, current
from epp.planner.core.perf import Profile
from epp.planner.core.predictors import LoadPredictors, build_load_predictors
from epp.planner.core.types import Observation, Role


class FaithfulMode:
    name = "dynamo"

    def __init__(
        self,
        config: PlannerConfig,
        profile: Profile,
        predictors: LoadPredictors | None = None,
    ) -> None:
        self._cfg = config
        self._profile = profile
        self._interval = config.interval_s
        self._roles = config.roles
        self._decode = Role.AGGREGATED if config.planner.pool == "aggregated" else Role.DECODE
        self.predictors = predictors or build_load_predictors(config.predictor, self._interval)
        self.p_correction = 1.0
        self.d_correction = 1.0

    def propose(self, now: float, obs: Observation) -> Proposal:
        hold = current(obs, self._roles)
        num_req = float(obs.completions)
        ttft, itl = obs.ttft_ms.mean, obs.itl_ms.mean
        isl, osl, duration = obs.isl.mean, obs.osl.mean, obs.duration_s.mean
        self.predictors.add(num_req, isl, osl)  # before the check: NaN -> 0
        if any(math.isnan(v) for v in (ttft, itl, isl, osl)):
            return Proposal(
                hold,
                "metrics contain NaN (no request completed): skipping adjustment "
                "(Dynamo SLA-v1, #6985)",
            )
        if not self._cfg.sla.no_correction:
            num_d = obs.replicas_of(self._decode).ready
            if num_d == 0:
                return Proposal(hold, "correction failed (no decode replica): skipping")
            context = isl + osl / 2
            concurrency = num_req / num_d * duration / self._interval
            self.p_correction = ttft / self._profile.prefill.ttft(isl)
            self.d_correction = itl / self._profile.decode.itl(concurrency, context)
        pred = self.predictors.predict(1)
        targets, diag = self._replicas(pred.requests, pred.isl, pred.osl)
        diag |= {
            "p_correction": self.p_correction,
            "d_correction": self.d_correction,
            "observed_ttft_ms": ttft,
            "observed_itl_ms": itl,
            "observed_requests": num_req,
        }
        label = " ".join(f"{r.value}={n}" for r, n in targets.items())
        reason = (
            f"predicted {pred.requests:.1f} req, ISL {pred.isl:.0f}, OSL {pred.osl:.0f}; "
            f"corrections p={self.p_correction:.2f} d={self.d_correction:.2f}: {label}"
        )
        return Proposal(targets, reason, predicted=pred, diagnostics=diag)

    def committed(self, targets: Mapping[Role, int], obs: Observation) -> None:
        """SLA-v1 keeps no memory of its decisions."""

    # -- §1.5 and §1.6 ----------------------------------------------------------------
    def _replicas(self, req: float, isl: float, osl: float) -> tuple[dict[Role, int], dict]:
        b = self._cfg.budget
        p_gpu, d_gpu = b.prefill_engine_num_gpu, b.decode_engine_num_gpu
        interval, min_e = self._interval, b.min_endpoint
        diag: dict[str, float] = {}

        best = self._profile.decode.find_best_throughput_per_gpu(
            self._corrected_itl(), isl + osl / 2
        )
        d_load = req * osl / interval  # output tokens/s
        diag |= {
            "decode_thpt_per_gpu": best.thpt_per_gpu,
            "decode_itl_ms": best.itl_ms,
            "decode_itl_met": float(best.met),
        }
        num_d = math.ceil(d_load / best.thpt_per_gpu / d_gpu) if best.thpt_per_gpu > 0 else min_e
        num_d = max(num_d, min_e)

        if self._decode is Role.AGGREGATED:
            num = num_d
            if b.max_gpu_budget is not None and num * d_gpu > b.max_gpu_budget:
                scale = b.max_gpu_budget / (num * d_gpu)
                num = max(min_e, round(num * scale))
                diag["dynamo_budget_scale"] = scale
            diag["dynamo_gpus"] = float(num * d_gpu)
            return {Role.AGGREGATED: num}, diag

        p_thpt = self._profile.prefill.thpt_per_gpu(isl)
        p_load = req * isl / interval * min(1.0, self.p_correction)  # prefill tokens/s
        diag["prefill_thpt_per_gpu"] = p_thpt
        num_p = math.ceil(p_load / p_thpt / p_gpu) if p_thpt > 0 else min_e
        num_p = max(num_p, min_e)
        total = num_p * p_gpu + num_d * d_gpu
        if b.max_gpu_budget is not None and total > b.max_gpu_budget:
            scale = b.max_gpu_budget / total
            num_p = max(min_e, round(num_p * scale))
            num_d = max(min_e, round((b.max_gpu_budget - num_p * p_gpu) / d_gpu))
            diag["dynamo_budget_scale"] = scale
        diag["dynamo_gpus"] = float(num_p * p_gpu + num_d * d_gpu)
        return {Role.PREFILL: num_p, Role.DECODE: num_d}, diag

    def _corrected_itl(self) -> float:
        itl = self._cfg.sla.itl
        return itl if self.d_correction <= 0 else itl / self.d_correction
