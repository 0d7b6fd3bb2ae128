"""The planner: how many model servers the pool should have, per role.

The folder is the architecture; each room has one role:

- `core/` PURE (no I/O, no clock, no threads; `tests/unit/test_planner_purity.py` checks
  the whole folder): the decisions the live loop and the replay both run. The boundary
  types (`types.py`), one interval's gathering (`window.py`), the planner file
  (`config.py`, Dynamo's flag names), the profile interpolation (`perf.py`), the GPU
  budget (`budget.py`), the prefill queue (`queueing.py`), the modes (`load_mode.py`:
  LOAD-v0; `faithful.py`: Dynamo SLA-v1 as is; `sla_mode.py` composing
  `sla_corrections.py` (the correction factors), `sla_sizing.py` (replicas against the
  profile) and `sla_damping.py` (window, reversal guard, rise headroom), with
  `attainment.py`: this project's SLA mode), the common wrapper
  (`planner.py`: `build_policy`), load forecasts (`predictors/`) and drain bookkeeping
  (`drain.py`).
- `live/` I/O: the planner running beside a real pool. The thread inside `epp serve`
  (`loop.py`), its observations (`source.py` from Prometheus), its decision log
  (`record.py`, `tensorboard.py`), the planner as its own process (`standalone.py`) and
  the connectors that carry decisions out (`connectors/`: local processes, Kubernetes,
  Dynamo's virtual connector).
- `offline/` PURE: judging policies on recorded or generated traffic in virtual time.
  Trace parsing and generation (`traces.py`, `tracegen.py`), the simulated pool
  (`pool.py`), the replay (`replay.py`), its judgement (`outcome.py`), the static
  baselines (`static.py`), the SLA pick (`sla_pick.py`), the field's laws and the oracle
  (`laws/`) and the side-by-side comparison (`compare.py`).
- `profiler/`: `epp profile` (plan, measure, results pure; sweep, plots, cli I/O).
- `cli.py`, `plots.py`, `tracefile.py`: thin I/O around `offline/` (`epp plan ...`, the
  timeline and Pareto plots, the one place a trace file is opened).
"""
