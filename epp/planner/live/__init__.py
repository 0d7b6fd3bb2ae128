"""The planner beside a real pool: its thread, its observations, its log, its connectors.

Everything here does I/O; the decisions themselves come from `epp.planner.core`.
"""
