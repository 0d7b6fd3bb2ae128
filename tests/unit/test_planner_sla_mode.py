"""This project's SLA mode: each beyond-Dynamo option on a case worked out by hand,
with the option on and off, so each test shows the option's effect.

Profile (tests/planner_helpers.py) unless said otherwise: prefill TTFT = ISL/40 000 s
(75 ms at 3000, 200 ms at 8000); decode ITL = 5 + 20·KV ms, 10 000 tok/s/GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from epp.planner.core.perf import Profile
from epp.planner.core.planner import build_policy
from epp.planner.core.types import Replicas, Role, RoleLoad, Stats
from tests.planner_helpers import DECODE, agg, config, obs, pd, profile

P, D, A = Role.PREFILL, Role.DECODE, Role.AGGREGATED

# Every option off: the mode reduces to Dynamo's formulas on admitted demand.
PLAIN = {
    "mode": "sla",
    "pool": "disaggregated",
    "adjustment_interval": 60,
    "load_predictor": "constant",
    "itl": 10,
    "ttft": 300,
    "no_correction": True,
    "sla_percentile": "mean",
    "queue_aware_prefill": False,
    "startup_time": 0,
    "forecast_quantile": 0.5,
    "scale_down_window": 0,
    "reversal_guard": 0,
    "rise_headroom": 0,
}


def epp(prof: Profile | None = None, **settings):
    return build_policy("epp", config(**(PLAIN | settings)), prof or profile())


@functools.cache
def convex() -> Profile:
    """TTFT convex in ISL: 20, 45, 100, 240, 640 ms at 1k, 2k, 4k, 8k, 16k tokens."""
    isl = [1000, 2000, 4000, 8000, 16000]
    ttft = [20.0, 45.0, 100.0, 240.0, 640.0]
    pre = {
        "prefill_isl": isl,
        "prefill_ttft": ttft,
        "prefill_thpt_per_gpu": [i / t * 1000 for i, t in zip(isl, ttft, strict=True)],
    }
    return Profile.from_arrays(pre, DECODE, "convex")


def test_all_options_off_is_dynamos_formula():
    # 750 req / 60 s = 12.5 req/s; t(8000) = 240 ms -> 12.5 × 0.24 = 3.0 replicas -> 3
    # (Dynamo: 750 × 8000 / 60 = 100 000 tok/s / (8000/0.24 = 33 333 tok/s/GPU) = 3.0)
    d = epp(convex()).step(60, obs(completions=750, isl=8000, replicas=pd(1, 1)))
    assert d.targets == {P: 3, D: 1}
    assert d.diagnostics["prefill_load"] == pytest.approx(3.0)


def test_queue_aware_prefill_adds_replicas_for_waiting():
    # 540 req / 60 s = 9 req/s, ISL 8000 -> S = 0.2 s, a = 1.8 replicas. TTFT SLA 300 ms
    # at p90: waits must stay within 0.3 - 0.2 = 0.1 s. One prompt size: cs² = 0,
    # (ca² + cs²)/2 = 0.5.
    # c = 3: C = 0.35474, rate = (3 - 1.8)/0.2/0.5 = 12/s, t90 = ln(3.5474)/12 = 0.1055 > 0.1
    # c = 4: C = 0.12850, rate = (4 - 1.8)/0.2/0.5 = 22/s, t90 = ln(1.2850)/22 = 0.0114 -> 4
    # Throughput alone (Dynamo): ceil(1.8) = 2, where the p90 wait is ln(8.526)/2 = 1.07 s.
    seen = obs(completions=540, isl=8000, replicas=pd(1, 1))
    on = epp(queue_aware_prefill=True, sla_percentile="p90").step(60, seen)
    off = epp(queue_aware_prefill=False, sla_percentile="p90").step(60, seen)
    assert (on.targets[P], off.targets[P]) == (4, 2)


def test_aggregated_pool_time_shares_prefill_and_decode():
    # 1200 req / 60 s = 20 req/s. Prefill: ISL 3000 -> 75 ms -> a = 1.5 replicas.
    # Decode: 20 × 600 tokens = 12 000 tok/s / 10 000 = 1.2 replicas. N = ceil(2.7) = 3.
    # Dynamo-faithful on the same pool sizes decode alone: ceil(1.2) = 2.
    seen = obs(completions=1200, osl=600, replicas=agg(1))
    d = epp(pool="aggregated").step(60, seen)
    assert d.targets == {A: 3}
    dyn = build_policy("dynamo", config(**(PLAIN | {"pool": "aggregated"})), profile())
    assert dyn.step(60, seen).targets == {A: 2}


def test_demand_is_admitted_requests_not_completions():
    # backpressure: 1200 admitted, 200 completed. 20 req/s × 75 ms = 1.5, decode 1.2 -> 3
    d = epp(pool="aggregated").step(
        60, obs(arrivals=1200, completions=200, osl=600, replicas=agg(1))
    )
    assert d.targets == {A: 3} and d.predicted.requests == 1200


def test_idle_intervals_scale_down_towards_min_endpoint_after_the_window():
    pol = epp(pool="aggregated", scale_down_window=120)
    assert pol.step(60, obs(completions=1200, osl=600, replicas=agg(1))).targets == {A: 3}
    # idle at t=120: forecast 0 -> sized 1 (min-endpoint); the window (0, 120] still holds
    # the 3 sized at t=60 -> hold
    d = pol.step(120, obs(120, replicas=agg(3)))
    assert d.targets == {A: 3} and "held at 3 by the last 120 s" in d.reason
    # t=180: the window (60, 180] holds 1 and 1 -> down to 1 (min-endpoint)
    d = pol.step(180, obs(180, replicas=agg(3)))
    assert d.targets == {A: 1} and "aggregated 3->1" in d.reason


def test_idle_to_zero_with_min_endpoint_zero_and_dynamo_style_skip_when_off():
    pol = epp(pool="aggregated", min_endpoint=0, min_gpu_budget=0)
    pol.step(60, obs(completions=1200, osl=600, replicas=agg(1)))
    assert pol.step(120, obs(120, replicas=agg(3))).targets == {A: 0}
    pol = epp(pool="aggregated", idle_scale_down=False)
    pol.step(60, obs(completions=1200, osl=600, replicas=agg(1)))
    d = pol.step(120, obs(120, replicas=agg(3)))
    assert d.targets == {A: 3} and "no traffic: skipping" in d.reason


def test_the_window_is_a_cooldown_after_scale_up():
    pol = epp(pool="aggregated", scale_down_window=180)
    pol.step(60, obs(completions=1200, osl=600, replicas=agg(1)))  # up to 3
    for t in (120, 180):  # the 3 sized at t=60 is inside (t - 180, t]
        assert pol.step(t, obs(t, replicas=agg(3))).targets == {A: 3}
    assert pol.step(240, obs(240, replicas=agg(3))).targets == {A: 1}


def test_scale_up_is_immediate_within_the_window():
    pol = epp(pool="aggregated", scale_down_window=600)
    pol.step(60, obs(completions=1200, osl=600, replicas=agg(1)))
    pol.step(120, obs(120, replicas=agg(3)))  # held
    # 2400 req: 40 req/s × 75 ms = 3.0, decode 24 000 / 10 000 = 2.4 -> ceil(5.4) = 6
    d = pol.step(180, obs(180, completions=2400, osl=600, replicas=agg(3)))
    assert d.targets == {A: 6}


def test_forecast_horizon_covers_startup():
    # interval 60 s, startup 150 s -> h = ceil(150/60) + 1 = 4 intervals ahead
    pol = epp(startup_time=150)
    assert pol.mode.horizon == 4
    d = pol.step(60, obs(completions=10, replicas=pd(1, 1)))
    assert d.predicted.horizon_s == 240 and d.diagnostics["horizon_intervals"] == 4
    # a rising load under a trend model: looking 4 intervals ahead asks for more
    ramp = [600, 1200, 1800, 2400, 3000, 3600]
    unbounded = {"load_predictor": "kalman", "max_gpu_budget": None}
    near, far = epp(**unbounded), epp(**unbounded, startup_time=150)
    for i, n in enumerate(ramp, start=1):
        dn = near.step(60 * i, obs(60 * i, completions=n, isl=8000, replicas=pd(1, 1)))
        df = far.step(60 * i, obs(60 * i, completions=n, isl=8000, replicas=pd(1, 1)))
    assert df.predicted.requests > dn.predicted.requests >= ramp[-2]
    assert df.targets[P] > dn.targets[P]


def aggregated_itl_obs(itl_values, starting=0, waiting=0.0):
    """One aggregated replica running 10 requests of context 3000 + 150/2 = 3075:
    KV = 10 × 3075 / 100 000 = 0.3075 -> grid column round(30.44) = 30 -> expected ITL
    5 + 20 × 30/99 = 11.06 ms."""
    base = obs(completions=len(itl_values), replicas={A: Replicas(ready=1, starting=starting)})
    return type(base)(
        **{
            **{f: getattr(base, f) for f in base.__dataclass_fields__},
            "itl_ms": Stats.of(itl_values),
            "roles": {
                A: RoleLoad(samples=60, kv_mean=0.3, running_mean=10.0, waiting_per_replica=waiting)
            },
        }
    )


EXPECTED_ITL = 5 + 20 * 30 / 99


def test_corrections_use_the_sla_percentile():
    # ITLs: eight at 8 ms, two at 2 × 11.06 ms. p90 (9th of 10) = 22.12 -> ratio 2.0;
    # smoothed: 0.5 × 1 + 0.5 × 2.0 = 1.5. The mean (64 + 44.24)/10 = 10.82 -> ratio 0.979
    # -> 0.5 + 0.5 × 0.979 = 0.989.
    values = [8.0] * 8 + [2 * EXPECTED_ITL] * 2
    p90 = epp(pool="aggregated", no_correction=False, sla_percentile="p90")
    p90.step(60, aggregated_itl_obs(values))
    mean = epp(pool="aggregated", no_correction=False, sla_percentile="mean")
    mean.step(60, aggregated_itl_obs(values))
    assert p90.mode.d_correction == pytest.approx(1.5, rel=1e-3)
    ratio = (64 + 4 * EXPECTED_ITL) / 10 / EXPECTED_ITL
    assert mean.mode.d_correction == pytest.approx(0.5 + 0.5 * ratio, rel=1e-3)


def test_correction_clamped_and_frozen_while_replicas_start():
    # observed 100 × expected: clamped to 3 -> 0.5 + 0.5 × 3 = 2.0
    pol = epp(pool="aggregated", no_correction=False)
    pol.step(60, aggregated_itl_obs([100 * EXPECTED_ITL] * 10))
    assert pol.mode.d_correction == pytest.approx(2.0, rel=1e-3)
    frozen = epp(pool="aggregated", no_correction=False)
    d = frozen.step(60, aggregated_itl_obs([100 * EXPECTED_ITL] * 10, starting=1))
    assert frozen.mode.d_correction == 1.0 and d.diagnostics["correction_frozen"] == 1.0
    thawed = epp(pool="aggregated", no_correction=False, freeze_correction_on_startup=False)
    thawed.step(60, aggregated_itl_obs([100 * EXPECTED_ITL] * 10, starting=1))
    assert thawed.mode.d_correction == pytest.approx(2.0, rel=1e-3)


def test_prefill_correction_above_one_adds_replicas():
    # Dynamo clamps min(1, p); here a prefill 2× slower than profiled doubles the load.
    # TTFT observed 150 ms vs model 75 ms (no queueing with 20 replicas at a = 1.5):
    # p = 0.5 + 0.5 × 2 = 1.5 -> S = 75 × 1.5 = 112.5 ms -> 20 req/s × 0.1125 = 2.25 -> 3
    pol = epp(no_correction=False)
    d = pol.step(60, obs(completions=1200, ttft=150, replicas=pd(20, 1)))
    assert pol.mode.p_correction == pytest.approx(1.5)
    assert d.diagnostics["prefill_load"] == pytest.approx(2.25) and d.targets[P] == 3


def scale_actions(**settings) -> int:
    """Replica changes over 60 intervals of a seeded load hovering around a replica
    boundary: 1200 ± 15 % req/min, 20 req/s × (75 ms + 600 / 10 000 s) = 2.7 replicas."""
    rng = random.Random(0)
    pol = epp(pool="aggregated", max_gpu_budget=None, **settings)
    n, actions = 3, 0
    for i in range(1, 61):
        reqs = int(1200 * (1 + rng.uniform(-0.15, 0.15)))
        d = pol.step(60 * i, obs(60 * i, completions=reqs, osl=600, replicas=agg(n)))
        actions += d.targets[A] != n
        n = d.targets[A]
    return actions


def test_hysteresis_and_cooldown_damp_flapping():
    # constant predictor: every interval's noise reaches the sizing (14 vs 10 actions on seed 0)
    flappy = scale_actions(scale_down_window=0)
    damped = scale_actions(scale_down_window=180)
    assert damped < flappy


def test_unreachable_itl_sizes_at_the_lowest_itl_point_and_says_so():
    # ITL target 4 ms < the profile's 5 ms floor: sized at the lowest-ITL point that
    # produces tokens (KV 0 here, 10 000 tok/s): 6000 × 150 / 60 / 10 000 = 1.5 -> 2
    d = epp(itl=4).step(60, obs(completions=6000, replicas=pd(1, 1)))
    assert d.targets[D] == 2 and d.diagnostics["decode_itl_met"] == 0.0
    assert "ITL target below every profiled point" in d.reason


def test_cache_aware_prefill_sizes_on_the_uncached_tokens():
    # 750 req / 60 s = 12.5 req/s of 8000-token prompts, 4000 of them served from the
    # prefix cache (usage cached_tokens): share 4000/8000 = 0.5.
    # on:  t(8000 × 0.5 = 4000) = 100 ms -> 12.5 × 0.1 = 1.25 -> 2 prefill replicas
    # off: t(8000) = 240 ms -> 12.5 × 0.24 = 3.0 -> 3 (Dynamo's raw ISL)
    seen = obs(completions=750, isl=8000, cached=4000, replicas=pd(1, 1))
    on = epp(convex(), cache_aware_prefill=True).step(60, seen)
    off = epp(convex(), cache_aware_prefill=False).step(60, seen)
    assert on.diagnostics["prefill_service_ms"] == pytest.approx(100.0)
    assert off.diagnostics["prefill_service_ms"] == pytest.approx(240.0)
    assert (on.targets[P], off.targets[P]) == (2, 3)


# -- issue 15: reversal guard and burst-aware floor ----------------------------------------


def run_script(pol, loads: list[int], start: int = 3) -> list[int]:
    """Step `pol` once a minute on `loads` (requests per minute, OSL 600; 0 = idle),
    carrying each decision out at once; the replica counts after each step."""
    n, out = start, []
    for i, reqs in enumerate(loads, start=1):
        t = 60 * i
        busy = obs(t, completions=reqs, osl=600, replicas=agg(n))
        seen = busy if reqs else obs(t, replicas=agg(n))
        n = pol.step(t, seen).targets[A]
        out.append(n)
    return out


def reversals_of(counts: list[int], start: int, window_s: float = 600.0) -> int:
    """outcome.reversals on a once-a-minute sequence: direction changes within 10 min."""
    rev, prev_dir, prev_at, n = 0, 0, -1e9, start
    for i, c in enumerate(counts, start=1):
        if c != n:
            d = 1 if c > n else -1
            rev += bool(prev_dir and d != prev_dir and 60 * i - prev_at <= window_s)
            prev_dir, prev_at, n = d, 60 * i, c
    return rev


def test_the_reversal_guard_holds_a_scale_down_for_ten_minutes_after_a_scale_up():
    # 1200 req/min sizes 3 (20 req/s x 75 ms = 1.5 prefill + 20 x 600 / 10 000 = 1.2
    # decode -> ceil(2.7) = 3); idle sizes 1 (min-endpoint). A burst at minute 1, idle
    # after: with a 180 s window alone the pool is back to 1 at minute 4 (the 3 sized at
    # 60 s leaves the window (60, 240]); with the 600 s guard the 3 is held while it is
    # at most 600 s old, inclusive, as outcome.reversals counts: down at minute 12
    # (720 - 60 = 660 s > 600), where a 600 s window would let it go at minute 11.
    loads = [1200] + [0] * 12
    window_only = run_script(epp(pool="aggregated", scale_down_window=180), loads, start=1)
    guarded = run_script(
        epp(pool="aggregated", scale_down_window=180, reversal_guard=600), loads, start=1
    )
    wide = run_script(epp(pool="aggregated", scale_down_window=600), loads, start=1)
    assert window_only[:4] == [3, 3, 3, 1]
    assert guarded[:11] == [3] * 11 and guarded[11] == 1
    assert wide[:10] == [3] * 10 and wide[10] == 1
    d = epp(pool="aggregated", reversal_guard=600)
    d.step(60, obs(60, completions=1200, osl=600, replicas=agg(1)))
    assert "(reversal guard)" in d.step(120, obs(120, replicas=agg(3))).reason


def test_the_guard_cuts_reversals_on_a_load_flapping_across_a_boundary():
    # Load alternating every 4 minutes between 1200 (3 replicas) and 2400 req/min
    # (40 req/s: 3.0 + 2.4 -> 6): with the window alone (120 s) the pool follows every
    # swing, each down within 10 minutes of the last up; guarded (600 s) it never
    # scales down (a swing comes back within every 10 minutes): no reversal at all.
    loads = ([1200] * 4 + [2400] * 4) * 4
    loose = run_script(epp(pool="aggregated", scale_down_window=120), loads)
    guarded = run_script(epp(pool="aggregated", scale_down_window=120, reversal_guard=600), loads)
    assert reversals_of(loose, 3) >= 6
    assert reversals_of(guarded, 3) == 0 and max(guarded) == 6


def test_the_first_window_is_seeded_with_the_count_found_as_the_hpa_does():
    # A planner turned on over 5 replicas sees an idle minute (sized 1): the window
    # (180 s) holds the 5 found at the first interval's start (0 s) until t = 180,
    # where 0 is no longer inside (0, 180]: 5, 5, then 1.
    pol = epp(pool="aggregated", scale_down_window=180)
    assert [pol.step(t, obs(t, replicas=agg(5))).targets[A] for t in (60, 120, 180)] == [5, 5, 1]


# -- issue 15, third run: meeting the load's rises -----------------------------------------


def test_rise_headroom_provisions_for_the_rise_over_the_lead_time():
    # Start-up 60 s, 60 s intervals: horizon = ceil(60/60) + 1 = 2 intervals. 1200 req/min
    # sizes 3 (above); then 1800 (a rise of 600): 30 req/s x 75 ms = 2.25 prefill + 30 x 600
    # / 10 000 = 1.8 decode = 4.05 -> 5 without headroom. h = 0.5: 1800 + 0.5 x 600 x 2 =
    # 2400 (40 req/s: 3.0 + 2.4 = 5.4) -> 6; h = 1: 1800 + 1200 = 3000 (50 req/s: 3.75 +
    # 3.0 = 6.75) -> 7. A fall adds nothing: 1200 after 1800 sizes 3 again (no window).
    def sized(h: float) -> list[int]:
        pol = epp(pool="aggregated", startup_time=60, rise_headroom=h)
        return run_script(pol, [1200, 1800, 1200], start=3)

    assert sized(0) == [3, 5, 3]
    assert sized(0.5) == [3, 6, 3]
    assert sized(1.0) == [3, 7, 3]
    pol = epp(pool="aggregated", startup_time=60, rise_headroom=1.0)
    pol.step(60, obs(60, completions=1200, osl=600, replicas=agg(3)))
    d = pol.step(120, obs(120, completions=1800, osl=600, replicas=agg(3)))
    assert d.diagnostics["rise_headroom_requests"] == pytest.approx(1200.0)
    assert d.predicted.requests == pytest.approx(3000.0)


def test_rise_headroom_is_at_most_the_forecast_again():
    # A burst from silence is all rise: 0 then 1200 req/min, h = 1, horizon 2 -> 1 x 1200
    # x 2 = 2400 of headroom, capped at the forecast 1200: 2400 planned (40 req/s: 3.0 +
    # 2.4 = 5.4 -> 6), not 3600 (60 req/s: 4.5 + 3.6 = 8.1 -> 9).
    pol = epp(pool="aggregated", startup_time=60, rise_headroom=1.0)
    pol.step(60, obs(60, replicas=agg(1)))
    d = pol.step(120, obs(120, completions=1200, osl=600, replicas=agg(1)))
    assert d.diagnostics["rise_headroom_requests"] == pytest.approx(1200.0)
    assert d.predicted.requests == pytest.approx(2400.0) and d.targets == {A: 6}


def _with_requests(o, ttfts, itls):
    return dataclasses.replace(o, ttft_ms_samples=tuple(ttfts), itl_ms_by_request=tuple(itls))


def test_a_miss_while_replicas_start_is_reported_as_start_up_bound():
    """An interval that kept fewer than 95 % of its requests within both SLAs while
    replicas were starting says so (reason and `startup_bound` diagnostic); the same
    miss with nothing starting, or 96 % kept while starting, does not."""
    policy = epp(pool="aggregated", startup_time=120)
    # 10 requests, TTFT SLA 300 ms, ITL 10 ms: 8 within, 2 over the TTFT -> 80 %
    base = obs(completions=10, osl=150, replicas=agg(2, starting=2))
    missed = _with_requests(base, [100] * 8 + [900] * 2, [5.0] * 10)
    d = policy.step(60, missed)
    assert d.diagnostics["startup_bound"] == 1.0
    assert "start-up-bound: 80.0% of the interval's requests" in d.reason
    assert "2 replica(s) start (startup-time 120 s)" in d.reason
    calm = epp(pool="aggregated", startup_time=120)
    nothing = dataclasses.replace(missed, replicas=agg(4))
    assert calm.step(60, nothing).diagnostics["startup_bound"] == 0.0
    kept = epp(pool="aggregated", startup_time=120)
    ok = _with_requests(base, [100] * 96 + [900] * 4, [5.0] * 100)
    assert kept.step(60, ok).diagnostics["startup_bound"] == 0.0
