"""Prometheus metrics under vLLM's own names, labels and buckets, so a scraper written
for a real vLLM (the EPP's) cannot tell the difference.

Each server has its own `CollectorRegistry`: many simulators share one process, and
the global registry would merge their series. Load gauges are computed at scrape time
from an engine snapshot (never stale); counters and histograms are fed by the engine
as an `EngineObserver`, in model time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.sim.config import SimConfig
from epp.sim.engine import EngineSnapshot, SimRequest

# Classic text format: every Prometheus-format parser reads it, and it is what the
# registry writes. (prometheus_client's own default now advertises 1.0.0.)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ENGINE = "0"
LABELS = ["model_name", "engine"]

# Bucket bounds copied from vLLM (v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


class SimMetrics:
    """The metrics of one simulated server; also the engine's observer."""

    def __init__(self, config: SimConfig, snapshot: Callable[[], EngineSnapshot]) -> None:
        self.config = config
        self.model = config.model
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_LoadCollector(config, snapshot))
        r = self.registry
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finish_reason"],
            registry=r,
        )
        self.prefix_cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            LABELS,
            registry=r,
        )
        self.prefix_cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            LABELS,
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        # Create every series up front, as vLLM does, so a fresh server already shows
        # zeros instead of missing metrics.
        labels = (self.model, ENGINE)
        for metric in (
            self.prompt_tokens,
            self.generation_tokens,
            self.prefix_cache_queries,
            self.prefix_cache_hits,
            self.ttft,
            self.itl,
            self.e2e,
            self.queue_time,
        ):
            metric.labels(*labels)
        for reason in FINISH_REASONS:
            self.request_success.labels(*labels, reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- EngineObserver --------------------------------------------------------------

    def on_admit(self, req: SimRequest, queue_seconds: float) -> None:
        self.queue_time.labels(self.model, ENGINE).observe(queue_seconds)
        self.prefix_cache_queries.labels(self.model, ENGINE).inc(req.prompt_tokens)

    def on_first_token(self, req: SimRequest, ttft_seconds: float) -> None:
        self.ttft.labels(self.model, ENGINE).observe(ttft_seconds)
        self.prompt_tokens.labels(self.model, ENGINE).inc(req.prompt_tokens)
        self.generation_tokens.labels(self.model, ENGINE).inc()

    def on_next_token(self, req: SimRequest, itl_seconds: float) -> None:
        self.itl.labels(self.model, ENGINE).observe(itl_seconds)
        self.generation_tokens.labels(self.model, ENGINE).inc()

    def on_finish(self, req: SimRequest, e2e_seconds: float) -> None:
        self.e2e.labels(self.model, ENGINE).observe(e2e_seconds)
        self.request_success.labels(self.model, ENGINE, req.finish_reason).inc()


class _LoadCollector(Collector):
    """Gauges read from the engine at scrape time."""

    def __init__(self, config: SimConfig, snapshot: Callable[[], EngineSnapshot]) -> None:
        self.config = config
        self.snapshot = snapshot
        # vLLM sets a new lora_requests_info series to the current time whenever it
        # logs, and old label sets linger; consumers take the newest. Same here.
        self._lora_series: dict[tuple[str, str], float] = {}

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cfg = self.config
        snap = self.snapshot()
        base = [cfg.model, ENGINE]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(base, value)
            return g

        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            snap.running,
        )  # fmt: skip
        yield gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            snap.waiting,
        )  # fmt: skip
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            snap.kv_usage,
        )  # fmt: skip

        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                *LABELS, "block_size", "num_gpu_blocks", "enable_prefix_caching",
                "prefix_caching_hash_algo",
            ],
        )  # fmt: skip
        info.add_metric(
            [
                *base, str(cfg.block_size), str(cfg.num_gpu_blocks),
                str(cfg.enable_prefix_caching), "sha256",
            ],
            1.0,
        )  # fmt: skip
        yield info

        key = (_adapters(snap.running_models, cfg), _adapters(snap.waiting_models, cfg))
        self._lora_series[key] = time.time()
        lora = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=[*LABELS, "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        for (running, waiting), stamp in self._lora_series.items():
            lora.add_metric([*base, str(cfg.max_loras), running, waiting], stamp)
        yield lora


def _adapters(models: tuple[str, ...], config: SimConfig) -> str:
    return ",".join(m for m in models if m != config.model)
