"""Filling the datastore: endpoint discovery and model-server metrics.

- `promtext`: a Prometheus text-format reader that parses only the wanted families.
- `metric_maps`: per-engine metric names (vLLM, SGLang, TRT-LLM) → `EndpointMetrics`.
- `scraper`: the scrape rules and `MetricsScraper`, one asyncio polling task per endpoint;
  `selector_scraper`: `SelectorScraper`, every http endpoint on one `selectors` loop (no
  asyncio); `httpget` the HTTP/1.1 framing and the asyncio keep-alive GET client;
  `scrape_thread`: `ScraperThread`, the scraper on its own thread (`epp serve`).
- `endpoints_file`: static endpoints from YAML or `name=host:port;label=value` flags.
- `k8s_pods` (pure), `k8s_reflector`, `k8s_discovery`, `k8s_cli`: the pool from a GIE
  InferencePool or a label selector, followed with the official Kubernetes client.
"""

from epp.datalayer.endpoints_file import (
    EndpointsError,
    load_endpoints_file,
    parse_endpoint_arg,
    parse_endpoint_args,
    parse_endpoints,
    watch_endpoints_file,
)
from epp.datalayer.metric_maps import (
    ENGINES,
    EngineMap,
    MetricsExtractError,
    MetricSpec,
    engine_for,
    extract,
)
from epp.datalayer.promtext import Sample, parse
from epp.datalayer.scraper import MetricsScraper, ScrapeConfig

__all__ = [
    "ENGINES",
    "EndpointsError",
    "EngineMap",
    "MetricSpec",
    "MetricsExtractError",
    "MetricsScraper",
    "Sample",
    "ScrapeConfig",
    "engine_for",
    "extract",
    "load_endpoints_file",
    "parse",
    "parse_endpoint_arg",
    "parse_endpoint_args",
    "parse_endpoints",
    "watch_endpoints_file",
]
