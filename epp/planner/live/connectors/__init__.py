"""Connectors carry out the planner's decisions on a real pool.

- `base.py` (pure): the `Connector` Protocol every driver satisfies.
- `statefile.py` (pure): the local connector's statefile codec (which workers it started).
- `local.py` (I/O): model-server processes on this machine from a command template.
- `reference_client.py` (I/O): `epp planner-client`, an environment for `virtual` that
  carries decisions out with `epp sim` processes and an endpoints file.
"""
