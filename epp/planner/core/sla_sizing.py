"""The SLA mode's sizing: replicas per role against the profile, at the correction
factors (`sla_corrections.py`), for the forecast `sla_mode.py` hands it. The items
keep `sla_mode.py`'s numbering.

5. **Prefill sizing.** Service time per prompt = profiled batch-1 TTFT of its
   *uncached* tokens × the prefill correction (`cache-aware-prefill`: the share of
   prompt tokens the last interval's usage reported as `cached_tokens` is taken off;
   off, the raw ISL, as Dynamo), at the forecast mean ISL. `queue-aware-prefill`: the
   fewest replicas whose waiting time (G/G/c, `queueing.py`) plus service stays within
   the TTFT SLA at the SLA percentile (#10528); off: ceil(offered load), Dynamo's
   throughput rule.
6. **Decode sizing**, as Dynamo: the best throughput per GPU whose ITL meets
   `itl / d_correction` at context `isl + osl/2`, demand = rate × OSL.
7. **Aggregated pools** share each replica between prefill and decode (time sharing):
   N = ceil(prefill load + decode load) in replicas; queue-aware, the fewest N whose
   prefill queue meets the TTFT SLA when each replica has 1 − D/N of its time for
   prefill (D = decode load in replicas).
   The decode profile measures decode alone, as Dynamo's; the prompts sharing an
   aggregated replica's steps are left to the ITL correction factor.
11. **The request target** (`attainment-target`, 0.99; `attainment.py`): the
   share of requests within both SLAs over a recent window drives a load factor the
   sizing plans for (integral action, bounded, given back when comfortable).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from epp.planner.core.config import PlannerConfig
from epp.planner.core.perf import Profile
from epp.planner.core.queueing import smallest_servers, wait_mean, wait_quantile
from epp.planner.core.sla_corrections import Factors
from epp.planner.core.types import Observation, PredictedLoad, Role

MIN_WAIT_SHARE = 0.1  # when service alone breaks the TTFT SLA, still cap waits at 10 % of it
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
MAX_SEARCH = 1000  # replicas past the stability floor an aggregated search may try


class Sizing:
    """Replicas per role against the profile, at the correction factors in `factors`
    (read, never written here), from what the intervals said about requests."""

    def __init__(self, config: PlannerConfig, profile: Profile, factors: Factors) -> None:
        self.cfg = config
        self.x = config.beyond
        self.profile = profile
        self.factors = factors
        self.interval = config.interval_s
        self.agg = config.planner.pool == "aggregated"
        self.decode = Role.AGGREGATED if self.agg else Role.DECODE
        self.prefill = Role.AGGREGATED if self.agg else Role.PREFILL
        self.q = QUANTILES.get(self.x.sla_percentile)  # None: the mean
        self.last_isl = math.nan
        self.last_osl = math.nan
        self.cache_share = 0.0
        self.ttft_goal = config.sla.ttft  # ms: what the sizing aims at
        self.itl_goal = config.sla.itl

    # -- what the interval says about requests ------------------------------------------
    def remember(self, obs: Observation) -> None:
        if not math.isnan(obs.isl.mean):
            self.last_isl = obs.isl.mean
        if not math.isnan(obs.osl.mean):
            self.last_osl = obs.osl.mean
        if self.x.cache_aware_prefill and obs.cached_tokens.count and obs.isl.mean > 0:
            self.cache_share = min(1.0, max(0.0, obs.cached_tokens.mean / obs.isl.mean))

    # -- 5-7. sizing ------------------------------------------------------------------
    def size(
        self, pred: PredictedLoad, factor: float, diag: dict[str, float]
    ) -> tuple[dict[Role, int], dict[Role, float], list[str]]:
        """Targets, demand and notes for the forecast `pred`, its rate × `factor` (the
        request target's load factor, 1 without it)."""
        lam = pred.requests * factor / self.interval
        notes: list[str] = []
        d_corr = self.factors.d
        d_need, best_met, d_thpt = self.decode_load(lam, pred.isl, pred.osl, d_corr)
        diag |= {"decode_thpt_per_gpu": d_thpt, "decode_itl_met": float(best_met)}
        if not best_met:
            notes.append("ITL target below every profiled point: sized at the lowest-ITL point")
        samples = self.service_samples(pred.isl, self.factors.p)
        mean_s = mean(samples) if samples else 0.0
        a = lam * mean_s  # prefill offered load, replicas
        diag |= {"prefill_service_ms": mean_s * 1000, "prefill_load": a, "decode_load": d_need}
        floor = self.cfg.budget.min_endpoint
        if self.agg:
            n = self.aggregated(lam, samples, a, d_need)
            return {Role.AGGREGATED: max(n, floor)}, {Role.AGGREGATED: a + d_need}, notes
        if self.x.queue_aware_prefill:
            n_p = self.queue_replicas(lam, samples)
            p_need = float(n_p)  # the queue model's answer is the need
        else:
            n_p, p_need = math.ceil(a - 1e-9), a
        n_d = math.ceil(d_need - 1e-9)
        targets = {Role.PREFILL: max(n_p, floor), Role.DECODE: max(n_d, floor)}
        return targets, {Role.PREFILL: p_need, Role.DECODE: d_need}, notes

    def decode_load(
        self,
        lam: float,
        isl: float,
        osl: float,
        correction: float = 1.0,
    ) -> tuple[float, bool, float]:
        """Decode replicas the rate needs (fractional), whether the ITL target is
        reachable, and the throughput per GPU used."""
        if lam <= 0 or not osl > 0:
            return 0.0, True, math.nan
        goal = self.itl_goal
        target = goal / correction if correction > 0 else goal
        decode = self.profile.decode
        context = isl + osl / 2
        best = decode.find_best_throughput_per_gpu(target, context)
        if not best.met and target < goal:
            # the correction asks for less than the profile can do: size on the goal itself
            best = decode.find_best_throughput_per_gpu(goal, context)
        if not best.met:
            best = decode.least_itl_point(context)
        if best.thpt_per_gpu <= 0:  # a profile whose every cell is 0 tok/s: nothing to size
            return 0.0, False, 0.0
        gpus = self.cfg.budget.decode_engine_num_gpu
        return lam * osl / best.thpt_per_gpu / gpus, best.met, best.thpt_per_gpu

    def service_samples(self, isl: float, correction: float) -> list[float]:
        """Prefill service times (s) of the prompts to come: the sampled prompt lengths
        rescaled to the forecast mean, uncached share only, × the correction."""
        if not isl > 0:
            return []
        ttft_ms = self.profile.prefill.ttft(isl * (1.0 - self.cache_share))
        return [float(ttft_ms) / 1000.0 * correction]

    def queue_params(self, samples: Sequence[float]) -> tuple[float, float, float]:
        """(mean service, service quantile, (ca² + cs²)/2)."""
        mean_s = mean(samples)
        var = mean([(s - mean_s) ** 2 for s in samples])
        cs2 = var / mean_s**2 if mean_s > 0 else 0.0
        svc_q = mean_s if self.q is None else quantile(samples, self.q)
        return mean_s, svc_q, (self.x.arrival_scv + cs2) / 2

    def ttft_ms(self, c: int, lam: float, samples: Sequence[float], decode_load: float) -> float:
        """The model's TTFT (ms, at the SLA statistic) with `c` replicas, of which
        `decode_load` replicas' worth of time goes to decoding (aggregated pools)."""
        if not samples:
            return math.nan
        share = 1.0 - decode_load / c if c > 0 else 0.0
        if share <= 0:
            return math.inf
        mean_s, svc_q, scv = self.queue_params([s / share for s in samples])
        a = lam * mean_s
        if self.q is None:
            return (mean_s + wait_mean(c, a, mean_s, scv)) * 1000
        return (svc_q + wait_quantile(c, a, mean_s, self.q, scv)) * 1000

    def queue_replicas(self, lam: float, samples: Sequence[float]) -> int:
        """Disaggregated prefill: the fewest replicas whose wait stays within the
        TTFT SLA minus the service time (at least MIN_WAIT_SHARE of the SLA)."""
        if lam <= 0 or not samples:
            return 0
        mean_s, svc_q, scv = self.queue_params(samples)
        sla = self.ttft_goal / 1000
        budget = max(sla - svc_q, MIN_WAIT_SHARE * sla)
        return smallest_servers(lam * mean_s, mean_s, budget, self.q, scv)

    def aggregated(self, lam: float, samples: list[float], a: float, d_need: float) -> int:
        """Replicas for a pool whose replicas both prefill and decode: N replicas give
        prefill 1 - D/N of their time, which stretches each prefill by N/(N - D)."""
        if lam <= 0:
            return 0
        queue = self.x.queue_aware_prefill and bool(samples)
        if not queue:
            return max(math.ceil(a + d_need - 1e-9), 1)
        n = max(1, math.floor(a + d_need) + 1)  # stability: a·N/(N-D) < N <=> a + D < N
        sla = self.ttft_goal / 1000
        for _ in range(MAX_SEARCH):
            share = 1.0 - d_need / n
            mean_s, svc_q, scv = self.queue_params([x / share for x in samples])
            budget = max(sla - svc_q, MIN_WAIT_SHARE * sla)
            wait = (
                wait_mean(n, lam * mean_s, mean_s, scv)
                if self.q is None
                else wait_quantile(n, lam * mean_s, mean_s, self.q, scv)
            )
            if wait <= budget:
                return n
            n += 1
        return n


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest rank, as `types.Stats`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
