"""fit_budget: the budget holds whatever the rounding; a cut keeps the least-served role
as well served as the budget allows."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.planner.core.budget import BudgetError, fit_budget, gpus_of
from epp.planner.core.types import Role

P, D, A = Role.PREFILL, Role.DECODE, Role.AGGREGATED
ONE = {P: 1, D: 1, A: 1}


def test_within_budget_targets_stand_floored_at_min_endpoint():
    out, reason = fit_budget({P: 0, D: 3}, gpus_per_replica=ONE, min_replicas=1, max_gpus=8)
    # P floored 0 -> 1; 1 + 3 = 4 GPUs <= 8
    assert out == {P: 1, D: 3} and reason == ""


def test_where_dynamo_rounds_past_the_budget_we_stay_inside():
    # SLA-v1 §1.6, min_endpoint 2, budget 4, 1 GPU each, wanted P10 D1 -> floors P10 D2 =
    # 12 GPUs; scale = 4/12; P = max(2, round(10/3 = 3.33)) = 3; D = max(2, round(4 - 3)) = 2
    # -> 5 GPUs > 4. Here: floors P2 D2 = 4 GPUs already fill the budget -> P2 D2.
    out, reason = fit_budget({P: 10, D: 1}, gpus_per_replica=ONE, min_replicas=2, max_gpus=4)
    assert out == {P: 2, D: 2} and gpus_of(out, ONE) == 4
    assert "wanted P10 D2 = 12 GPUs > max-gpu-budget 4" in reason


def test_floors_above_the_budget_are_an_error_naming_the_keys():
    # min-endpoint 1 x (1 GPU prefill + 2 GPU decode) = 3 > budget 2
    with pytest.raises(BudgetError, match="max-gpu-budget 2 is below min-endpoint 1"):
        fit_budget({P: 3, D: 4}, gpus_per_replica={P: 1, D: 2}, min_replicas=1, max_gpus=2)


def test_cut_maximises_the_least_served_share():
    # Want P4 D4 (8 GPUs), budget 6, 1 GPU each, demand P 4.0, D 2.0 replicas.
    # Proportional: scale 6/8 -> P3 D3, shares 3/4 = 0.75, 3/2 = 1.5 (D over-served).
    # Max-min: D's target is 4 (ceiling) but its demand is 2; giving P 4 and D 2 ->
    # shares 4/4 = 1.0, 2/2 = 1.0: both fully served.
    out, reason = fit_budget(
        {P: 4, D: 4},
        gpus_per_replica=ONE,
        min_replicas=1,
        max_gpus=6,
        demand={P: 4.0, D: 2.0},
    )
    assert out == {P: 4, D: 2}
    assert "cut to P4 D2 = 6 GPUs" in reason and "100%" in reason


def test_cut_with_unequal_engines():
    # P engines 2 GPUs, D engines 1 GPU; want P3 D4 = 6 + 4 = 10 GPUs, budget 7.
    # Floors P1 D1 = 3 GPUs, shares 1/3, 1/4 -> D lowest: D2 (4 GPUs), shares 1/3, 2/4
    # -> P lowest: P2 (6 GPUs), shares 2/3, 2/4 -> D: D3 (7 GPUs), shares 2/3, 3/4
    # -> P needs 2 GPUs, 0 left; D needs 1, 0 left: stop at P2 D3 = 7 GPUs, min share 2/3.
    out, _ = fit_budget({P: 3, D: 4}, gpus_per_replica={P: 2, D: 1}, min_replicas=1, max_gpus=7)
    assert out == {P: 2, D: 3} and gpus_of(out, {P: 2, D: 1}) == 7


def test_no_bound_and_min_gpus_fill():
    out, reason = fit_budget({A: 1}, gpus_per_replica={A: 2}, min_replicas=0, max_gpus=None)
    assert out == {A: 1} and reason == ""
    # min-gpu-budget 4 with one 2-GPU aggregated replica: 2 GPUs < 4 -> add one -> 4 GPUs.
    out, reason = fit_budget(
        {A: 1}, gpus_per_replica={A: 2}, min_replicas=0, max_gpus=None, min_gpus=4
    )
    assert out == {A: 2} and "min-gpu-budget 4" in reason


def test_min_gpus_above_max_is_an_error():
    with pytest.raises(BudgetError, match="min-gpu-budget 9 is above max-gpu-budget 8"):
        fit_budget({A: 1}, gpus_per_replica=ONE, min_replicas=1, max_gpus=8, min_gpus=9)


def test_scale_to_zero_allowed_with_min_endpoint_zero():
    out, _ = fit_budget({P: 0, D: 0}, gpus_per_replica=ONE, min_replicas=0, max_gpus=4)
    assert out == {P: 0, D: 0}


def brute_force_best_min_share(want, need, gpus, min_r, budget):
    best = -1.0
    ranges = [range(min_r, max(want[r], min_r) + 1) for r in want]
    for combo in itertools.product(*ranges):
        counts = dict(zip(want, combo, strict=True))
        if gpus_of(counts, gpus) > budget:
            continue
        shares = [c / need[r] if need[r] > 0 else math.inf for r, c in counts.items()]
        finite = [s for s in shares if s != math.inf] or [1.0]
        best = max(best, min(finite))
    return best


@settings(deadline=None, derandomize=True, max_examples=300)  # no timing, reproducible
@given(
    p=st.integers(0, 12),
    d=st.integers(0, 12),
    gp=st.integers(1, 4),
    gd=st.integers(1, 4),
    min_r=st.integers(0, 2),
    budget=st.integers(0, 40),
    need_p=st.floats(0, 12),
    need_d=st.floats(0, 12),
)
def test_never_above_the_budget_and_best_min_share(p, d, gp, gd, min_r, budget, need_p, need_d):
    gpus = {P: gp, D: gd}
    want = {P: p, D: d}
    need = {P: need_p, D: need_d}
    if min_r * (gp + gd) > budget:
        with pytest.raises(BudgetError):
            fit_budget(want, gpus_per_replica=gpus, min_replicas=min_r, max_gpus=budget)
        return
    out, _ = fit_budget(
        want, gpus_per_replica=gpus, min_replicas=min_r, max_gpus=budget, demand=need
    )
    assert gpus_of(out, gpus) <= budget
    assert all(min_r <= out[r] <= max(want[r], min_r) for r in want)
    floored = {r: max(n, min_r) for r, n in want.items()}
    if gpus_of(floored, gpus) > budget:
        shares = [out[r] / need[r] if need[r] > 0 else math.inf for r in out]
        got = min([s for s in shares if s != math.inf] or [1.0])
        assert got == pytest.approx(brute_force_best_min_share(floored, need, gpus, min_r, budget))
    else:
        assert out == floored
