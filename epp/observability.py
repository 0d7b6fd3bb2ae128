"""The EPP's own Prometheus metrics, named as the upstream EPP names them.

Names, types and labels follow the Gateway API Inference Extension's tables so existing
dashboards work unchanged. Metrics live in one module-level registry; the pool gauges
are computed at scrape time from the datastore (no timer thread, never stale).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp import __version__

log = logging.getLogger("epp")

REGISTRY = CollectorRegistry(auto_describe=True)

# Upstream buckets: 0.1 ms … 100 ms for scheduler and plugin latency.
_LATENCY_BUCKETS = (
    0.0001,
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
)

SCHEDULER_ATTEMPTS = Counter(
    "inference_extension_scheduler_attempts",
    "Number of scheduling attempts and their outcomes.",
    ["status", "target_model_name", "pod_name", "namespace", "port"],
    registry=REGISTRY,
)
SCHEDULER_E2E = Histogram(
    "inference_extension_scheduler_e2e_duration_seconds",
    "End-to-end scheduling latency.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PLUGIN_DURATION = Histogram(
    "inference_extension_plugin_duration_seconds",
    "Processing latency for each plugin.",
    ["extension_point", "plugin_type", "plugin_name"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
INFO = Gauge(
    "inference_extension_info",
    "EPP build information.",
    ["commit", "build_ref"],
    registry=REGISTRY,
)
INFO.labels(commit="unknown", build_ref=__version__).set(1)

# A client chooses the model name (body, rewrite header): as a label it must be bounded
# in count and length, or /metrics grows without limit (issue 13: 50 requests with 1 MB
# names made it 341 MB). Names the pool does not serve share OTHER_MODEL.
OTHER_MODEL = "other"
MAX_LABEL_CHARS = 128


def model_label(name: str, served: Container[str]) -> str:
    """The label for a model name: itself if the pool serves it (cut to MAX_LABEL_CHARS),
    else OTHER_MODEL; "" (no model, e.g. a GET) stays ""."""
    if not name:
        return ""
    return name[:MAX_LABEL_CHARS] if name in served else OTHER_MODEL


REQUESTS_TOTAL = Counter(
    "inference_objective_request",
    "Requests handled, by incoming and target model.",
    ["model_name", "target_model_name", "priority"],
    registry=REGISTRY,
)
REQUEST_ERRORS = Counter(
    "inference_objective_request_error",
    "Requests refused by the EPP, by error code.",
    ["model_name", "target_model_name", "error_code"],
    registry=REGISTRY,
)


class PoolCollector(Collector):
    """inference_pool_* gauges computed from the datastore's healthy endpoints."""

    def __init__(self, pool_name: str, snapshot: Callable[[], list]) -> None:
        self.pool_name = pool_name
        self.snapshot = snapshot

    def collect(self):  # type: ignore[override]
        snaps = [s for s in self.snapshot() if s.healthy]
        n = len(snaps)
        name = self.pool_name
        ready = GaugeMetricFamily(
            "inference_pool_ready_pods", "Number of ready pods in the pool", labels=["name"]
        )
        ready.add_metric([name], n)
        kv = GaugeMetricFamily(
            "inference_pool_average_kv_cache_utilization",
            "Average KV cache utilization across the pool",
            labels=["name"],
        )
        q = GaugeMetricFamily(
            "inference_pool_average_queue_size",
            "Average number of pending requests across the pool",
            labels=["name"],
        )
        run = GaugeMetricFamily(
            "inference_pool_average_running_requests",
            "Average number of running requests across the pool",
            labels=["name"],
        )
        per_pod = GaugeMetricFamily(
            "inference_pool_per_pod_queue_size",
            "Queue size for each individual pod",
            labels=["model_server_pod", "name"],
        )
        if n:
            kv.add_metric([name], sum(s.metrics.kv_cache_usage for s in snaps) / n)
            q.add_metric([name], sum(s.metrics.waiting_queue_size for s in snaps) / n)
            run.add_metric([name], sum(s.metrics.running_requests for s in snaps) / n)
        else:
            for fam in (kv, q, run):
                fam.add_metric([name], 0.0)
        for s in snaps:
            per_pod.add_metric([s.name, name], s.metrics.waiting_queue_size)
        yield from (ready, kv, q, run, per_pod)

    def describe(self):  # type: ignore[override]
        return []


_pool_collector: PoolCollector | None = None


def register_pool(pool_name: str, snapshot: Callable[[], list]) -> PoolCollector:
    """Point the pool gauges at a datastore (the last server started in a process wins)."""
    global _pool_collector
    if _pool_collector is None:
        _pool_collector = PoolCollector(pool_name, snapshot)
        REGISTRY.register(_pool_collector)
    else:
        _pool_collector.pool_name = pool_name
        _pool_collector.snapshot = snapshot
    return _pool_collector
