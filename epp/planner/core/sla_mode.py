"""This project's SLA mode: Dynamo SLA-v1's pipeline (predict → correct → size against
the profile), with the improvements of reference §10, each a `BeyondParams` switch so
the replay can measure it alone.

Per interval:

1. **Demand is admitted requests** (`obs.arrivals`), not completions: under
   backpressure completions hide the backlog (Dynamo #11693). ISL/OSL of an interval
   without requests keep their last value (a quiet minute says nothing about prompt
   lengths); the request count is fed as 0.
2. **Idle** (`idle-scale-down`, #6985): an interval without traffic is sized like any
   other, on demand 0, so the pool decays towards `min-endpoint` (to zero with
   `min-endpoint: 0` and `min-gpu-budget: 0`) through the hysteresis below. Off:
   the interval is skipped, as Dynamo does.
3. **Correction factors** (unless `no-correction`), on the SLA statistic
   (`sla-percentile`, default p90, Dynamo: the mean): observed / what the model
   predicts at the observed load and replicas. Both may exceed 1 (Dynamo's
   `min(1, p)` may not); they are clamped to [1/3, 3] and smoothed (half old, half
   new) instead of taken raw, so an overloaded interval (whose latencies say "the
   profile is optimistic" loudly: a trial replay measured TTFTs 100× the model's)
   moves them by a bounded step (`correction-fast-rise`: a measurement above the
   factor is taken at once, one below smoothed). They are **frozen while replicas
   start** and for the interval after a scale-up (`freeze-correction-on-startup`;
   cold caches made Dynamo over-compensate, #2511).
4. **Forecast horizon** (`startup-time`): a replica asked for now serves after
   start-up, so the forecast covers h = ceil(startup / interval) + 1 intervals and
   takes the largest of them, at the `forecast-quantile` upper bound
   (`predict_upper`), not the point forecast.
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
8. **Hysteresis and cooldown** (#9294), as a stabilization window
   (`scale-down-window`, the 300 s of Kubernetes HPA and AIBrix APA): scale up at
   once; scale down only to the largest target sized within the window, so a smaller
   target must hold for the whole window, and no scale-down comes sooner than the
   window after a scale-up. The sized target is already the smallest count
   predicted to meet the SLA with the whole load on it, which is the N−1 test of
   #9294 (the remaining replicas absorb the N/(N−1) load).
9. **Reversal guard** (`reversal-guard`):
   the window again, with the judge's boundary: a scale-down also waits until *more*
   than the guard has passed since the role last sized at its current count or above
   (`outcome.reversals` counts a change within 600 s, inclusive; a 600 s window lets
   the down through at exactly 600 s). At 600 no scale-up is ever reversed by a
   scale-down. It only limits scale-downs.
10. **Meeting rises** (each off by default unless an ablation chose it). A reactive forecast sees
   a rise one interval late and a new replica serves a start-up after that:
   - `rise-headroom` h: the forecast count plus h x the last interval's rise (when
     positive) x the horizon in intervals, the load the rise reaches by the time a
     replica asked for now is serving (a linear trend over the lead time, Holt's
     forecast with the trend taken from the last two intervals), at most the forecast
     again (a burst from silence is all rise: AIBrix APA's 2x cap on one step);
   - `sla-margin` m: size against m x the TTFT and ITL targets. An interval whose p90
     sits exactly at the SLA lets a tenth of its requests miss, and the judge counts
     >= 99 % of requests: the margin is where the planner buys that.
   A shorter decision interval than the window (`adjustment-interval: 30`) is the
   asymmetric scheme the HPA uses (scale-up with no stabilization, scale-down after its
   300 s window; KEDA polls every 30 s by default, the vLLM recipe every 15 s): the
   window and the guard are in seconds, so scale-downs keep their pace.
11. **The request target** (`attainment-target`, off by default; `attainment.py`): the
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
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from epp.planner.core import agg_itl
from epp.planner.core.agg_ttft import AggregatedTtft, aggregated_ttft
from epp.planner.core.attainment import AttainmentControl, Tally
from epp.planner.core.config import PlannerConfig
from epp.planner.core.mode import Proposal, current
from epp.planner.core.perf import Profile
from epp.planner.core.predictors import LoadPredictors, build_load_predictors
from epp.planner.core.queueing import smallest_servers, wait_mean, wait_quantile
from epp.planner.core.types import Observation, PredictedLoad, Role, Stats

CORRECTION_RANGE = (1 / 3, 3.0)
CORRECTION_WEIGHT = 0.5  # share of a new measurement in the smoothed factor
MIN_WAIT_SHARE = 0.1  # when service alone breaks the TTFT SLA, still cap waits at 10 % of it
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
MAX_SEARCH = 1000  # replicas past the stability floor an aggregated search may try
MIN_DECODE_SHARE = 0.1  # prefill interference: decode keeps at least this share of a step
MIN_INTERFERENCE_SAMPLES = 20  # completions an interval needs to teach the ITL factor then
STARTUP_BOUND_SHARE = 0.95  # an interval below this while replicas start is start-up-bound
OSL_SAMPLES = 512  # answer lengths kept for the request-level sizing (a bounded stride)


class SlaMode:
    name = "epp"

    def __init__(
        self, config: PlannerConfig, profile: Profile, predictors: LoadPredictors | None = None
    ) -> None:
        self._cfg = config
        self._x = config.beyond
        self._profile = profile
        self._interval = config.interval_s
        self._roles = config.roles
        self._agg = config.planner.pool == "aggregated"
        self._interference = self._agg and config.beyond.prefill_interference
        self._step_ttft = self._agg and config.beyond.aggregated_ttft
        self._requests = self._step_ttft and config.beyond.request_target > 0
        self._osl_samples: tuple[int, ...] = ()
        self._decode = Role.AGGREGATED if self._agg else Role.DECODE
        self._prefill = Role.AGGREGATED if self._agg else Role.PREFILL
        self.predictors = predictors or build_load_predictors(config.predictor, self._interval)
        self.horizon = math.ceil(self._x.startup_time / self._interval) + 1
        self.p_correction = 1.0
        self.d_correction = 1.0
        self._q = QUANTILES.get(self._x.sla_percentile)  # None: the mean
        self._isl_samples: tuple[int, ...] = ()
        self._last_isl = math.nan
        self._last_osl = math.nan
        self._cache_share = 0.0
        self._since_up = 1_000_000
        self._sized: dict[Role, deque[tuple[float, int]]] = {r: deque() for r in self._roles}
        self._seeded = False
        self._prev_arrivals: float | None = None
        self._rise = 0.0  # the last interval's rise in requests (0 when it fell)
        x = self._x
        self.attainment = (
            AttainmentControl(
                x.attainment_target,
                x.attainment_window,
                x.attainment_gain,
                x.attainment_max_factor,
            )
            if x.attainment_target > 0
            else None
        )
        self._ttft_goal = config.sla.ttft * x.sla_margin  # ms: what the sizing aims at
        self._itl_goal = config.sla.itl * x.sla_margin

    # -- the step ---------------------------------------------------------------------
    def propose(self, now: float, obs: Observation) -> Proposal:
        have = current(obs, self._roles)
        self._remember(obs)
        if self._prev_arrivals is not None:
            self._rise = max(0.0, obs.arrivals - self._prev_arrivals)
        self._prev_arrivals = float(obs.arrivals)
        isl = _mean(obs.isl_samples) if obs.isl_samples else obs.isl.mean
        self.predictors.add(
            float(obs.arrivals),
            isl if not math.isnan(isl) else self._last_isl,
            obs.osl.mean if not math.isnan(obs.osl.mean) else self._last_osl,
        )
        if obs.idle and not self._x.idle_scale_down:
            return Proposal(have, "no traffic: skipping the interval (idle-scale-down off)")
        diag: dict[str, float] = {}
        if self.attainment is not None:
            starting = any(obs.replicas_of(r).starting for r in self._roles)
            sla = self._cfg.sla
            diag |= self.attainment.update(obs, sla.ttft, sla.itl, starting)
        if not self._cfg.sla.no_correction:
            self._correct(obs, diag)
        pred = self._forecast(diag)
        sized, demand, notes = self._size(pred, diag)
        targets, why = self._hysteresis(now, sized, have, obs.start)
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
        of its completed requests within both SLAs while replicas this planner asked
        for were still starting: capacity was decided and is on its way, and no sizing
        can keep the promise until it serves. The planner says so (the decision's
        reason, the `startup_bound` diagnostic) instead of missing silently."""
        starting = sum(obs.replicas_of(r).starting for r in self._roles)
        if not starting:
            return ""
        tally = Tally.of(obs, self._cfg.sla.ttft, self._cfg.sla.itl)
        if not tally.requests or tally.share >= STARTUP_BOUND_SHARE:
            return ""
        return (
            f"start-up-bound: {tally.share:.1%} of the interval's requests within the SLA "
            f"while {starting} replica(s) start (startup-time {self._x.startup_time:g} s): "
            "the capacity is decided, the SLA cannot be kept until it serves"
        )

    def committed(self, targets: Mapping[Role, int], obs: Observation) -> None:
        if any(targets.get(r, 0) > obs.replicas_of(r).active for r in self._roles):
            self._since_up = 0
        else:
            self._since_up += 1

    # -- 1. what the interval says about requests ----------------------------------
    def _remember(self, obs: Observation) -> None:
        if obs.isl_samples:
            self._isl_samples = obs.isl_samples
        if self._requests and obs.osl_samples:  # only `request-target` reads them
            self._osl_samples = obs.osl_samples[:: max(1, len(obs.osl_samples) // OSL_SAMPLES)]
        if not math.isnan(obs.isl.mean):
            self._last_isl = obs.isl.mean
        if not math.isnan(obs.osl.mean):
            self._last_osl = obs.osl.mean
        if self._x.cache_aware_prefill and obs.cached_tokens.count and obs.isl.mean > 0:
            self._cache_share = min(1.0, max(0.0, obs.cached_tokens.mean / obs.isl.mean))

    def _stat(self, stats: Stats) -> float:
        return stats.at(self._x.sla_percentile)

    # -- 3. correction factors ----------------------------------------------------------
    def _correct(self, obs: Observation, diag: dict[str, float]) -> None:
        starting = any(obs.replicas_of(r).starting for r in self._roles)
        if self._x.freeze_correction_on_startup and (starting or self._since_up < 1):
            diag["correction_frozen"] = 1.0
            return
        if obs.completions == 0:
            return
        lam = obs.arrivals / max(obs.length_s, 1e-9)
        ready_p = obs.replicas_of(self._prefill).ready
        ready_d = obs.replicas_of(self._decode).ready
        ctx = obs.isl.mean + obs.osl.mean / 2
        ttft_obs = self._stat(obs.ttft_ms)
        itl_obs = self._stat(obs.itl_ms)
        # decode first: the aggregated TTFT model needs the decode share
        # with the interference model, a handful of stragglers (a burst's tail finishing in
        # a quiet interval) saw the prompts of earlier intervals, not this one's rate
        stragglers = self._interference and obs.completions < MIN_INTERFERENCE_SAMPLES
        stragglers = stragglers or (self._requests and obs.completions < MIN_INTERFERENCE_SAMPLES)
        if self._requests and ready_d > 0 and not math.isnan(itl_obs) and not stragglers:
            self._correct_itl_per_request(obs, lam / ready_d, itl_obs, diag)
        elif ready_d > 0 and not math.isnan(itl_obs) and not math.isnan(ctx) and not stragglers:
            running = obs.role(self._decode).running_mean
            if math.isnan(running):  # Little's law, as Dynamo
                running = obs.completions / obs.length_s * obs.duration_s.mean
            expected = self._profile.decode.itl(running / ready_d, ctx)
            # the prompts the measured requests shared steps with: at least the rate they
            # completed at (a burst's tail completes in an interval with no arrivals)
            seen = max(obs.arrivals, obs.completions) / max(obs.length_s, 1e-9)
            share = self._decode_share(seen, obs.isl.mean, obs.osl.mean, ready_d)
            if share < 1.0:
                expected /= share
                diag["observed_prefill_share"] = 1.0 - share
            self.d_correction = self._learn(self.d_correction, itl_obs / expected)
            diag["expected_itl_ms"] = expected
        if ready_p > 0 and not math.isnan(ttft_obs) and self._step_ttft:
            running = obs.role(self._decode).running_mean
            decodes = None if math.isnan(running) else running / ready_p
            model = self._step_model(lam / ready_p, obs.isl.mean, obs.osl.mean, decodes)
            expected = self._model_stat(model)
            if math.isfinite(expected) and expected > 0:
                self.p_correction = self._learn(self.p_correction, ttft_obs / expected)
                diag["expected_ttft_ms"] = expected
                diag["ttft_wait_ms"] = model.regime.wait_ms
        elif ready_p > 0 and not math.isnan(ttft_obs):
            samples = self._service_samples(obs.isl.mean, correction=1.0)
            decode_load = 0.0
            if self._agg:
                share = self._decode_share(lam, obs.isl.mean, obs.osl.mean, ready_p)
                found = self._decode_load(lam, obs.isl.mean, obs.osl.mean, self.d_correction, share)
                decode_load = found[0]
            expected = self._ttft_ms(ready_p, lam, samples, decode_load)
            if math.isfinite(expected) and expected > 0:
                self.p_correction = self._learn(self.p_correction, ttft_obs / expected)
                diag["expected_ttft_ms"] = expected

    def _correct_itl_per_request(
        self, obs: Observation, rate: float, itl_obs: float, diag: dict[str, float]
    ) -> None:
        """`request-target`: the ITL factor compares the observed statistic with the
        per-request model's (`agg_itl`) at the interval's rate, decodes and answers."""
        running = obs.role(self._decode).running_mean
        ready = obs.replicas_of(self._decode).ready
        decodes = None if math.isnan(running) else running / ready
        model = self._step_model(rate, obs.isl.mean, obs.osl.mean, decodes)
        reg = model.regime
        if not reg.stable or not obs.osl_samples:
            return
        if self._q is None:
            expected = reg.mean_step_ms
        else:
            steps = agg_itl.DecodeSteps(reg.itl_ms, reg.rho, rate, model.works_ms)
            expected = agg_itl.quantile(steps, self._q, obs.osl_samples)
        if math.isfinite(expected) and expected > 0:
            self.d_correction = self._learn(self.d_correction, itl_obs / expected)
            diag["expected_itl_ms"] = expected

    def _request_share(self, rate: float, isl: float, osl: float) -> float:
        """`request-target`: the model's share of requests within both goals at `rate`
        prompts/s per replica (TTFT and ITL taken as independent), each goal over its
        correction factor."""
        model = self._step_model(rate, isl, osl)
        reg = model.regime
        if not reg.stable:
            return 0.0
        ttft = model.share_within(self._ttft_goal / self.p_correction)
        osls = self._osl_lengths(osl)
        if not osls:
            return ttft
        steps = agg_itl.DecodeSteps(reg.itl_ms, reg.rho, rate, model.works_ms)
        itl = agg_itl.share(steps, self._itl_goal / self.d_correction, osls)
        return ttft * itl

    def _osl_lengths(self, osl: float) -> list[float]:
        """The remembered answer lengths rescaled to the forecast mean `osl`."""
        if not self._osl_samples or not osl > 0:
            return []
        scale = osl / _mean(self._osl_samples)
        return [o * scale for o in self._osl_samples]

    def _learn(self, old: float, measured: float) -> float:
        """The smoothed factor; with `correction-fast-rise`, a measurement above it is
        taken at once (clamped): the model was optimistic, the pool is short now, and
        half a step leaves it short at the next, larger load (the asymmetry of scaling up
        at once and down slowly, applied to what the sizing believes)."""
        smoothed = _smooth(old, measured)
        if self._x.correction_fast_rise and math.isfinite(measured):
            return max(smoothed, min(CORRECTION_RANGE[1], measured))
        return smoothed

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
        # at most the forecast again: one step never plans for more than twice the load
        # (AIBrix APA's max-scale-up-rate 2x): a burst from silence is all rise, and
        # x horizon it would size several bursts' worth
        headroom = min(self._x.rise_headroom * self._rise * self.horizon, point)
        if diag is not None and headroom > 0:
            diag["rise_headroom_requests"] = headroom
        return PredictedLoad(
            requests=point + headroom,
            isl=isl if isl > 0 else _nan_to(self._last_isl, 0.0),
            osl=osl if osl > 0 else _nan_to(self._last_osl, 0.0),
            horizon_s=self._interval * self.horizon,
        )

    # -- 5-7. sizing ------------------------------------------------------------------
    def _size(
        self, pred: PredictedLoad, diag: dict[str, float]
    ) -> tuple[dict[Role, int], dict[Role, float], list[str]]:
        factor = self.attainment.factor if self.attainment else 1.0
        lam = pred.requests * factor / self._interval
        notes: list[str] = []
        d_need, best_met, d_thpt = self._decode_load(lam, pred.isl, pred.osl, self.d_correction)
        diag |= {"decode_thpt_per_gpu": d_thpt, "decode_itl_met": float(best_met)}
        if not best_met:
            notes.append("ITL target below every profiled point: sized at the lowest-ITL point")
        samples = self._service_samples(pred.isl, self.p_correction)
        mean_s = _mean(samples) if samples else 0.0
        a = lam * mean_s  # prefill offered load, replicas
        diag |= {"prefill_service_ms": mean_s * 1000, "prefill_load": a, "decode_load": d_need}
        floor = self._cfg.budget.min_endpoint
        if self._agg:
            decode_at = None
            if self._interference:
                # the corrected target reachable without prompts: hold each N to it (a
                # count whose prompts push it below the profile is passed over, more
                # replicas mean fewer prompts per step); unreachable: as without the option
                strict = self._decode_load(lam, pred.isl, pred.osl, self.d_correction, strict=True)[
                    1
                ]

                def decode_at(n: int) -> tuple[float, bool]:
                    share = self._decode_share(lam, pred.isl, pred.osl, n)
                    found = self._decode_load(
                        lam, pred.isl, pred.osl, self.d_correction, share, strict=strict
                    )
                    return found[0], found[1]

            n, d_n = self._aggregated(lam, samples, a, d_need, decode_at, pred)
            if decode_at is not None:
                share = self._decode_share(lam, pred.isl, pred.osl, max(n, 1))
                diag |= {"decode_load": d_n, "prefill_itl_share": 1.0 - share}
            if self._requests and n > 0:
                diag["request_share"] = self._request_share(lam / n, pred.isl, pred.osl)
            return {Role.AGGREGATED: max(n, floor)}, {Role.AGGREGATED: a + d_n}, notes
        if self._x.queue_aware_prefill:
            n_p = self._queue_replicas(lam, samples)
            p_need = float(n_p)  # the queue model's answer is the need
        else:
            n_p, p_need = math.ceil(a - 1e-9), a
        n_d = math.ceil(d_need - 1e-9)
        targets = {Role.PREFILL: max(n_p, floor), Role.DECODE: max(n_d, floor)}
        return targets, {Role.PREFILL: p_need, Role.DECODE: d_need}, notes

    def _decode_load(
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
        goal = self._itl_goal * share
        target = goal / correction if correction > 0 else goal
        decode = self._profile.decode
        context = isl + osl / 2
        best = decode.find_best_throughput_per_gpu(target, context)
        if not best.met and target < goal and not strict:
            # the correction asks for less than the profile can do: size on the goal itself
            best = decode.find_best_throughput_per_gpu(goal, context)
        if not best.met:
            best = decode.least_itl_point(context)
        if best.thpt_per_gpu <= 0:  # a profile whose every cell is 0 tok/s: nothing to size
            return 0.0, False, 0.0
        gpus = self._cfg.budget.decode_engine_num_gpu
        return lam * osl / best.thpt_per_gpu / gpus, best.met, best.thpt_per_gpu

    def _decode_share(self, lam: float, isl: float, osl: float, replicas: int) -> float:
        """1 − rho: the share of a replica's time left to decode steps when `replicas`
        aggregated replicas share `lam` prompts/s (1 with `prefill-interference` off)."""
        if not self._interference or replicas <= 0 or lam <= 0:
            return 1.0
        rho = lam * self._marginal_prefill_s(isl, osl) / replicas
        return max(MIN_DECODE_SHARE, 1.0 - rho)

    def _marginal_prefill_s(self, isl: float, osl: float) -> float:
        """Mean seconds a prompt adds to the step it joins: its profiled batch-1 TTFT
        (uncached tokens) less a step without it (the decode profile's ITL at no load,
        at the requests' mid-answer context: what every step pays whatever it holds)."""
        samples = self._service_samples(isl, correction=1.0)
        if not samples:
            return 0.0
        context = isl + (osl / 2 if osl > 0 else 0.0)
        step = self._profile.decode.itl(0.0, context) / 1000.0
        return _mean([max(0.0, s - step) for s in samples])

    def _lengths(self, isl: float) -> list[float]:
        """Uncached prompt lengths of the prompts to come: the sampled lengths rescaled
        to the mean `isl` (the mean alone without samples), less the cached share."""
        uncached = 1.0 - self._cache_share
        if not self._isl_samples:
            return [isl * uncached]
        scale = isl / _mean(self._isl_samples)
        return [s * scale * uncached for s in self._isl_samples]

    def _step_model(
        self, rate: float, isl: float, osl: float, decodes: float | None = None
    ) -> AggregatedTtft:
        """`aggregated-ttft`: one replica's TTFT distribution at `rate` prompts/s
        (`agg_ttft.py`), over the sampled prompt lengths whatever
        `distribution-aware-prefill` says (the spread of lengths is the p90's main term)."""
        if not isl > 0:
            return aggregated_ttft(self._profile, 0.0, [], 0.0, 0.0)
        osl = osl if osl > 0 else 0.0
        return aggregated_ttft(
            self._profile,
            rate,
            self._lengths(isl),
            osl,
            isl + osl / 2,
            self._x.max_num_batched_tokens,
            decodes,
        )

    def _step_ttft_met(self, rate: float, isl: float, osl: float) -> bool:
        """The step model's TTFT at `rate` prompts/s per replica, x the correction,
        within the goal; when the prompts' own steps alone break it (no count helps),
        a wait within MIN_WAIT_SHARE of it, as the queue rule."""
        model = self._step_model(rate, isl, osl)
        if not model.regime.stable:
            return False
        goal = self._ttft_goal
        c = self.p_correction
        return c * self._model_stat(model) <= goal or c * model.regime.wait_ms <= (
            MIN_WAIT_SHARE * goal
        )

    def _model_stat(self, model: AggregatedTtft) -> float:
        """The model's TTFT at the SLA statistic (ms)."""
        return model.mean() if self._q is None else model.quantile(self._q)

    def _service_samples(self, isl: float, correction: float) -> list[float]:
        """Prefill service times (s) of the prompts to come: the sampled prompt lengths
        rescaled to the forecast mean, uncached share only, × the correction."""
        if not isl > 0:
            return []
        uncached = 1.0 - self._cache_share
        if self._x.distribution_aware_prefill and self._isl_samples:
            scale = isl / _mean(self._isl_samples)
            lengths = [s * scale * uncached for s in self._isl_samples]
        else:
            lengths = [isl * uncached]
        ttft_ms = self._profile.prefill.ttft_many(lengths)
        return [float(t) / 1000.0 * correction for t in ttft_ms]

    def _queue_params(self, samples: Sequence[float]) -> tuple[float, float, float]:
        """(mean service, service quantile, (ca² + cs²)/2)."""
        mean_s = _mean(samples)
        var = _mean([(s - mean_s) ** 2 for s in samples])
        cs2 = var / mean_s**2 if mean_s > 0 else 0.0
        svc_q = mean_s if self._q is None else _quantile(samples, self._q)
        return mean_s, svc_q, (self._x.arrival_scv + cs2) / 2

    def _ttft_ms(self, c: int, lam: float, samples: Sequence[float], decode_load: float) -> float:
        """The model's TTFT (ms, at the SLA statistic) with `c` replicas, of which
        `decode_load` replicas' worth of time goes to decoding (aggregated pools)."""
        if not samples:
            return math.nan
        share = 1.0 - decode_load / c if c > 0 else 0.0
        if share <= 0:
            return math.inf
        mean_s, svc_q, scv = self._queue_params([s / share for s in samples])
        a = lam * mean_s
        if self._q is None:
            return (mean_s + wait_mean(c, a, mean_s, scv)) * 1000
        return (svc_q + wait_quantile(c, a, mean_s, self._q, scv)) * 1000

    def _queue_replicas(self, lam: float, samples: Sequence[float]) -> int:
        """Disaggregated prefill: the fewest replicas whose wait stays within the
        TTFT SLA minus the service time (at least MIN_WAIT_SHARE of the SLA)."""
        if lam <= 0 or not samples:
            return 0
        mean_s, svc_q, scv = self._queue_params(samples)
        sla = self._ttft_goal / 1000
        budget = max(sla - svc_q, MIN_WAIT_SHARE * sla)
        return smallest_servers(lam * mean_s, mean_s, budget, self._q, scv)

    def _aggregated(
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
        queue = self._x.queue_aware_prefill and bool(samples)
        if queue:
            n = max(1, math.floor(a + d_need) + 1)  # stability: a·N/(N-D) < N <=> a + D < N
        else:
            n = max(math.ceil(a + d_need - 1e-9), 1)
        if decode_at is None and not queue:
            return n, d_need
        sla = self._ttft_goal / 1000
        target = 0.0
        if self._requests and pred is not None:
            # no count does better than no load: when that misses the target, aim at it
            # less half the target's miss budget (the search would otherwise size the cap)
            x = self._x.request_target
            target = min(x, self._request_share(1e-9, pred.isl, pred.osl) - (1 - x) / 2)
        for _ in range(MAX_SEARCH):
            d_n = d_need
            if self._requests and pred is not None:
                if decode_at is not None:
                    d_n = decode_at(n)[0]
                fits = a + d_n < n if queue else a + d_n <= n + 1e-9
                if fits and self._request_share(lam / n, pred.isl, pred.osl) >= target:
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
            if self._step_ttft and pred is not None:
                if self._step_ttft_met(lam / n, pred.isl, pred.osl):
                    return n, d_n
                n += 1
                continue
            share = 1.0 - d_n / n
            mean_s, svc_q, scv = self._queue_params([x / share for x in samples])
            budget = max(sla - svc_q, MIN_WAIT_SHARE * sla)
            wait = (
                wait_mean(n, lam * mean_s, mean_s, scv)
                if self._q is None
                else wait_quantile(n, lam * mean_s, mean_s, self._q, scv)
            )
            if wait <= budget:
                return n, d_n
            n += 1
        if decode_at is not None:
            return self._aggregated(lam, samples, a, d_need, pred=pred)
        return n, d_need

    # -- 8. hysteresis -------------------------------------------------------------------
    def _hysteresis(
        self, now: float, sized: Mapping[Role, int], have: Mapping[Role, int], start: float
    ) -> tuple[dict[Role, int], list[str]]:
        """Up at once; down only to the largest target sized within the window, not
        within the reversal guard of a scale-up. The
        first interval seeds the window with the count the planner found (at the
        interval's start), as the HPA does (`maybeInitScaleDownStabilizationWindow`,
        laws/hpa.py): a planner turned on does not scale down before it has a
        window's worth of its own targets."""
        out: dict[Role, int] = {}
        notes: list[str] = []
        window, guard = self._x.scale_down_window, self._x.reversal_guard
        for r in self._roles:
            want, now_n = sized.get(r, 0), have.get(r, 0)
            recent = self._sized[r]
            if not self._seeded:
                recent.append((start, have.get(r, 0)))
            while recent and recent[0][0] <= now - window and recent[0][0] < now - guard:
                recent.popleft()
            recent.append((now, want))
            if want >= now_n:
                out[r] = want
                if want > now_n:
                    notes.append(f"{r.value} {now_n}->{want}")
                continue
            held = max((n for t, n in recent if t > now - window), default=0)
            guarded = max(n for t, n in recent if t >= now - guard)
            out[r] = min(now_n, max(held, guarded))
            if out[r] < now_n:
                notes.append(f"{r.value} {now_n}->{out[r]} (largest target in {window:g} s)")
            elif held >= now_n:
                notes.append(f"{r.value} wants {want}: held at {now_n} by the last {window:g} s")
            else:
                notes.append(
                    f"{r.value} wants {want}: held at {now_n}, sized so within {guard:g} s "
                    "(reversal guard)"
                )
        self._seeded = True
        if not notes:
            notes.append("no change")
        return out, notes


def _smooth(old: float, measured: float) -> float:
    lo, hi = CORRECTION_RANGE
    if not math.isfinite(measured) or measured <= 0:
        return old
    clamped = min(hi, max(lo, measured))
    return (1 - CORRECTION_WEIGHT) * old + CORRECTION_WEIGHT * clamped


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def _quantile(values: Sequence[float], q: float) -> float:
    """Nearest rank, as `types.Stats`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _nan_to(x: float, default: float) -> float:
    return default if math.isnan(x) else x
