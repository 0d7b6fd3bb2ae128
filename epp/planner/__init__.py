"""The planner: how many model servers the pool should have, per role.

Rooms (PURE = no I/O, no clock, no threads; `tests/unit/test_planner_purity.py`
checks the imports):

- `types.py` PURE: Observation, Replicas, Decision, the Policy protocol.
- `window.py` PURE: one interval's requests and pool samples -> Observation.

Planned (see docs/ARCHITECTURE.md "The planner"): `config.py`, `predictors/`,
`perf.py`, `budget.py`, `load_mode.py`, `sla_mode.py`, `faithful.py`, `planner.py`
(all PURE), `traces.py` and `replay.py` (PURE: the offline what-if), `profiler/`
(`epp profile`), and the I/O side for `epp serve` (the planner thread, connectors).
"""
