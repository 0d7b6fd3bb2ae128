"""GIE's flow-control metrics (gie-epp.md §4: names and labels as upstream).

- `inference_extension_flow_control_request_queue_duration_seconds` (histogram;
  fairness_id, priority, outcome, inference_pool, model_name, target_model_name): time
  from arrival at flow control to its outcome (an immediate dispatch counts too);
- `..._request_enqueue_duration_seconds` (histogram; fairness_id, priority, outcome):
  the synchronous admission step; outcome `Queued` when the request went on to wait;
- `..._dispatch_cycle_duration_seconds` (histogram): one dispatch attempt;
- `..._queue_size`, `..._queue_bytes` (gauges; fairness_id, priority, inference_pool,
  model_name, target_model_name) and `..._pool_saturation` (gauge; inference_pool):
  computed when Prometheus scrapes, from what is queued now (nothing on the request path).

Outcomes are upstream's: Dispatched, RejectedCapacity, EvictedTTL,
EvictedContextCancelled, RejectedOther. A fairness id is client text: the first
`MAX_FAIRNESS_LABELS` distinct ids get their own label value, later ones `other`, so
the label set stays bounded (model names are bounded by `model_label` upstream of here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.observability import REGISTRY

DISPATCHED = "Dispatched"
REJECTED_CAPACITY = "RejectedCapacity"
EVICTED_TTL = "EvictedTTL"
EVICTED_CANCELLED = "EvictedContextCancelled"
REJECTED_OTHER = "RejectedOther"
QUEUED = "Queued"

MAX_FAIRNESS_LABELS = 64
_WAIT_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST_BUCKETS = (0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1)

QUEUE_DURATION = Histogram(
    "inference_extension_flow_control_request_queue_duration_seconds",
    "Time a request spent in flow control, by outcome.",
    ["fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
ENQUEUE_DURATION = Histogram(
    "inference_extension_flow_control_request_enqueue_duration_seconds",
    "Time to admit a request into flow control (dispatch, reject or queue).",
    ["fairness_id", "priority", "outcome"],
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
DISPATCH_CYCLE = Histogram(
    "inference_extension_flow_control_dispatch_cycle_duration_seconds",
    "Time of one dispatch cycle.",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)


class FairnessLabels:
    """Client fairness ids → a bounded set of label values."""

    def __init__(self, limit: int = MAX_FAIRNESS_LABELS) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def __call__(self, fairness_id: str) -> str:
        if fairness_id in self._known:
            return fairness_id
        if len(self._known) < self.limit:
            self._known.add(fairness_id)
            return fairness_id
        return "other"


# A queued item's labels, as the controller stores them: (fairness_id, priority,
# model_name, target_model_name); `size` its bytes.
Snapshot = Callable[[], tuple[str, float, Iterable[tuple[tuple[str, ...], int]]]]


class FlowControlCollector(Collector):
    """queue_size / queue_bytes / pool_saturation from the controller, at scrape time."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self):  # type: ignore[override]
        pool, saturation, items = self.snapshot()
        labels = ["fairness_id", "priority", "inference_pool", "model_name", "target_model_name"]
        size = GaugeMetricFamily(
            "inference_extension_flow_control_queue_size",
            "Requests waiting in flow control.",
            labels=labels,
        )
        nbytes = GaugeMetricFamily(
            "inference_extension_flow_control_queue_bytes",
            "Request-body bytes waiting in flow control.",
            labels=labels,
        )
        counts: dict[tuple[str, ...], list[int]] = {}
        for (fairness, priority, model, target), n in items:
            c = counts.setdefault((fairness, priority, pool, model, target), [0, 0])
            c[0] += 1
            c[1] += n
        for key, (n, b) in sorted(counts.items()):
            size.add_metric(list(key), n)
            nbytes.add_metric(list(key), b)
        sat = GaugeMetricFamily(
            "inference_extension_flow_control_pool_saturation",
            "The pool's saturation as flow control last computed it (>= 1: saturated).",
            labels=["inference_pool"],
        )
        sat.add_metric([pool], saturation)
        yield from (size, nbytes, sat)

    def describe(self):  # type: ignore[override]
        return []


_collector: FlowControlCollector | None = None


def register_flow_control(snapshot: Snapshot) -> None:
    """Point the gauges at a controller (the last server started in a process wins)."""
    global _collector
    if _collector is None:
        _collector = FlowControlCollector(snapshot)
        REGISTRY.register(_collector)
    else:
        _collector.snapshot = snapshot
