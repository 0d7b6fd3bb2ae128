"""The prefix indexer's Prometheus metrics, with upstream's names and buckets.

GIE `pkg/epp/metrics/metrics.go`: `prefix_indexer_size` (gauge, total entries),
`prefix_indexer_hit_ratio` (histogram 0.0…1.0 by 0.1) and `prefix_indexer_hit_bytes`
(histogram 0…65536), all under the `inference_extension` subsystem, no labels.

The two histograms are observed once per routed request, on the request loop:
`LoopHistogram`s (epp/loophist.py: no lock, the same exposition), not
`prometheus_client.Histogram`s (two locks and a Python walk of the buckets per
observation). The gauge is set by the approximate producer only when the size changed.
"""

from __future__ import annotations

from prometheus_client import Gauge

from epp.loophist import LoopHistogram
from epp.observability import REGISTRY

INDEXER_SIZE = Gauge(
    "inference_extension_prefix_indexer_size",
    "Size of the prefix indexer.",
    registry=REGISTRY,
)
HIT_RATIO = LoopHistogram(
    "inference_extension_prefix_indexer_hit_ratio",
    "Ratio of prefix length matched to total prefix length in the cache lookup.",
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    registry=REGISTRY,
)
HIT_BYTES = LoopHistogram(
    "inference_extension_prefix_indexer_hit_bytes",
    "Length of the prefix match in number of bytes in the cache lookup.",
    buckets=(0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
    registry=REGISTRY,
)
