"""What a scaling mode proposes, before the common wrapper (`planner.py`) applies the
budget, the floors, `no-operation` and the choice of replicas to drain.

A mode (`load_mode`, `faithful`, `sla_mode`) only answers "how many replicas per role
does this interval call for, and why". Keeping the budget and victim choice out of
the modes means there is one copy of each (the budget's never-exceed rule cannot drift
between modes), and the Dynamo-faithful mode can still apply Dynamo's own round()
budget first: the wrapper then shows where Dynamo's result would have broken the
budget (#12428) instead of silently fixing it inside the baseline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from epp.planner.core.types import Observation, PredictedLoad, Role


@dataclass(frozen=True, slots=True)
class Proposal:
    """A mode's answer for one interval.

    `targets` are replicas per role (every role of the pool). `demand` is each role's
    need in replicas, fractional, when the mode knows it: the budget uses it to decide
    which role a cut hurts least. `diagnostics` are the numbers behind the answer
    (correction factors, interpolated throughput...), copied into the Decision.
    """

    targets: Mapping[Role, int]
    reason: str
    predicted: PredictedLoad = PredictedLoad()
    demand: Mapping[Role, float] | None = None
    diagnostics: Mapping[str, float] = field(default_factory=dict)


class Mode(Protocol):
    name: str

    def propose(self, now: float, obs: Observation) -> Proposal:
        """Targets for this interval. Pure apart from the mode's own state."""
        ...

    def committed(self, targets: Mapping[Role, int], obs: Observation) -> None:
        """The targets the wrapper actually decided (after the budget), so a mode's
        memory (grace periods, cooldowns) follows what happened, not what it wished."""
        ...


def current(obs: Observation, roles: tuple[Role, ...]) -> dict[Role, int]:
    """Each role's active replicas (ready + starting): what a target is compared with."""
    return {r: obs.replicas_of(r).active for r in roles}
