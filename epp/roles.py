"""Which job an endpoint does (its `llm-d.ai/role` label) and the pool's load per role.

The load-based planner (seed `002_*`) sizes prefill replicas by their queue and decode
replicas by their KV-cache use, so in a P/D pool it needs the two roles apart; an
aggregated pool has one role. Pure: computed from a datastore snapshot by the caller
(the `/metrics` collector at scrape time, the planner loop at each pulling tick).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from epp.datastore import Endpoint, EndpointSnapshot
from epp.records import PoolSample, Role

# llm-d's label values: "prefill", "decode", "both" (or none) for an aggregated server.
_ROLES = {"prefill": Role.PREFILL, "decode": Role.DECODE}


def role_of(endpoint: Endpoint) -> Role:
    return _ROLES.get(endpoint.role or "", Role.AGGREGATED)


def pool_samples(snapshots: Iterable[EndpointSnapshot]) -> list[PoolSample]:
    """One sample per role present among the healthy, not draining endpoints (waiting and running
    summed, KV use averaged over the role's ready replicas)."""
    by_role: dict[Role, list[EndpointSnapshot]] = {}
    for s in snapshots:
        if s.healthy and not s.draining:
            by_role.setdefault(role_of(s.endpoint), []).append(s)
    return [
        PoolSample(
            role=role,
            waiting=sum(s.metrics.waiting_queue_size for s in snaps),
            running=sum(s.metrics.running_requests for s in snaps),
            kv_mean=math.fsum(s.metrics.kv_cache_usage for s in snaps) / len(snaps),
            ready=len(snaps),
        )
        for role, snaps in sorted(by_role.items())
    ]
