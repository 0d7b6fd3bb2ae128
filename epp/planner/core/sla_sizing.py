"""The SLA mode's sizing: replicas per role against the profile, at the correction
factors (`sla_corrections.py`), for the forecast `sla_mode.py` hands it. The items
keep `sla_mode.py`'s numbering.

5. **Prefill sizing.** Service time per prompt = profiled batch-1 TTFT of its
   *uncached* tokens × the prefill correction (`cache-aware-prefill`: the share of
   prompt tokens the last interval's usage reported as `cached_tokens` is taken off;
   off, the raw ISL, as Dynamo). `distribution-aware-prefill`: over the
   interval's sampled prompt lengths (TTFT is convex in ISL: t(mean ISL) under-sizes
   heavy tails, §10.1); off: t(mean ISL). `queue-aware-prefill`: the fewest replicas
   whose waiting time (G/G/c, `queueing.py`) plus service stays within the TTFT SLA
   at the SLA percentile (#10528); off: ceil(offered load), Dynamo's throughput rule.
6. **Decode sizing**, as Dynamo: the best throughput per GPU whose ITL meets
   `itl / d_correction` at context `isl + osl/2`, demand = rate × OSL.
7. **Aggregated pools** share each replica between prefill and decode (time sharing):
   N = ceil(prefill load + decode load) in replicas; queue-aware, the fewest N whose
   prefill queue meets the TTFT SLA when each replica has 1 − D/N of its time for
   prefill (D = decode load in replicas).
   **Prefill interference** (`prefill-interference`): the decode
   profile measures decode alone, but an aggregated replica's steps carry the prompts
   too (vLLM's chunked prefill puts prompt tokens into the decode steps; the simulator's
   `StepCostModel` charges a step `base + max(weight read, prefill_ms x prompt tokens +
   decode term) + attention x context`, so a step with a 1,000-token prompt costs ~50 ms
   where a decode-only one costs ~9). A prompt of u uncached tokens adds m(u) to the step
   it joins: its profiled batch-1 TTFT less the cost of a step without it (the decode
   profile's ITL at no load: base, weight read and attention are paid once per step
   whatever it holds). Over a second a replica at N replicas spends rho = lam x m / N in
   prompt work and 1 − rho in decode steps, so each decode step (the ITL) stretches by
   1/(1 − rho) (the fixed point of ITL = ITL0 + prompt tokens per step x their cost, the
   prompt tokens per step being the rate x ITL), and the replica produces 1 − rho of the
   profile's tokens per second: N (1 − rho) >= D, i.e. prompt work + D <= N, the
   time-sharing rule above (which counts the prompts' full batch-1 time, a bound on
   their marginal time). The sizing therefore reads the decode profile at the goal x
   (1 − rho(N)), and the search over N takes the fewest replicas whose decode point
   meets that tighter target, with prefill + decode load below N and the TTFT queue met
   as before (rho falls as N grows, so the target loosens; a corrected target below
   the profile is not swapped for the bare goal while more replicas can reach it, which
   made a tighter margin size *less*). The correction compares the observed ITL with
   the profile's ITL / (1 − rho) at the rate the measured requests saw, so it measures
   what the model misses, not the interference; an interval with fewer than 20
   completions does not move it (a burst's stragglers saw earlier intervals' prompts).
   Off by default (an ablation recorded in docs/BENCHMARKS.md@a73a134: the ITL factor
   falls from a median 1.4-1.7 to 1.2, but the sizing does not win on all three
   traces): decode sized on the decode profile alone, as Dynamo.
11. **The request target** (`attainment-target`, 0.99; `attainment.py`): the
   share of requests within both SLAs over a recent window drives a load factor the
   sizing plans for (integral action, bounded, given back when comfortable).
12. **The aggregated replica's TTFT** (`aggregated-ttft`; off by
   default): a prompt waits for the step in flight, rides in the next step with the
   decodes and the prompts batched with it, and takes ceil(u / `max-num-batched-tokens`)
   steps (`agg_ttft.py`, from the profile alone, over the sampled prompt lengths: their
   spread is the p90's main term, which t(mean ISL) missed). The correction compares the
   observed statistic with that model's (Azure x3: 0.89-1.07 where the queue model's
   was 1.6-2.8), and the queue-aware search takes the fewest N whose model TTFT x the
   factor meets the goal. `request-target` q (needs it) sizes instead to the fewest N
   whose model predicts a share q of requests within both goals: TTFT from the step
   model, ITL per request from the prompts batched into its own steps (`agg_itl.py`, a
   compound Poisson sum over its osl - 1 steps), each over its factor, the ITL factor
   then comparing the observed p90 with that distribution's. Both off by default
   (an ablation recorded in docs/BENCHMARKS.md@a73a134).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from epp.planner.core import agg_itl
from epp.planner.core.agg_ttft import AggregatedTtft, aggregated_ttft
from epp.planner.core.config import PlannerConfig
from epp.planner.core.perf import Profile
from epp.planner.core.queueing import smallest_servers, wait_mean, wait_quantile
from epp.planner.core.sla_corrections import Factors
from epp.planner.core.types import Observation, PredictedLoad, Role

MIN_WAIT_SHARE = 0.1  # when service alone breaks the TTFT SLA, still cap waits at 10 % of it
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
MAX_SEARCH = 1000  # replicas past the stability floor an aggregated search may try
MIN_DECODE_SHARE = 0.1  # prefill interference: decode keeps at least this share of a step
OSL_SAMPLES = 512  # answer lengths kept for the request-level sizing (a bounded stride)


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
        self.interference = self.agg and config.beyond.prefill_interference
        self.step_ttft = self.agg and config.beyond.aggregated_ttft
        self.requests = self.step_ttft and config.beyond.request_target > 0
        self.decode = Role.AGGREGATED if self.agg else Role.DECODE
        self.prefill = Role.AGGREGATED if self.agg else Role.PREFILL
        self.q = QUANTILES.get(self.x.sla_percentile)  # None: the mean
        self.isl_samples: tuple[int, ...] = ()
        self.osl_samples: tuple[int, ...] = ()
        self.last_isl = math.nan
        self.last_osl = math.nan
        self.cache_share = 0.0
        self.ttft_goal = config.sla.ttft  # ms: what the sizing aims at
        self.itl_goal = config.sla.itl

    # -- what the interval says about requests ------------------------------------------
    def remember(self, obs: Observation) -> None:
        if obs.isl_samples:
            self.isl_samples = obs.isl_samples
        if self.requests and obs.osl_samples:  # only `request-target` reads them
            self.osl_samples = obs.osl_samples[:: max(1, len(obs.osl_samples) // OSL_SAMPLES)]
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
            decode_at = None
            if self.interference:
                # the corrected target reachable without prompts: hold each N to it (a
                # count whose prompts push it below the profile is passed over, more
                # replicas mean fewer prompts per step); unreachable: as without the option
                strict = self.decode_load(lam, pred.isl, pred.osl, d_corr, strict=True)[1]

                def decode_at(n: int) -> tuple[float, bool]:
                    share = self.decode_share(lam, pred.isl, pred.osl, n)
                    found = self.decode_load(
                        lam, pred.isl, pred.osl, self.factors.d, share, strict=strict
                    )
                    return found[0], found[1]

            n, d_n = self.aggregated(lam, samples, a, d_need, decode_at, pred)
            if decode_at is not None:
                share = self.decode_share(lam, pred.isl, pred.osl, max(n, 1))
                diag |= {"decode_load": d_n, "prefill_itl_share": 1.0 - share}
            if self.requests and n > 0:
                diag["request_share"] = self.request_share(lam / n, pred.isl, pred.osl)
            return {Role.AGGREGATED: max(n, floor)}, {Role.AGGREGATED: a + d_n}, notes
        if self.x.queue_aware_prefill:
            n_p = self.queue_replicas(lam, samples)
            p_need = float(n_p)  # the queue model's answer is the need
        else:
            n_p, p_need = math.ceil(a - 1e-9), a
        n_d = math.ceil(d_need - 1e-9)
        targets = {Role.PREFILL: max(n_p, floor), Role.DECODE: max(n_d, floor)}
        return targets, {Role.PREFILL: p_need, Role.DECODE: d_need}, notes

    def request_share(self, rate: float, isl: float, osl: float) -> float:
        """`request-target`: the model's share of requests within both goals at `rate`
        prompts/s per replica (TTFT and ITL taken as independent), each goal over its
        correction factor."""
        model = self.step_model(rate, isl, osl)
        reg = model.regime
        if not reg.stable:
            return 0.0
        ttft = model.share_within(self.ttft_goal / self.factors.p)
        osls = self.osl_lengths(osl)
        if not osls:
            return ttft
        steps = agg_itl.DecodeSteps(reg.itl_ms, reg.rho, rate, model.works_ms)
        itl = agg_itl.share(steps, self.itl_goal / self.factors.d, osls)
        return ttft * itl

    def osl_lengths(self, osl: float) -> list[float]:
        """The remembered answer lengths rescaled to the forecast mean `osl`."""
        if not self.osl_samples or not osl > 0:
            return []
        scale = osl / mean(self.osl_samples)
        return [o * scale for o in self.osl_samples]

    def decode_load(
        self,
        lam: float,
        isl: float,
        osl: float,
        correction: float = 1.0,
        share: float = 1.0,
        strict: bool = False,
    ) -> tuple[float, bool, float]:
        """Decode replicas the rate needs (fractional), whether the ITL target is
        reachable, and the throughput per GPU used. `share` < 1: each replica decodes in
        that share of its time (prefill interference), so the profile is read at the goal
        x share. The load stays the profile's (replicas of decode-alone time): the prompts'
        time is the caller's prefill load, so N >= prefill + decode load counts it once.
        `strict`: "met" means the corrected target, with no fall-back to the goal itself."""
        if lam <= 0 or not osl > 0:
            return 0.0, True, math.nan
        goal = self.itl_goal * share
        target = goal / correction if correction > 0 else goal
        decode = self.profile.decode
        context = isl + osl / 2
        best = decode.find_best_throughput_per_gpu(target, context)
        if not best.met and target < goal and not strict:
            # the correction asks for less than the profile can do: size on the goal itself
            best = decode.find_best_throughput_per_gpu(goal, context)
        if not best.met:
            best = decode.least_itl_point(context)
        if best.thpt_per_gpu <= 0:  # a profile whose every cell is 0 tok/s: nothing to size
            return 0.0, False, 0.0
        gpus = self.cfg.budget.decode_engine_num_gpu
        return lam * osl / best.thpt_per_gpu / gpus, best.met, best.thpt_per_gpu

    def decode_share(self, lam: float, isl: float, osl: float, replicas: int) -> float:
        """1 − rho: the share of a replica's time left to decode steps when `replicas`
        aggregated replicas share `lam` prompts/s (1 with `prefill-interference` off)."""
        if not self.interference or replicas <= 0 or lam <= 0:
            return 1.0
        rho = lam * self.marginal_prefill_s(isl, osl) / replicas
        return max(MIN_DECODE_SHARE, 1.0 - rho)

    def marginal_prefill_s(self, isl: float, osl: float) -> float:
        """Mean seconds a prompt adds to the step it joins: its profiled batch-1 TTFT
        (uncached tokens) less a step without it (the decode profile's ITL at no load,
        at the requests' mid-answer context: what every step pays whatever it holds)."""
        samples = self.service_samples(isl, correction=1.0)
        if not samples:
            return 0.0
        context = isl + (osl / 2 if osl > 0 else 0.0)
        step = self.profile.decode.itl(0.0, context) / 1000.0
        return mean([max(0.0, s - step) for s in samples])

    def lengths(self, isl: float) -> list[float]:
        """Uncached prompt lengths of the prompts to come: the sampled lengths rescaled
        to the mean `isl` (the mean alone without samples), less the cached share."""
        uncached = 1.0 - self.cache_share
        if not self.isl_samples:
            return [isl * uncached]
        scale = isl / mean(self.isl_samples)
        return [s * scale * uncached for s in self.isl_samples]

    def step_model(
        self, rate: float, isl: float, osl: float, decodes: float | None = None
    ) -> AggregatedTtft:
        """`aggregated-ttft`: one replica's TTFT distribution at `rate` prompts/s
        (`agg_ttft.py`), over the sampled prompt lengths whatever
        `distribution-aware-prefill` says (the spread of lengths is the p90's main term)."""
        if not isl > 0:
            return aggregated_ttft(self.profile, 0.0, [], 0.0, 0.0)
        osl = osl if osl > 0 else 0.0
        return aggregated_ttft(
            self.profile,
            rate,
            self.lengths(isl),
            osl,
            isl + osl / 2,
            self.x.max_num_batched_tokens,
            decodes,
        )

    def step_ttft_met(self, rate: float, isl: float, osl: float) -> bool:
        """The step model's TTFT at `rate` prompts/s per replica, x the correction,
        within the goal; when the prompts' own steps alone break it (no count helps),
        a wait within MIN_WAIT_SHARE of it, as the queue rule."""
        model = self.step_model(rate, isl, osl)
        if not model.regime.stable:
            return False
        goal = self.ttft_goal
        c = self.factors.p
        return c * self.model_stat(model) <= goal or c * model.regime.wait_ms <= (
            MIN_WAIT_SHARE * goal
        )

    def model_stat(self, model: AggregatedTtft) -> float:
        """The model's TTFT at the SLA statistic (ms)."""
        return model.mean() if self.q is None else model.quantile(self.q)

    def service_samples(self, isl: float, correction: float) -> list[float]:
        """Prefill service times (s) of the prompts to come: the sampled prompt lengths
        rescaled to the forecast mean, uncached share only, × the correction."""
        if not isl > 0:
            return []
        uncached = 1.0 - self.cache_share
        if self.x.distribution_aware_prefill and self.isl_samples:
            scale = isl / mean(self.isl_samples)
            lengths = [s * scale * uncached for s in self.isl_samples]
        else:
            lengths = [isl * uncached]
        ttft_ms = self.profile.prefill.ttft_many(lengths)
        return [float(t) / 1000.0 * correction for t in ttft_ms]

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

    def aggregated(
        self,
        lam: float,
        samples: list[float],
        a: float,
        d_need: float,
        decode_at: Callable[[int], tuple[float, bool]] | None = None,
        pred: PredictedLoad | None = None,
    ) -> tuple[int, float]:
        """Replicas for a pool whose replicas both prefill and decode, and the decode
        load at that count: N replicas give prefill 1 - D/N of their time, which
        stretches each prefill by N/(N - D). `decode_at(N)` (prefill interference): the
        decode load and whether its ITL target is met at N; a count whose target is not
        met, or whose load does not fit, is passed over (none up to the search's end:
        the answer without interference). With `aggregated-ttft` the TTFT test is the
        step model's at `pred`'s prompt and answer lengths (`_step_ttft_met`)."""
        if lam <= 0:
            return 0, d_need
        queue = self.x.queue_aware_prefill and bool(samples)
        if queue:
            n = max(1, math.floor(a + d_need) + 1)  # stability: a·N/(N-D) < N <=> a + D < N
        else:
            n = max(math.ceil(a + d_need - 1e-9), 1)
        if decode_at is None and not queue:
            return n, d_need
        sla = self.ttft_goal / 1000
        target = 0.0
        if self.requests and pred is not None:
            # no count does better than no load: when that misses the target, aim at it
            # less half the target's miss budget (the search would otherwise size the cap)
            x = self.x.request_target
            target = min(x, self.request_share(1e-9, pred.isl, pred.osl) - (1 - x) / 2)
        for _ in range(MAX_SEARCH):
            d_n = d_need
            if self.requests and pred is not None:
                if decode_at is not None:
                    d_n = decode_at(n)[0]
                fits = a + d_n < n if queue else a + d_n <= n + 1e-9
                if fits and self.request_share(lam / n, pred.isl, pred.osl) >= target:
                    return n, d_n
                n += 1
                continue
            if decode_at is not None:
                d_n, met = decode_at(n)
                fits = a + d_n < n if queue else a + d_n <= n + 1e-9
                if not (met and fits):
                    n += 1
                    continue
                if not queue:
                    return n, d_n
            if self.step_ttft and pred is not None:
                if self.step_ttft_met(lam / n, pred.isl, pred.osl):
                    return n, d_n
                n += 1
                continue
            share = 1.0 - d_n / n
            mean_s, svc_q, scv = self.queue_params([x / share for x in samples])
            budget = max(sla - svc_q, MIN_WAIT_SHARE * sla)
            wait = (
                wait_mean(n, lam * mean_s, mean_s, scv)
                if self.q is None
                else wait_quantile(n, lam * mean_s, mean_s, self.q, scv)
            )
            if wait <= budget:
                return n, d_n
            n += 1
        if decode_at is not None:
            return self.aggregated(lam, samples, a, d_need, pred=pred)
        return n, d_need


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest rank, as `types.Stats`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
