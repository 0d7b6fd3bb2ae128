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
from epp.sim.engine import EngineSnapshot
from epp.sim.sequence import SimRequest

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


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to `max_value`."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


class SimMetrics:
    """The metrics of one simulated server; also the engine's observer."""

    def __init__(
        self, config: SimConfig, snapshot: Callable[[], EngineSnapshot], engine: str = ENGINE
    ) -> None:
        self.config = config
        self.model = config.model
        self.engine = engine  # the `engine` label: the data-parallel rank's index
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_LoadCollector(config, snapshot, engine))
        r = self.registry

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*LABELS, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.request_success = counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("finish_reason",),
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        token_buckets = build_1_2_5_buckets(config.model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            token_buckets,
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        # Create every series up front, as vLLM does, so a fresh server already shows
        # zeros instead of missing metrics; keep the children, the hot path uses them.
        labels = (self.model, engine)
        self._prompt_tokens = self.prompt_tokens.labels(*labels)
        self._generation_tokens = self.generation_tokens.labels(*labels)
        self._queries = self.prefix_cache_queries.labels(*labels)
        self._hits = self.prefix_cache_hits.labels(*labels)
        self._preemptions = self.preemptions.labels(*labels)
        self._ttft = self.ttft.labels(*labels)
        self._itl = self.itl.labels(*labels)
        self._e2e = self.e2e.labels(*labels)
        self._queue = self.queue_time.labels(*labels)
        self._prefill = self.prefill_time.labels(*labels)
        self._decode = self.decode_time.labels(*labels)
        self._inference = self.inference_time.labels(*labels)
        self._req_prompt = self.request_prompt_tokens.labels(*labels)
        self._req_generation = self.request_generation_tokens.labels(*labels)
        self._success = {
            reason: self.request_success.labels(*labels, reason) for reason in FINISH_REASONS
        }

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- EngineObserver --------------------------------------------------------------

    def on_admit(self, req: SimRequest, queue_seconds: float) -> None:
        self._queue.observe(queue_seconds)

    def on_prefix_cache(self, queries: int, hits: int) -> None:
        self._queries.inc(queries)
        if hits:
            self._hits.inc(hits)

    def on_first_token(self, req: SimRequest, ttft_seconds: float) -> None:
        self._ttft.observe(ttft_seconds)
        self._prompt_tokens.inc(req.num_prompt_tokens)
        self._generation_tokens.inc()

    def on_next_token(self, req: SimRequest, itl_seconds: float) -> None:
        self._itl.observe(itl_seconds)
        self._generation_tokens.inc()

    def on_finish(self, req: SimRequest, e2e_seconds: float) -> None:
        self._e2e.observe(e2e_seconds)
        success = self._success.get(req.finish_reason)
        if success is None:
            success = self._success[req.finish_reason] = self.request_success.labels(
                self.model, self.engine, req.finish_reason
            )
        success.inc()
        self._req_prompt.observe(req.num_prompt_tokens)
        self._req_generation.observe(req.generated)
        if req.admitted_at is not None and req.first_token_at is not None:
            end = req.finished_at if req.finished_at is not None else req.first_token_at
            self._prefill.observe(req.first_token_at - req.admitted_at)
            self._decode.observe(end - req.first_token_at)
            self._inference.observe(end - req.admitted_at)

    def on_preempt(self, req: SimRequest) -> None:
        self._preemptions.inc()


class _LoadCollector(Collector):
    """Gauges read from the engine at scrape time."""

    def __init__(
        self, config: SimConfig, snapshot: Callable[[], EngineSnapshot], engine: str = ENGINE
    ) -> None:
        self.config = config
        self.snapshot = snapshot
        self.engine = engine
        # vLLM sets a new lora_requests_info series to the current time whenever it
        # logs, and old label sets linger; consumers take the newest. Same here.
        self._lora_series: dict[tuple[str, str], float] = {}

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cfg = self.config
        snap = self.snapshot()
        base = [cfg.model, self.engine]

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

        labels = cache_config_labels(cfg)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*LABELS, *labels],
        )
        info.add_metric([*base, *labels.values()], 1.0)
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


def cache_config_labels(config: SimConfig) -> dict[str, str]:
    """The labels of `vllm:cache_config_info`: vLLM exports every field of its
    `CacheConfig` (`metrics_info()` is `{k: str(v) for k, v in __dict__.items()}`), and
    the field set changes between releases. So the simulator exports the union of the
    fields of recent releases (vllm/config/cache.py), with their defaults or the
    simulated values, to stay a superset of whichever vLLM a scraper was written for."""
    blocks = config.num_gpu_blocks
    tokens = blocks * config.block_size
    values: dict[str, object] = {
        "block_size": config.block_size,
        "num_gpu_blocks": blocks,
        "enable_prefix_caching": config.enable_prefix_caching,
        "prefix_caching_hash_algo": "sha256",
        "gpu_memory_utilization": 0.9,
        "cache_dtype": "auto",
        "is_attention_free": False,
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "num_cpu_blocks": config.kv_offload_blocks or None,
        "swap_space": 4,
        "cpu_offload_gb": 0,
        "calculate_kv_scales": False,
        "kv_sharing_fast_prefill": False,
        "kv_cache_memory_bytes": None,
        "kv_offloading_size": None,
        "kv_offloading_backend": "native",
        "user_specified_block_size": True,
        "user_specified_mamba_block_size": False,
        "kv_cache_layout": None,
        "prefix_match_unit": None,
        "attn_group_size": None,
        "prefix_cache_retention_interval": 0,
        "kv_cache_dtype_skip_layers": [],
        "mamba_page_size_padded": None,
        "skip_page_size_padded": None,
        "mamba_block_size": None,
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "enable_mamba_fine_grained_prefix_cache": False,
        "replayssm_buffer_len": 16,
        "use_replayssm": False,
        "use_kda_recoverssm": False,
        "effective_attention_block_size": config.block_size,
        "kv_cache_size_tokens": tokens,
        "kv_cache_max_concurrency": round(tokens / config.model_len, 2),
        "_block_size_resolved": True,
        # Seen on a live vLLM 0.32 server (make test-vllm), not in older releases.
        "hash_block_size": config.block_size,
        "cache_hit_alignment_tokens": None,
        "enable_mamba_shared_prefix_checkpoint": False,
        "swa_bounded_replay": False,
    }
    return {key: str(value) for key, value in values.items()}


def _adapters(models: tuple[str, ...], config: SimConfig) -> str:
    return ",".join(m for m in models if m != config.model)
