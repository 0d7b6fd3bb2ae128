"""The one entry both the replay and the live loop call: `build_policy(name, config,
profile)` returns a `Policy` whose `step(now, obs)` runs a mode and then the wrapper
every mode shares:

1. the mode proposes targets per role (`mode.Proposal`);
2. `budget.fit_budget`: floors at `min-endpoint`, `min-gpu-budget`, and never above
   `max-gpu-budget` (a cut keeps the least-served role as well served as possible);
3. `no-operation`: the decision keeps the current replicas and says what it would do;
4. scale-down victims: for each role going down, starting replicas are cancelled first
   (they carry no work), then ready replicas are drained, least in-flight requests
   first (then fewest in-flight tokens, then name, so a replay is reproducible);
5. the mode is told what was decided (`committed`), so its grace periods and
   cooldowns follow what happened.

Policy names: "epp" (this project's SLA mode), "dynamo" (SLA-v1 faithful), "load"
(LOAD-v0). The replay adds its static policies in its own module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from epp.planner.core.budget import fit_budget, gpus_of
from epp.planner.core.config import PlannerConfig
from epp.planner.core.mode import Mode, current
from epp.planner.core.perf import Profile
from epp.planner.core.types import Decision, Observation, Role

POLICY_NAMES = ("epp", "dynamo", "load")
_SHORT = {Role.PREFILL: "P", Role.DECODE: "D", Role.AGGREGATED: "A"}


def label(targets: Mapping[Role, int]) -> str:
    return " ".join(f"{_SHORT[r]}{n}" for r, n in targets.items())


class Planner:
    """A mode behind the common wrapper; satisfies `types.Policy`."""

    def __init__(self, name: str, mode: Mode, config: PlannerConfig) -> None:
        self.name = name
        self.mode = mode
        self.config = config
        self.interval_s = config.interval_s
        self.sample_interval_s = config.planner.metric_pulling_interval
        self._roles = config.roles
        self._gpus = config.budget.gpus_per_replica()

    def step(self, now: float, obs: Observation) -> Decision:
        proposal = self.mode.propose(now, obs)
        b = self.config.budget
        wanted = {r: int(proposal.targets.get(r, 0)) for r in self._roles}
        targets, budget_note = fit_budget(
            wanted,
            gpus_per_replica=self._gpus,
            min_replicas=b.min_endpoint,
            max_gpus=b.max_gpu_budget,
            min_gpus=b.min_gpu_budget,
            demand=proposal.demand,
        )
        now_have = current(obs, self._roles)
        diag = dict(proposal.diagnostics)
        diag["gpus_wanted"] = float(gpus_of(wanted, self._gpus))
        diag["gpus"] = float(gpus_of(targets, self._gpus))
        diag["budget_cut_gpus"] = max(0.0, diag["gpus_wanted"] - diag["gpus"])
        reason = proposal.reason + (f"; {budget_note}" if budget_note else "")
        if self.config.planner.no_operation:
            reason = f"no-operation (would set {label(targets)}): {reason}"
            targets = now_have
        self.mode.committed(targets, obs)
        return Decision(
            at=now,
            targets=targets,
            reason=reason,
            predicted=proposal.predicted,
            drain=choose_drain(obs, now_have, targets),
            diagnostics=diag,
        )


def choose_drain(
    obs: Observation, have: Mapping[Role, int], targets: Mapping[Role, int]
) -> tuple[str, ...]:
    """Ready replicas to drain: per role, the excess over the target not covered by
    cancelling starting replicas, least in-flight work first."""
    names: list[str] = []
    for role, n in have.items():
        excess = n - targets.get(role, 0)
        from_ready = excess - obs.replicas_of(role).starting
        if from_ready <= 0:
            continue
        ranked = sorted(
            (e for e in obs.endpoints if e.role == role),
            key=lambda e: (e.in_flight_requests, e.in_flight_tokens, e.name),
        )
        names += [e.name for e in ranked[:from_ready]]
    return tuple(names)


def build_policy(
    name: str,
    config: PlannerConfig,
    profile: Profile | None = None,
    *,
    warmup: Iterable | None = None,
) -> Planner:
    """The policy `name` over `config`. The SLA policies need the profile
    (`perf.load_profile(config.planner.profile_results_dir)`, read by the caller);
    `warmup` is a trace's per-interval load (`traces.bucket`) fed to their predictors."""
    if name == "load":
        from epp.planner.core.load_mode import LoadMode

        return Planner(name, LoadMode(config), config)
    if name not in ("epp", "dynamo"):
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
    if profile is None:
        raise ValueError(
            f"policy {name!r} needs a profile: run epp profile and set profile-results-dir"
        )
    if name == "dynamo":
        from epp.planner.core.faithful import FaithfulMode

        mode: Mode = FaithfulMode(config, profile)
    else:
        from epp.planner.core.sla_mode import SlaMode

        mode = SlaMode(config, profile)
    if warmup is not None:
        from epp.planner.core.predictors import warm_up

        warm_up(mode.predictors, warmup)  # type: ignore[attr-defined]
    return Planner(name, mode, config)


def policy_for_mode(config: PlannerConfig, profile: Profile | None = None) -> Planner:
    """The policy the planner file's `mode` selects (load | sla | dynamo)."""
    return build_policy(
        {"load": "load", "sla": "epp", "dynamo": "dynamo"}[config.planner.mode], config, profile
    )
