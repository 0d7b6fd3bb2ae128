"""`/status.json`: what the status page shows, built only when it is asked for.

Reads the datastore's snapshot, the decision ring, the prefix indexer's metrics (by
name from the EPP's registry, so the framework imports no plugin) and the planner
thread's last decisions. Nothing here runs on the request path.
"""

from __future__ import annotations

import math
import time
from typing import Any

from prometheus_client import CollectorRegistry

from epp import __version__
from epp.datastore import Datastore, EndpointSnapshot
from epp.planner.live.loop import PlannerThread
from epp.status.ring import DecisionRing

PLANNER_DECISIONS_SHOWN = 10
_PREFIX = "inference_extension_prefix_indexer_"


def status(
    pool: str,
    datastore: Datastore,
    ring: DecisionRing,
    registry: CollectorRegistry,
    planner: PlannerThread | None,
    commit: str,
) -> dict[str, Any]:
    now = datastore.clock()
    scores = ring.last_scores()
    return {
        "pool": pool,
        "version": __version__,
        "commit": commit,
        "time": time.time(),
        "endpoints": [
            _endpoint(s, datastore, scores.get(s.name), now) for s in datastore.snapshot()
        ],
        "decisions": ring.rows(),
        "decisions_total": ring.total,
        "prefix": prefix_index(registry),
        "planner": _planner(planner),
    }


def _endpoint(
    s: EndpointSnapshot, ds: Datastore, score: dict[str, Any] | None, now: float
) -> dict[str, Any]:
    m = s.metrics
    age = now - m.update_time if m.update_time else None
    return {
        "name": s.name,
        "address": s.hostport,
        "role": s.endpoint.role or "",
        "healthy": s.healthy,
        "draining": s.draining,
        "last_error": ds.last_error(s.name),
        "metrics_age_s": None if age is None else round(age, 3),
        "waiting": m.waiting_queue_size,
        "running": m.running_requests,
        "kv_cache_usage": m.kv_cache_usage,
        "lora_active": sorted(m.active_models),
        "lora_waiting": sorted(m.waiting_models),
        "inflight_requests": s.inflight_requests,
        "last_score": score,
    }


def prefix_index(registry: CollectorRegistry) -> dict[str, Any] | None:
    """Indexer size, lookups, hit rate (share of lookups that matched anything: all
    but the `le="0.0"` bucket of the hit-ratio histogram) and the mean hit ratio; None
    when no prefix plugin has recorded anything."""
    values: dict[str, float] = {}
    for family in registry.collect():
        if not family.name.startswith(_PREFIX):
            continue
        for sample in family.samples:
            key = sample.name
            if key.endswith("_bucket"):
                if sample.labels.get("le") not in ("0.0", "0"):
                    continue
                key += "_le0"
            values[key] = sample.value
    lookups = values.get(_PREFIX + "hit_ratio_count", 0.0)
    if not values or (lookups == 0 and not values.get(_PREFIX + "size")):
        return None
    misses = values.get(_PREFIX + "hit_ratio_bucket_le0", 0.0)
    return {
        "size": values.get(_PREFIX + "size", 0.0),
        "lookups": lookups,
        "hit_rate": (lookups - misses) / lookups if lookups else None,
        "mean_hit_ratio": values.get(_PREFIX + "hit_ratio_sum", 0.0) / lookups if lookups else None,
    }


def _num(x: float) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else round(x, 4)


def _planner(planner: PlannerThread | None) -> dict[str, Any] | None:
    if planner is None:
        return None
    replicas = {
        role.value: {"ready": r.ready, "starting": r.starting, "draining": r.draining}
        for role, r in planner.connector.replicas().items()
    }
    recent = list(planner.decisions.copy())[-PLANNER_DECISIONS_SHOWN:]
    return {
        "policy": type(planner.policy).__name__,
        "no_operation": planner.no_operation,
        "replicas": replicas,
        "dropped_observations": planner.dropped,
        "decisions": [
            {
                "at": d.at,
                "targets": {r.value: n for r, n in d.targets.items()},
                "reason": d.reason,
                "predicted_requests": _num(d.predicted.requests),
                "drain": list(d.drain),
            }
            for d in reversed(recent)
        ],
    }
