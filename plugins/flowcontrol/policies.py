"""Flow-control policies, named from the config's `flowControl:` section by reference.

Upstream's types and defaults (gie-epp.md §3.3 "Flow-control plugins"); the queue
(epp/flowcontrol/queue.py) carries out what each one selects:

- `round-robin-fairness-policy`: the flows (fairness ids) of a band take turns, one
  request each; the default here, since per-tenant fairness is what flow control is for
  (upstream's default is `global-strict-fairness-policy`).
- `global-strict-fairness-policy`: the band is one FCFS queue whatever the fairness id.
- `fcfs-ordering-policy`: within a flow, first come first served (the default).
- `edf-ordering-policy`: earliest deadline first, deadline = enqueue time + the request's
  effective TTL (`x-llm-d-inference-ttl`, bounded by `defaultRequestTTL`); no TTL sorts
  last; ties FCFS (GIE `ordering/edf/edf.go`). With one TTL for every request it is FCFS.
- `slo-deadline-ordering-policy`: deadline = arrival + `x-slo-ttft-ms` (GIE
  `ordering/slodeadline`): the request whose first token is due soonest goes first;
  requests without the header after every one with it.
- `static-usage-limit-policy`: dispatch while the pool's saturation < `threshold`; a
  sheddable request passes only below `sheddableThreshold` (not upstream's: its open
  ask for priority-based holdback, GIE #2265), so bursts of sheddable traffic leave room
  for the critical requests that arrive next instead of filling every slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from epp.config.params import NoParams, param
from epp.flowcontrol.queue import EDF, FCFS, GLOBAL_STRICT, ROUND_ROBIN, SLO_DEADLINE
from epp.scheduling.interfaces import Plugin
from epp.scheduling.registry import Handle, register


class _Policy(Plugin):
    Params = NoParams
    policy_kind: ClassVar[str] = ""

    def __init__(self, name: str, params: object, handle: Handle) -> None:
        super().__init__(name)
        self.params = params


@register("round-robin-fairness-policy")
class RoundRobinFairness(_Policy):
    policy_kind = "fairness"
    fairness = ROUND_ROBIN


@register("global-strict-fairness-policy")
class GlobalStrictFairness(_Policy):
    policy_kind = "fairness"
    fairness = GLOBAL_STRICT


@register("fcfs-ordering-policy")
class FcfsOrdering(_Policy):
    policy_kind = "ordering"
    ordering = FCFS


@register("edf-ordering-policy")
class EdfOrdering(_Policy):
    policy_kind = "ordering"
    ordering = EDF


@register("slo-deadline-ordering-policy")
class SloDeadlineOrdering(_Policy):
    policy_kind = "ordering"
    ordering = SLO_DEADLINE


@dataclass(frozen=True)
class UsageLimitParams:
    threshold: float = param(
        1.0, min=0.0, doc="dispatch while the saturation detector reports less than this"
    )
    sheddable_threshold: float = param(
        0.0,
        min=0.0,
        doc="sheddable requests pass only below this saturation (0 = threshold); lower "
        "keeps room for priority >= 0 (priority-based holdback, GIE #2265)",
    )

    def validate(self) -> None:
        if self.sheddable_threshold > self.threshold:
            raise ValueError(
                f"sheddableThreshold ({self.sheddable_threshold:g}) must be at most threshold "
                f"({self.threshold:g}): sheddable requests never get more room than others"
            )


@register("static-usage-limit-policy")
class StaticUsageLimit(_Policy):
    Params = UsageLimitParams  # type: ignore[assignment]
    policy_kind = "usage-limit"
