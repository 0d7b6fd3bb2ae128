"""This project's SLA mode: Dynamo SLA-v1's pipeline (predict → correct → size against
the profile), with the improvements of reference §10, each a `BeyondParams` switch so
the replay can measure it alone.

Per interval (items 1, 2 and 4 here; the rest in the module that implements them):

1. **Demand is admitted requests** (`obs.arrivals`), not completions: under
   backpressure completions hide the backlog (Dynamo #11693). ISL/OSL of an interval
   without requests keep their last value (a quiet minute says nothing about prompt
   lengths); the request count is fed as 0.
2. **Idle** (`idle-scale-down`, #6985): an interval without traffic is sized like any
   other, on demand 0, so the pool decays towards `min-endpoint` (to zero with
   `min-endpoint: 0` and `min-gpu-budget: 0`) through the hysteresis below. Off:
   the interval is skipped, as Dynamo does.
3. **Correction factors**: `sla_corrections.py`.
4. **Forecast horizon** (`startup-time`): a replica asked for now serves after
   start-up, so the forecast covers h = ceil(startup / interval) + 1 intervals and
   takes the largest of them, at the `forecast-quantile` upper bound
   (`predict_upper`), not the point forecast.
5-7. **Prefill, decode and aggregated sizing**: `sla_sizing.py`.
8-10. **Hysteresis, the reversal guard and meeting rises**: `sla_damping.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from epp.planner.core.attainment import AttainmentControl, Tally, reachable_isl
from epp.planner.core.config import PlannerConfig
from epp.planner.core.mode import Proposal, current
from epp.planner.core.perf import Profile
from epp.planner.core.predictors import LoadPredictors, build_load_predictors
from epp.planner.core.sla_corrections import Corrections, Factors
from epp.planner.core.sla_damping import Hysteresis, Rise
from epp.planner.core.sla_sizing import Sizing, mean
from epp.planner.core.types import Observation, PredictedLoad, Role

STARTUP_BOUND_SHARE = 0.95  # an interval below this while replicas start is start-up-bound


class SlaMode:
    """Composes the parts: `Sizing` (what the intervals said about requests, and the
    replicas they need), `Corrections` (the factors the sizing reads), `Hysteresis` and
    `Rise` (damping); the forecast and the interval's order of steps are here."""

    name = "epp"

    def __init__(
        self, config: PlannerConfig, profile: Profile, predictors: LoadPredictors | None = None
    ) -> None:
        self._cfg = config
        self._x = config.beyond
        self._interval = config.interval_s
        self._roles = config.roles
        self.predictors = predictors or build_load_predictors(config.predictor, self._interval)
        self.horizon = math.ceil(self._x.startup_time / self._interval) + 1
        self.sizing = Sizing(config, profile, Factors())
        self.corrections = Corrections(config, self.sizing)
        self.hysteresis = Hysteresis(self._roles, self._x.scale_down_window, self._x.reversal_guard)
        self.rise = Rise(self._x.rise_headroom)
        x = self._x
        # prompts longer than this miss the TTFT SLA on an idle replica: no sizing helps
        self.reachable_isl = reachable_isl(profile, config.sla.ttft)
        self.attainment = (
            AttainmentControl(
                x.attainment_target,
                x.attainment_window,
                x.attainment_gain,
                x.attainment_max_factor,
                self.reachable_isl,
            )
            if x.attainment_target > 0
            else None
        )

    # the factors, as the tests and the decision log read them
    @property
    def p_correction(self) -> float:
        return self.sizing.factors.p

    @p_correction.setter
    def p_correction(self, value: float) -> None:
        self.sizing.factors.p = value

    @property
    def d_correction(self) -> float:
        return self.sizing.factors.d

    @d_correction.setter
    def d_correction(self, value: float) -> None:
        self.sizing.factors.d = value

    # -- the step ---------------------------------------------------------------------
    def propose(self, now: float, obs: Observation) -> Proposal:
        have = current(obs, self._roles)
        sizing = self.sizing
        sizing.remember(obs)
        self.rise.observe(obs.arrivals)
        isl = mean(obs.isl_samples) if obs.isl_samples else obs.isl.mean
        self.predictors.add(
            float(obs.arrivals),
            isl if not math.isnan(isl) else sizing.last_isl,
            obs.osl.mean if not math.isnan(obs.osl.mean) else sizing.last_osl,
        )
        if obs.idle and not self._x.idle_scale_down:
            return Proposal(have, "no traffic: skipping the interval (idle-scale-down off)")
        diag: dict[str, float] = {}
        if self.attainment is not None:
            starting = any(obs.replicas_of(r).starting for r in self._roles)
            sla = self._cfg.sla
            diag |= self.attainment.update(obs, sla.ttft, sla.itl, starting)
        if not self._cfg.sla.no_correction:
            self.corrections.correct(obs, diag)
        pred = self._forecast(diag)
        factor = self.attainment.factor if self.attainment else 1.0
        sized, demand, notes = sizing.size(pred, factor, diag)
        targets, why = self.hysteresis.apply(now, sized, have, obs.start)
        bound = self._startup_bound(obs)
        if bound:
            why.append(bound)
        diag |= {
            "startup_bound": 1.0 if bound else 0.0,
            "p_correction": self.p_correction,
            "d_correction": self.d_correction,
            "horizon_intervals": float(self.horizon),
        }
        diag |= {f"sized_{r.value}": float(n) for r, n in sized.items()}
        reason = (
            f"forecast {pred.requests:.1f} req/interval (q{self._x.forecast_quantile:g}, "
            f"{self.horizon} interval(s) ahead), ISL {pred.isl:.0f}, OSL {pred.osl:.0f}; "
            + "; ".join(notes + why)
        )
        return Proposal(targets, reason, predicted=pred, demand=demand, diagnostics=diag)

    def _startup_bound(self, obs: Observation) -> str:
        """Non-empty when the interval just closed kept fewer than `STARTUP_BOUND_SHARE`
        of its completed requests within both SLAs (those the SLA can be met for, as the
        request target counts them) while replicas this planner asked
        for were still starting: capacity was decided and is on its way, and no sizing
        can keep the promise until it serves. The planner says so (the decision's
        reason, the `startup_bound` diagnostic) instead of missing silently."""
        starting = sum(obs.replicas_of(r).starting for r in self._roles)
        if not starting:
            return ""
        tally = Tally.of(obs, self._cfg.sla.ttft, self._cfg.sla.itl, self.reachable_isl)
        if not tally.requests or tally.share >= STARTUP_BOUND_SHARE:
            return ""
        return (
            f"start-up-bound: {tally.share:.1%} of the interval's requests within the SLA "
            f"while {starting} replica(s) start (startup-time {self._x.startup_time:g} s): "
            "the capacity is decided, the SLA cannot be kept until it serves"
        )

    def committed(self, targets: Mapping[Role, int], obs: Observation) -> None:
        self.corrections.committed(targets, obs)

    # -- 4. forecast ------------------------------------------------------------------
    def _forecast(self, diag: dict[str, float] | None = None) -> PredictedLoad:
        q = self._x.forecast_quantile
        steps = [
            self.predictors.predict(k) if q <= 0.5 else self.predictors.predict_upper(k, q)
            for k in range(1, self.horizon + 1)
        ]
        isl = max(s.isl for s in steps)
        osl = max(s.osl for s in steps)
        point = max(s.requests for s in steps)
        headroom = self.rise.headroom(point, self.horizon)
        if diag is not None and headroom > 0:
            diag["rise_headroom_requests"] = headroom
        return PredictedLoad(
            requests=point + headroom,
            isl=isl if isl > 0 else _nan_to(self.sizing.last_isl, 0.0),
            osl=osl if osl > 0 else _nan_to(self.sizing.last_osl, 0.0),
            horizon_s=self._interval * self.horizon,
        )


def _nan_to(x: float, default: float) -> float:
    return default if math.isnan(x) else x
