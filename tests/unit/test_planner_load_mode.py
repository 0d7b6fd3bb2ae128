"""LOAD-v0 rules one by one (seed 002, reference §5), through the common wrapper."""

from __future__ import annotations

from epp.planner.core.load_mode import NEW_DECODE_WORKER_GRACE_PERIOD
from epp.planner.core.planner import build_policy
from epp.planner.core.types import Replicas, Role, RoleLoad
from tests.planner_helpers import agg, config, obs, pd

P, D, A = Role.PREFILL, Role.DECODE, Role.AGGREGATED


def load(**settings):
    return build_policy("load", config(mode="load", **settings))


def roles(queue=0.0, first=None, last=None, kv=0.6, waiting=0.0, decode=D):
    q_first = queue if first is None else first
    q_last = queue if last is None else last
    return {
        P: RoleLoad(samples=30, queue_mean=queue, queue_first=q_first, queue_last=q_last),
        decode: RoleLoad(samples=30, kv_mean=kv, waiting_per_replica=waiting),
    }


def test_interval_defaults_to_seed_002():
    pol = load()
    assert (pol.interval_s, pol.sample_interval_s) == (30.0, 1.0)


def test_decode_kv_thresholds_and_waiting_estimate():
    pol = load(pool="disaggregated")
    # kv 0.85 + 0.02 × 3 waiting per replica = 0.91 > 0.9 -> decode +1
    d = pol.step(30, obs(30, replicas=pd(1, 2), roles=roles(queue=0.3, kv=0.85, waiting=3)))
    assert d.targets == {P: 1, D: 3}
    assert d.diagnostics["avg_kv_load"] == 0.85 + 0.02 * 3
    # kv 0.85, nothing waiting: 0.85 within [0.5, 0.9] -> hold
    pol = load(pool="disaggregated")
    d = pol.step(30, obs(30, replicas=pd(1, 2), roles=roles(queue=0.3, kv=0.85)))
    assert d.targets == {P: 1, D: 2} and "within thresholds" in d.reason


def test_prefill_queue_is_per_replica_and_changes_by_one():
    pol = load(pool="disaggregated")
    # queue 4 over 2 prefill replicas = 2.0 per replica > 0.5; trend 4 + (4-4)×3 = 4 > 0.5
    # -> +1 only (not +3, however far above the threshold)
    d = pol.step(30, obs(30, replicas=pd(2, 1), roles=roles(queue=4.0)))
    assert d.targets == {P: 3, D: 1}
    # queue 0.3 over 2 = 0.15 < 0.2 -> -1
    pol = load(pool="disaggregated")
    d = pol.step(30, obs(30, replicas=pd(2, 1), roles=roles(queue=0.3)))
    assert d.targets == {P: 1, D: 1}


def test_prefill_queue_trend_blocks_a_scale_up():
    pol = load(pool="disaggregated")
    # mean queue 2/replica (> 0.5), but it fell from 6 to 1 during the interval:
    # predicted = 1 + (1 - 6) × 3 = -14 < 0.5 -> no prefill added
    d = pol.step(30, obs(30, replicas=pd(1, 1), roles=roles(queue=2.0, first=6.0, last=1.0)))
    assert d.targets[P] == 1 and "trend -14.00" in d.reason


def test_decode_grace_period_after_a_scale_up():
    pol = load(pool="disaggregated")
    hot, cold = roles(queue=0.3, kv=0.95), roles(queue=0.3, kv=0.1)
    d = pol.step(30, obs(30, replicas=pd(1, 1), roles=hot))
    assert d.targets[D] == 2  # +1, grace = 3, decremented to 2 at the end of the interval
    assert pol.mode.grace_remaining == NEW_DECODE_WORKER_GRACE_PERIOD - 1
    # the new replica is starting: workers changed -> no adjustment, grace untouched
    d = pol.step(60, obs(60, replicas=pd(1, 1, d_starting=1), roles=cold))
    assert d.targets[D] == 2 and "workers changed" in d.reason
    # ready now 2 (was 1 at the last close): still "changed"
    d = pol.step(90, obs(90, replicas=pd(1, 2), roles=cold))
    assert "workers changed" in d.reason
    # two evaluated intervals with KV 0.1 < 0.5 are held by grace 2, then 1
    d = pol.step(120, obs(120, replicas=pd(1, 2), roles=cold))
    assert d.targets[D] == 2 and "grace 2" in d.reason
    d = pol.step(150, obs(150, replicas=pd(1, 2), roles=cold))
    assert d.targets[D] == 2 and "grace 1" in d.reason
    d = pol.step(180, obs(180, replicas=pd(1, 2), roles=cold))
    assert d.targets[D] == 1


def test_budget_checked_on_scale_up_only():
    # 4 + 4 = 8 GPUs = budget: a decode scale-up would make 9 -> hold
    pol = load(pool="disaggregated")
    d = pol.step(30, obs(30, replicas=pd(4, 4), roles=roles(queue=1.0, kv=0.95)))
    # prefill: 1.0/4 = 0.25 within [0.2, 0.5]: hold; decode: 0.95 > 0.9 but 8 + 1 > 8
    assert d.targets == {P: 4, D: 4} and "exceed max-gpu-budget" in d.reason
    assert d.gpus({P: 1, D: 1}) <= 8


def test_min_endpoint_floor_and_aggregated_pool_uses_decode_rule():
    pol = load()  # aggregated
    d = pol.step(30, obs(30, replicas=agg(1), roles={A: RoleLoad(samples=30, kv_mean=0.1)}))
    assert d.targets == {A: 1}  # 0.1 < 0.5 but already at min-endpoint 1
    pol = load()
    d = pol.step(30, obs(30, replicas=agg(2), roles={A: RoleLoad(samples=30, kv_mean=0.95)}))
    assert d.targets == {A: 3}


def test_scale_from_zero_when_requests_arrive():
    pol = load(min_endpoint=0, min_gpu_budget=0)
    d = pol.step(30, obs(30, arrivals=3, replicas={A: Replicas(ready=0)}))
    assert d.targets == {A: 1}
    pol = load(min_endpoint=0, min_gpu_budget=0)
    d = pol.step(30, obs(30, replicas={A: Replicas(ready=0)}))
    assert d.targets == {A: 0}


def test_no_operation_keeps_replicas_and_says_what_it_would_do():
    pol = load(pool="disaggregated", no_operation=True)
    d = pol.step(30, obs(30, replicas=pd(1, 1), roles=roles(queue=0.3, kv=0.95)))
    assert d.targets == {P: 1, D: 1}
    assert d.reason.startswith("no-operation (would set P1 D2)")
    assert pol.mode.grace_remaining == 0  # nothing happened, no grace period
