"""A Prometheus histogram for the request loop: an observation is one `bisect` and two
additions, no lock.

Why: `prometheus_client.Histogram.observe` takes a lock twice (the sum and the bucket,
each a `MutexValue`) and walks the buckets in Python. The scheduler times every plugin
call (GIE's `inference_extension_plugin_duration_seconds`): 12 observations per request
with the default profile, ~10 % of the EPP's own CPU per request (cProfile,
bench/request_cpu.py). Here the counts are plain lists, summed into the exposition
format only when Prometheus scrapes.

Thread safety: observe from one thread (the request loop: every plugin call that is
timed runs there; the request-only work a worker thread may do, `Scheduler.prepare`, is
not timed). A scrape reads the lists from the metrics server, which runs on that loop
too. The exposition (names, labels, buckets, `_count`, `_sum`, `_created`) is what
`prometheus_client.Histogram` writes.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as _pc_metrics
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LoopHistogram"]


class _Child:
    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        # Bucket i counts amount <= bounds[i] ("le"): the first bound not below amount.
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class LoopHistogram(Collector):
    """`labels(*values).observe(x)`, like `prometheus_client.Histogram` (resolve the child
    once and keep it: the lookup is a dict get); without label names, `observe(x)`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be increasing, got {list(buckets)}")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = bounds
        self._children: dict[tuple[str, ...], _Child] = {}
        # Without labels the one child exists from the start (zero counts exported before
        # any observation, as prometheus_client's histograms do) and `observe` goes to it
        # directly: no `labels()` call per observation.
        self._unlabelled = None if self.labelnames else self.labels()
        if self._unlabelled is not None:  # `observe` is the child's: one call, not two
            self.observe = self._unlabelled.observe  # type: ignore[method-assign]
        if registry is not None:
            registry.register(self)

    def labels(self, *values: object, **kw: object) -> _Child:
        if kw:
            if values:
                raise ValueError(f"{self.name}: give label values by position or by name")
            if set(kw) != set(self.labelnames):
                raise ValueError(
                    f"{self.name}: expected labels {self.labelnames}, got {sorted(kw)}"
                )
            values = tuple(kw[n] for n in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = _Child(self._bounds)
        return child

    def observe(self, amount: float) -> None:
        child = self._unlabelled
        if child is None:
            raise ValueError(f"{self.name} has labels {self.labelnames}: use labels(...)")
        child.observe(amount)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [*(floatToGoString(b) for b in self._bounds), "+Inf"]
        for key, child in list(self._children.items()):
            running, buckets = 0, []
            for le, n in zip(les, list(child.counts), strict=True):
                running += n
                buckets.append((le, running))
            family.add_metric(list(key), buckets, child.sum)
            if _pc_metrics._use_created:  # as prometheus_client's own histograms
                family.add_sample(
                    self.name + "_created",
                    dict(zip(self.labelnames, key, strict=True)),
                    child.created,
                )
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
