"""The planner's pure core: what the live loop and the replay both decide with.

No I/O, no clock, no threads (`tests/unit/test_planner_purity.py`), so a replay in
virtual time runs the very decisions `epp serve --planner` runs.
"""
