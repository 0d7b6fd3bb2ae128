"""The wrapper every mode goes through: budget, no-operation, drain victims, names."""

from __future__ import annotations

import pytest

from epp.planner.core.planner import build_policy, choose_drain, policy_for_mode
from epp.planner.core.types import EndpointLoad, Policy, Replicas, Role, RoleLoad
from tests.planner_helpers import config, obs, pd, profile

P, D, A = Role.PREFILL, Role.DECODE, Role.AGGREGATED


def ep(name, role=A, reqs=0, toks=0):
    return EndpointLoad(name, role, in_flight_requests=reqs, in_flight_tokens=toks)


def test_drain_least_in_flight_work_first_after_cancelling_starting():
    endpoints = (ep("a", reqs=5), ep("b", reqs=1, toks=900), ep("c", reqs=1, toks=100), ep("d"))
    seen = obs(replicas={A: Replicas(ready=4, starting=1)}, endpoints=endpoints)
    # 5 active -> 2: cancel the 1 starting, drain 2 ready: d (0 requests), then c
    # (1 request, 100 tokens) before b (1 request, 900 tokens)
    assert choose_drain(seen, {A: 5}, {A: 2}) == ("d", "c")
    # 5 -> 4: the starting replica covers it, nothing drained
    assert choose_drain(seen, {A: 5}, {A: 4}) == ()


def test_a_scale_down_decision_names_its_victims():
    pol = build_policy("load", config(mode="load"))
    seen = obs(
        30,
        replicas={A: Replicas(ready=3)},
        roles={A: RoleLoad(samples=30, kv_mean=0.1)},
        endpoints=(ep("x", reqs=4), ep("y", reqs=2), ep("z", reqs=3)),
    )
    d = pol.step(30, seen)
    assert d.targets == {A: 2} and d.drain == ("y",)


def test_budget_cut_keeps_the_pool_balanced_and_reports_it():
    # epp mode, P/D, all options off: 6000 req / 60 s = 100 req/s.
    # prefill 100 × 75 ms = 7.5 replicas -> 8; decode 100 × 150 / 10 000 = 1.5 -> 2 (10 GPUs).
    # Budget 6, water-filling from the floors P1 D1 on demand P 7.5, D 1.5: shares 1/7.5
    # and 1/1.5 = 0.67 -> prefill gets replicas until P5 (5/7.5 = 0.67), 6 GPUs used.
    # Dynamo's proportional round: scale 0.6, P = round(4.8) = 5, D = round(1) = 1: the same
    # here, but it keeps no guarantee (test_planner_budget).
    cfg = config(
        mode="sla",
        pool="disaggregated",
        adjustment_interval=60,
        load_predictor="constant",
        itl=10,
        no_correction=True,
        queue_aware_prefill=False,
        startup_time=0,
        forecast_quantile=0.5,
        max_gpu_budget=6,
    )
    d = build_policy("epp", cfg, profile()).step(60, obs(completions=6000, replicas=pd(1, 1)))
    assert d.gpus({P: 1, D: 1}) <= 6
    assert d.targets == {P: 5, D: 1}
    assert d.diagnostics["gpus_wanted"] == 10 and d.diagnostics["budget_cut_gpus"] == 4
    assert "cut to P5 D1 = 6 GPUs" in d.reason


def test_policies_are_policies_with_their_intervals():
    for name in ("load", "dynamo", "epp"):
        pol = build_policy(name, config(adjustment_interval=45), profile())
        typed: Policy = pol  # satisfies the Policy protocol (checked by the type checker)
        assert callable(typed.step)
        assert pol.name == name and pol.interval_s == 45 and pol.sample_interval_s == 1.0
    assert policy_for_mode(config(mode="load")).name == "load"
    assert policy_for_mode(config(mode="sla"), profile()).name == "epp"


def test_unknown_policy_and_missing_profile_are_clear_errors():
    with pytest.raises(ValueError, match="unknown policy 'static'; choose one of epp, dynamo"):
        build_policy("static", config())
    with pytest.raises(ValueError, match="needs a profile: run epp profile"):
        build_policy("epp", config())
