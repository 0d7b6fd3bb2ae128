"""Policies judged offline: traces through a simulated pool in virtual time.

Pure like the core (no files, no clock): `epp.planner.tracefile` reads traces and
`epp.planner.plan_cli` prints; everything between is computation.
"""
