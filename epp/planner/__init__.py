"""The planner: how many model servers the pool should have, per role.

Rooms (PURE = no I/O, no clock, no threads; `tests/unit/test_planner_purity.py`
checks the imports):

- `types.py` PURE: Observation, Replicas, Decision, the Policy protocol.
- `window.py` PURE: one interval's requests and pool samples -> Observation.
- `pool.py` PURE: the replay's replicas (virtual-time `epp.sim.virtual` engines that
  start, serve, drain) and the EPP's default routing in front of them.
- `replay.py` PURE: a trace through a policy and a pool, in virtual time -> Run.
- `outcome.py` PURE: a Run judged: per-interval rows, GPU-hours, SLA shares, reversals.
- `static.py` PURE: the static-peak / static-mean baselines and their sizing.
- `compare.py` PURE: every policy on the same trace, pool and SLA.
- `cli.py` I/O: `epp plan replay`, `epp plan bursty`; `plots.py` I/O: the timeline.

Planned (see docs/ARCHITECTURE.md "The planner"): `config.py`, `predictors/`,
`perf.py`, `budget.py`, `load_mode.py`, `sla_mode.py`, `faithful.py`, `planner.py`
(all PURE), `traces.py` (PURE), `profiler/`
(`epp profile`), and the I/O side for `epp serve` (the planner thread, connectors).
"""
