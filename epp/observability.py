"""The EPP's own Prometheus metrics, named as the upstream EPP names them.

Names, types and labels follow the Gateway API Inference Extension's tables so existing
dashboards work unchanged. Metrics live in one module-level registry; the pool gauges
are computed at scrape time from the datastore (no timer thread, never stale).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp import __version__
from epp.loophist import LoopHistogram

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
# Observed on every request: lock-free histograms (epp/loophist.py), same exposition.
SCHEDULER_E2E = LoopHistogram(
    "inference_extension_scheduler_e2e_duration_seconds",
    "End-to-end scheduling latency.",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
PLUGIN_DURATION = LoopHistogram(
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


def set_build_info(commit: str) -> None:
    """One `inference_extension_info` series: this build's commit (epp/buildinfo.py)."""
    INFO.clear()
    INFO.labels(commit=commit, build_ref=__version__).set(1)


class _Untimed:
    """A timer child that records nothing (`Scheduler.stop_timing`)."""

    __slots__ = ()

    def observe(self, amount: float) -> None:
        pass


UNTIMED = _Untimed()


def plugin_timer(extension_point: str, plugin: object):
    """The `inference_extension_plugin_duration_seconds` child of one plugin at one
    extension point (GIE's names: PrepareData, ProfilePicker, Filter, Scorer, Picker,
    ProcessProfilesResults, PreRequest, PostResponse); resolve it once, observe per call."""
    return PLUGIN_DURATION.labels(
        extension_point=extension_point,
        plugin_type=getattr(plugin, "type_name", type(plugin).__name__),
        plugin_name=getattr(plugin, "name", ""),
    )


_CHILDREN: dict[tuple[object, tuple[str, ...]], Any] = {}


def adder(child: Any) -> Callable[[float], None]:
    """`add(x)`: what `child.inc(x)` does for a labelled counter or gauge child (x >= 0
    for a counter), in one call. `inc` first checks the child has its label values (a
    resolved child always has) through two more Python calls: eight per request for the
    director's four updates (docs/BENCHMARKS.md, request-path cost). The value's
    own `inc` keeps prometheus_client's lock and its multiprocess mode. A child without
    that value object (another client version) gets its `inc`."""
    value = getattr(child, "_value", None)
    inc = getattr(value, "inc", None)
    return inc if callable(inc) else child.inc


def labelled(metric: Any, *values: str) -> Any:
    """`metric.labels(*values)`, resolved once per label set and kept: `labels()` builds
    and checks a tuple and takes a lock on every call, and the director needs four
    children per request. The label sets are bounded as the metric's own children are
    (model names through `model_label`, the pool's endpoints); these metrics are never
    cleared, so a kept child is always the registered one."""
    key = (metric, values)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(*values)
    return child


# A client chooses the model name (body, rewrite header): as a label it must be bounded
# in count and length, or /metrics grows without limit (50 requests with 1 MB
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
# `--response-path observer` (epp/extproc/handoff.py): how each routed request's observer
# stream went. joined: measured; expired: none came within the join timeout (given back
# by the sweep, unmeasured); foreign: another replica's route id; unknown: no id of ours.
OBSERVER_JOINS = Counter(
    "epp_response_observer_joins",
    "Observer streams (--response-path observer) by outcome of the join to a routed request.",
    ["outcome"],
    registry=REGISTRY,
)
# `--response-path log` (epp/extproc/access_log.py): routed requests by how their
# response's access-log entry went. joined: measured; expired: no entry within
# --response-log-timeout (given back by the sweep, unmeasured); foreign: an entry for
# another replica's route id; unknown: an entry whose request is not (or no longer) held.
RESPONSE_LOG_ENTRIES = Counter(
    "epp_response_log_entries",
    "Access-log entries (--response-path log) by outcome of the join to a routed request.",
    ["outcome"],
    registry=REGISTRY,
)
# Every answer the EPP gives instead of routing (ImmediateResponse) and every running
# request it evicts, by why: a 429/503's `x-llm-d-request-dropped-reason` (epp/errors.py,
# llm-d-router's vocabulary), any other status's error code (bad_request, ...). Both are
# fixed strings in the code, never client text.
REQUESTS_REFUSED = Counter(
    "epp_requests_refused",
    "Requests the EPP refused or evicted, by dropped reason (429/503) or error code.",
    ["reason"],
    registry=REGISTRY,
)
REQUEST_ERRORS = Counter(
    "inference_objective_request_error",
    "Requests refused by the EPP, by error code.",
    ["model_name", "target_model_name", "error_code"],
    registry=REGISTRY,
)


# ---- per-response metrics (need a response path: `epp serve --response-path log` or on) ----
# Buckets from GIE pkg/epp/metrics/metrics.go: durations 5 ms … 1 h, tokens 1 … 1 Mi.
_DURATION_BUCKETS = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10,
    15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
_TOKEN_BUCKETS = tuple(2**i for i in range(21))  # 1 … 1,048,576
_TPOT_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 80.0,
)  # fmt: skip
_MODEL_LABELS = ["model_name", "target_model_name"]

REQUEST_DURATION = Histogram(
    "inference_objective_request_duration_seconds",
    "Time from routing to the end of the response.",
    _MODEL_LABELS,
    buckets=_DURATION_BUCKETS,
    registry=REGISTRY,
)
REQUEST_TTFT = Histogram(
    "inference_objective_request_ttft_seconds",
    "Time from routing to the first body chunk carrying a token.",
    _MODEL_LABELS,
    buckets=_DURATION_BUCKETS,
    registry=REGISTRY,
)
REQUEST_TPOT = Histogram(
    "inference_objective_request_tpot_seconds",
    "Mean gap between output tokens after the first (streamed responses).",
    _MODEL_LABELS,
    buckets=_TPOT_BUCKETS,
    registry=REGISTRY,
)
NORMALIZED_TPOT = Histogram(
    "inference_objective_normalized_time_per_output_token_seconds",
    "Request duration divided by its output tokens.",
    _MODEL_LABELS,
    buckets=_TPOT_BUCKETS,
    registry=REGISTRY,
)
INPUT_TOKENS = Histogram(
    "inference_objective_input_tokens",
    "Prompt tokens per request (usage, else the EPP's estimate).",
    _MODEL_LABELS,
    buckets=_TOKEN_BUCKETS,
    registry=REGISTRY,
)
OUTPUT_TOKENS = Histogram(
    "inference_objective_output_tokens",
    "Completion tokens per request (usage, else token-carrying events).",
    _MODEL_LABELS,
    buckets=_TOKEN_BUCKETS,
    registry=REGISTRY,
)
PROMPT_CACHED_TOKENS = Histogram(
    "inference_objective_prompt_cached_tokens",
    "Cached prompt tokens per request (usage.prompt_tokens_details.cached_tokens).",
    _MODEL_LABELS,
    buckets=_TOKEN_BUCKETS,
    registry=REGISTRY,
)
RUNNING_REQUESTS = Gauge(
    "inference_objective_running_requests",
    "Requests routed and not yet finished, by model.",
    ["model_name"],
    registry=REGISTRY,
)


# ---- the planner (epp/planner/live/record.py sets these after every decision) ----
PLANNER_REPLICAS = Gauge(
    "epp_planner_replicas",
    "Replicas per role: the planner's target, and what the connector has (ready, starting, "
    "draining).",
    ["role", "state"],
    registry=REGISTRY,
)
PLANNER_PREDICTED_REQUESTS = Gauge(
    "epp_planner_predicted_requests",
    "Requests the planner expects in the next adjustment interval (NaN: none predicted).",
    registry=REGISTRY,
)
PLANNER_OBSERVED_REQUESTS = Gauge(
    "epp_planner_observed_requests",
    "Requests admitted in the last adjustment interval.",
    registry=REGISTRY,
)
PLANNER_DIAGNOSTIC = Gauge(
    "epp_planner_diagnostic",
    "The numbers behind the last decision: correction factors (p_correction, "
    "d_correction), KV load, GPUs wanted, budget cut, ...",
    ["name"],
    registry=REGISTRY,
)
PLANNER_DROPPED = Counter(
    "epp_planner_observations_dropped",
    "Admissions and finished requests the planner thread never saw: its hand-over queue "
    "was full (the planner is behind; its demand reads low while this grows).",
    registry=REGISTRY,
)
PLANNER_GPU_SECONDS = Counter(
    "epp_planner_gpu_seconds",
    "GPU-seconds held by the pool (ready, starting and draining replicas), summed over "
    "adjustment intervals; /3600 for GPU-hours.",
    registry=REGISTRY,
)
PLANNER_DECISIONS = Counter(
    "epp_planner_decisions",
    "Planner decisions, by whether they changed a target.",
    ["changed"],
    registry=REGISTRY,
)


class PoolCollector(Collector):
    """inference_pool_* gauges computed from the datastore's healthy endpoints."""

    def __init__(self, pool_name: str, snapshot: Callable[[], list]) -> None:
        self.pool_name = pool_name
        self.snapshot = snapshot

    def collect(self):  # type: ignore[override]
        every = self.snapshot()
        snaps = [s for s in every if s.healthy]
        n = len(snaps)
        name = self.pool_name
        yield _endpoint_states(name, every)
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
        yield from _role_families(name, snaps)

    def describe(self):  # type: ignore[override]
        return []


def _endpoint_states(name: str, every: list) -> GaugeMetricFamily:
    """epp_pool_endpoints{state}: every endpoint the EPP knows, healthy or not (not an
    upstream name: upstream counts only ready pods, so an empty pool and a pool whose
    endpoints all went stale look alike; the alert rules in deploy/prometheus/ tell
    them apart). `draining` wins over the health state."""
    counts = {"healthy": 0, "stale": 0, "draining": 0}
    for s in every:
        counts["draining" if s.draining else "healthy" if s.healthy else "stale"] += 1
    fam = GaugeMetricFamily(
        "epp_pool_endpoints",
        "Endpoints in the pool by state: healthy (fresh metrics), stale (no good scrape "
        "within the staleness threshold) or draining (the planner is removing it).",
        labels=["name", "state"],
    )
    for state, count in counts.items():
        fam.add_metric([name, state], count)
    return fam


def _role_families(name: str, snaps: list) -> list[GaugeMetricFamily]:
    """inference_pool_role_*: the pool gauges per `llm-d.ai/role` (not upstream names;
    upstream has no per-role view), for the load-based planner in a P/D pool."""
    from epp.roles import pool_samples

    labels = ["name", "role"]
    fams = {
        "ready_pods": GaugeMetricFamily(
            "inference_pool_role_ready_pods", "Ready pods of each role", labels=labels
        ),
        "queue": GaugeMetricFamily(
            "inference_pool_role_queue_size",
            "Pending requests summed over the role's pods (prefill load)",
            labels=labels,
        ),
        "running": GaugeMetricFamily(
            "inference_pool_role_running_requests",
            "Running requests summed over the role's pods",
            labels=labels,
        ),
        "kv": GaugeMetricFamily(
            "inference_pool_role_average_kv_cache_utilization",
            "Average KV cache utilization over the role's pods (decode load)",
            labels=labels,
        ),
    }
    for sample in pool_samples(snaps):
        role = [name, str(sample.role)]
        fams["ready_pods"].add_metric(role, sample.ready)
        fams["queue"].add_metric(role, sample.waiting)
        fams["running"].add_metric(role, sample.running)
        fams["kv"].add_metric(role, sample.kv_mean)
    return list(fams.values())


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
