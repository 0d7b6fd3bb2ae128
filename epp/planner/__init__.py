"""The planner: how many model servers the pool should have, per role.

Rooms (PURE = no I/O, no clock, no threads; `tests/unit/test_planner_purity.py`
checks the imports):

- `types.py` PURE: Observation, Replicas, Decision, the Policy protocol.
- `window.py` PURE: one interval's requests and pool samples -> Observation.
- `config.py` PURE: the planner file (Dynamo's flag names) -> PlannerConfig.
- `perf.py` PURE: interpolation over the profiler's NPZ arrays; `load_profile(dir)`
  is its one file read.
- `budget.py` PURE: `fit_budget`, the one GPU-budget clamp (never above the budget).
- `queueing.py` PURE: the G/G/c prefill queue behind queue-aware sizing.
- `mode.py` PURE: what a mode proposes (`Proposal`, `Mode`).
- `load_mode.py`, `faithful.py`, `sla_mode.py` PURE: LOAD-v0, Dynamo SLA-v1 as is,
  this project's SLA mode.
- `planner.py` PURE: `build_policy(name, config, profile)`: a mode behind the common
  wrapper (budget, no-operation, drain victims); what the replay and the live loop call.

Planned (see docs/ARCHITECTURE.md "The planner"): `predictors/`, `traces.py` and
`replay.py` (PURE: the offline what-if), `profiler/` (`epp profile`), and the I/O side
for `epp serve` (the planner thread, connectors).
"""
