"""The interval window: what an Observation says about a hand-built interval."""

from __future__ import annotations

import math
import random

from epp.planner.core.types import Replicas, Role, Stats
from epp.planner.core.window import IntervalWindow, PoolSample, RequestRecord


def rec(t: float, ttft: float, itl: float = 10.0, isl: int = 100, osl: int = 10, ok=True):
    return RequestRecord(t, isl, osl, ttft, itl, duration_s=1.0, cached_tokens=isl // 2, ok=ok)


def test_stats_nearest_rank_percentiles():
    s = Stats.of([float(i) for i in range(1, 101)])  # 1..100
    assert (s.count, s.mean, s.p50, s.p90, s.p99) == (100, 50.5, 50.0, 90.0, 99.0)
    assert Stats.of([7.0]).p99 == 7.0
    empty = Stats.of([])
    assert empty.empty and math.isnan(empty.mean) and math.isnan(empty.at("p90"))


def test_close_summarises_requests_and_restarts_at_now():
    w = IntervalWindow(start=0.0)
    for _ in range(3):
        w.admit(100)
    w.complete(rec(1.0, ttft=50.0))
    w.complete(rec(2.0, ttft=150.0, itl=math.nan))  # one output token: no ITL
    w.complete(rec(3.0, ttft=999.0, ok=False))  # a failure is counted, not averaged
    obs = w.close(30.0, {Role.AGGREGATED: Replicas(ready=2, starting=1)})
    assert (obs.start, obs.end, obs.length_s) == (0.0, 30.0, 30.0)
    assert (obs.arrivals, obs.completions, obs.failures) == (3, 2, 1)
    assert obs.ttft_ms.mean == 100.0 and obs.ttft_ms.p90 == 150.0
    assert obs.itl_ms.count == 1 and obs.cached_tokens.mean == 50.0
    assert obs.replicas_of(Role.AGGREGATED).active == 3
    assert obs.replicas_of(Role.PREFILL).active == 0
    nxt = w.close(60.0, {})
    assert nxt.start == 30.0 and nxt.idle and nxt.ttft_ms.empty


def test_pool_samples_become_role_load_with_trend_ends():
    w = IntervalWindow(start=0.0)
    for waiting, kv in ((2, 0.5), (4, 0.7), (9, 0.9)):
        w.sample([PoolSample(Role.PREFILL, waiting, running=1, kv_mean=kv, ready=2)])
    load = w.close(3.0, {}).role(Role.PREFILL)
    assert load.samples == 3
    assert load.queue_mean == 5.0 and (load.queue_first, load.queue_last) == (2.0, 9.0)
    assert math.isclose(load.kv_mean, 0.7) and load.waiting_per_replica == 2.5
    assert math.isnan(w.close(4.0, {}).role(Role.PREFILL).kv_mean)


def test_isl_sample_is_bounded_and_reproducible():
    def run(seed: int) -> tuple[int, ...]:
        w = IntervalWindow(0.0, isl_sample_cap=8, rng=random.Random(seed))
        for i in range(1000):
            w.admit(i)
        return w.close(1.0, {}).isl_samples

    a = run(1)
    assert len(a) == 8 and a == run(1)
    assert max(a) > 8  # later arrivals replace early ones: a sample, not a prefix


def test_itl_by_request_is_aligned_with_ttft_so_both_slas_can_be_counted():
    # a one-token answer has no ITL: itl_ms_samples skips it, itl_ms_by_request keeps its
    # place (NaN) so request i's TTFT and ITL stay paired; a failed request is in neither
    w = IntervalWindow(0.0)
    w.complete(RequestRecord(1.0, 100, 10, 50.0, 12.0, 0.5))
    w.complete(RequestRecord(2.0, 100, 1, 70.0, math.nan, 0.1))
    w.complete(RequestRecord(3.0, 100, 10, 90.0, 20.0, 0.5))
    w.complete(RequestRecord(4.0, 100, 10, math.nan, math.nan, 0.0, ok=False))
    o = w.close(60.0, {})
    assert o.ttft_ms_samples == (50.0, 70.0, 90.0)
    assert o.itl_ms_samples == (12.0, 20.0)
    assert o.itl_ms_by_request[0] == 12.0 and math.isnan(o.itl_ms_by_request[1])
    assert o.itl_ms_by_request[2] == 20.0 and len(o.itl_ms_by_request) == 3
    assert w.close(120.0, {}).itl_ms_by_request == ()  # the window restarted
