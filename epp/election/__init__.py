"""Leader election among several EPP replicas: only the leader's planner acts.

Routing is active-active (every replica schedules; see docs/ARCHITECTURE.md "Several
replicas"), but pool sizing must have one author, or two planners would each start the
replicas the pool lacks. `base.py` is the `Elector` interface the planner asks
(`is_leader()`); `lockfile.py` elects among processes on one machine (the local
connector); `lease.py` among pods with a Kubernetes Lease (coordination.k8s.io/v1);
`cli.py` holds the `epp serve` flags.
"""
