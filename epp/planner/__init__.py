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
- `predictors/` PURE: load predictors (constant, kalman, arima, prophet) for the next
  intervals' request count, ISL and OSL; `LoadPredictors`, `warm_up`.
- `traces.py` PURE: Mooncake JSONL / Azure CSV lines -> arrivals; per-interval load.
- `tracegen.py` PURE: a seeded bursty trace; rate scaling for fleet-size replays.
- `tracefile.py` I/O: `load_trace(path)`, the one place a trace file is opened.
- `profiler/`: `epp profile` (plan, measure, results PURE; sweep, plots, cli I/O).
- `pool.py` PURE: the replay's replicas (virtual-time `epp.sim.virtual` engines that
  start, serve, drain) and the EPP's default routing in front of them.
- `replay.py` PURE: a trace through a policy and a pool, in virtual time -> Run.
- `outcome.py` PURE: a Run judged: per-interval rows, GPU-hours, SLA shares, reversals.
- `static.py` PURE: the static-peak / static-mean baselines and their sizing.
- `compare.py` PURE: every policy on the same trace, pool and SLA.
- `cli.py` I/O: `epp plan replay`, `epp plan bursty`; `plots.py` I/O: the timeline.
"""
