"""`epp profile`: the pre-deployment profiler of Dynamo (`profile_sla.py`).

- `plan.py` PURE: which points to measure (Dynamo's grids and rounding).
- `measure.py` PURE: token times -> steady ITL and tokens/s.
- `results.py` PURE: Dynamo's array names, the recommendation and its lines.
- `driver.py` PURE: walks the plan over any `Target` (comparison, pick, in-depth sweep).
- `virtual.py` PURE: a `Target` that runs a sim preset in virtual time.
- `sweep.py` I/O: a `Target` over HTTP (streamed completions, /metrics), progress bar.
- `plots.py` I/O: the two PNGs. `cli.py` I/O: flags, files, exit codes.
"""
