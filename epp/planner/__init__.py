"""The planner: how many model servers the pool should have, per role.

Rooms (PURE = no I/O, no clock, no threads; `tests/unit/test_planner_purity.py`
checks the imports):

- `types.py` PURE: Observation, Replicas, Decision, the Policy protocol.
- `window.py` PURE: one interval's requests and pool samples -> Observation.
- `predictors/` PURE: load predictors (constant, kalman, arima, prophet) for the next
  intervals' request count, ISL and OSL; `LoadPredictors`, `warm_up`.
- `traces.py` PURE: Mooncake JSONL / Azure CSV lines -> arrivals; per-interval load.
- `tracegen.py` PURE: a seeded bursty trace; rate scaling for fleet-size replays.
- `tracefile.py` I/O: `load_trace(path)`, the one place a trace file is opened.

Planned (see docs/ARCHITECTURE.md "The planner"): `config.py`,
`perf.py`, `budget.py`, `load_mode.py`, `sla_mode.py`, `faithful.py`, `planner.py`
(all PURE), `replay.py` (PURE: the offline what-if), `profiler/`
(`epp profile`), and the I/O side for `epp serve` (the planner thread, connectors).
"""
