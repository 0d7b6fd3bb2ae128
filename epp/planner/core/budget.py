"""The GPU budget: pure primitives, no I/O, no state, no logging (the layering of
Dynamo's `core/budget.py`, with keyword arguments and `None` for "no bound").

`fit_budget` is the only copy of the clamp; every policy goes through it (via
`planner.py`). Two things differ from Dynamo on purpose:

- **The budget is never exceeded, whatever the rounding.** SLA-v1 (reference §1.6)
  scales proportionally with `round()` and floors at `min_endpoint`, so 3 P + 4 D on a
  5-GPU budget can come out at 6 GPUs; #12428 shows a P/D rebalance running past
  `max_gpu_budget`. Here the sum is checked, not estimated.
- **A cut keeps the pool balanced.** When the wanted replicas do not fit, the counts
  that maximise `min_r(n_r / demand_r)` win: the least-served role's share of its
  demand is as large as the budget allows (reference §10.4). Proportional rounding can
  starve one side (a P/D pool with 3 prefill for 1 decode serves at the decode's pace).

The search is greedy water-filling: start at the floors, repeatedly give one replica to
the role with the lowest served share that still fits. It is optimal for the minimum
share: each replica it gives goes to the role that is the bottleneck at that moment,
so any allocation with a higher minimum must contain it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from epp.planner.core.types import Role


class BudgetError(ValueError):
    """The floors alone do not fit: `min-endpoint` × roles × GPUs above the budget."""


def min_gpus_needed(
    roles: tuple[Role, ...], gpus_per_replica: Mapping[Role, int], min_replicas: int
) -> int:
    """GPUs the `min-endpoint` floors hold: what `max-gpu-budget` must at least allow."""
    return sum(min_replicas * gpus_per_replica.get(r, 1) for r in roles)


def gpus_of(targets: Mapping[Role, int], gpus_per_replica: Mapping[Role, int]) -> int:
    return sum(n * gpus_per_replica.get(r, 1) for r, n in targets.items())


def _label(targets: Mapping[Role, int]) -> str:
    short = {Role.PREFILL: "P", Role.DECODE: "D", Role.AGGREGATED: "A"}
    return " ".join(f"{short[r]}{targets[r]}" for r in sorted(targets, key=_order))


def _order(role: Role) -> int:
    return list(Role).index(role)


def fit_budget(
    targets: Mapping[Role, int],
    *,
    gpus_per_replica: Mapping[Role, int],
    min_replicas: int,
    max_gpus: int | None,
    min_gpus: int = 0,
    demand: Mapping[Role, float] | None = None,
) -> tuple[dict[Role, int], str]:
    """Targets floored at `min_replicas` and fitted to `[min_gpus, max_gpus]`.

    `demand` is each role's need in replicas, fractional (2.3 means "a bit more than two
    replicas' capacity"); it ranks the roles when the budget cuts or `min_gpus` adds.
    Without it the wanted targets stand in for it. Returns the targets and a reason
    (empty when nothing was changed beyond the floors). Raises BudgetError when the
    floors alone exceed `max_gpus` (the config check says so earlier, naming the key).
    """
    roles = tuple(sorted(targets, key=_order))
    for r in roles:
        if gpus_per_replica.get(r, 1) < 1:
            raise BudgetError(f"{r.value} replicas need at least 1 GPU each")
    want = {r: max(int(targets[r]), min_replicas) for r in roles}
    floor_gpus = min_gpus_needed(roles, gpus_per_replica, min_replicas)
    if max_gpus is not None and floor_gpus > max_gpus:
        raise BudgetError(
            f"max-gpu-budget {max_gpus} is below min-endpoint {min_replicas} × "
            f"{len(roles)} role(s) × their GPUs = {floor_gpus}"
        )
    if max_gpus is not None and min_gpus > max_gpus:
        raise BudgetError(f"min-gpu-budget {min_gpus} is above max-gpu-budget {max_gpus}")
    need = {r: float(demand[r]) if demand and r in demand else float(want[r]) for r in roles}
    total = gpus_of(want, gpus_per_replica)
    if max_gpus is not None and total > max_gpus:
        out = _water_fill({r: min_replicas for r in roles}, want, need, gpus_per_replica, max_gpus)
        served = _min_share(out, need)
        return out, (
            f"budget: wanted {_label(want)} = {total} GPUs > max-gpu-budget {max_gpus}; "
            f"cut to {_label(out)} = {gpus_of(out, gpus_per_replica)} GPUs "
            f"(least-served role gets {served:.0%} of its demand)"
        )
    if total < min_gpus and roles:
        ceiling = {r: math.inf for r in roles}
        out = dict(want)
        while gpus_of(out, gpus_per_replica) < min_gpus:
            room = None if max_gpus is None else max_gpus - gpus_of(out, gpus_per_replica)
            pick = _neediest(out, ceiling, need, gpus_per_replica, room, prefer_empty=True)
            if pick is None:
                break
            out[pick] += 1
        return out, (
            f"budget: {_label(want)} = {total} GPUs < min-gpu-budget {min_gpus}; "
            f"raised to {_label(out)} = {gpus_of(out, gpus_per_replica)} GPUs"
        )
    return want, ""


def _share(n: int, need: float) -> float:
    return math.inf if need <= 0 else n / need


def _min_share(counts: Mapping[Role, int], need: Mapping[Role, float]) -> float:
    shares = [_share(n, need[r]) for r, n in counts.items()]
    finite = [s for s in shares if s != math.inf]
    return min(finite) if finite else 1.0


def _neediest(
    counts: Mapping[Role, int],
    ceiling: Mapping[Role, float],
    need: Mapping[Role, float],
    gpus: Mapping[Role, int],
    room: int | None,
    *,
    prefer_empty: bool = False,
) -> Role | None:
    """The role with the lowest served share that may grow and fits in `room` GPUs;
    ties go to the cheaper replica, then to Role order (prefill first)."""
    candidates = [
        r for r in counts if counts[r] < ceiling[r] and (room is None or gpus.get(r, 1) <= room)
    ]
    if not candidates:
        return None

    def key(r: Role) -> tuple[float, int, int]:
        share = _share(counts[r], need[r])
        if prefer_empty and share == math.inf:
            share = counts[r]  # no demand: grow the smallest role last, but grow it
        return (share, gpus.get(r, 1), _order(r))

    return min(candidates, key=key)


def _water_fill(
    start: dict[Role, int],
    ceiling: Mapping[Role, int],
    need: Mapping[Role, float],
    gpus: Mapping[Role, int],
    max_gpus: int,
) -> dict[Role, int]:
    out = dict(start)
    while True:
        room = max_gpus - gpus_of(out, gpus)
        pick = _neediest(out, ceiling, need, gpus, room)
        if pick is None:
            return out
        out[pick] += 1
