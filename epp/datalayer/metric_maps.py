"""Per-engine metric names → the engine-neutral `EndpointMetrics`.

Model servers say the same things under different names (vLLM's
`vllm:num_requests_waiting` is SGLang's `sglang:num_queue_reqs`). An `EngineMap` says,
for each engine-neutral field, which series to read; `extract` turns parsed samples
into an `EndpointMetrics`. Names and semantics follow the upstream EPP's
`core-metrics-extractor` (GIE `extractor/metrics/factories.go`, `loraspec.go`).

Several series for one field (data-parallel ranks report one series each, labelled
`engine` in vLLM, `dp_rank` in SGLang) are combined so the endpoint reads as one
server: queue and running counts are **summed**; KV-cache usage is **averaged**
(each rank has an equal-sized cache, so the mean is used blocks / total blocks, the
fraction the scheduler wants; `max` would make one busy rank hide the free others);
cache geometry takes the **largest** value (ranks share one cache config).

Spec syntax (as upstream's `engineConfigs`): a PromQL-like instant selector
`family{label="value",...}`; an empty spec disables a field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from epp.datalayer.promtext import Sample
from epp.datastore import Endpoint, EndpointMetrics, RankLoad

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "ENGINE_LABEL_KEYS",
    "EngineMap",
    "MetricSpec",
    "MetricsExtractError",
    "engine_for",
    "extract",
    "get_engine",
]

# Pod/endpoint labels naming the engine; the first present wins.
ENGINE_LABEL_KEYS: tuple[str, ...] = (
    "inference.networking.k8s.io/engine-type",
    "llm-d.ai/engine-type",
)
DEFAULT_ENGINE = "vllm"

# Labels of the LoRA info gauge (model-server protocol, proposal 003).
LORA_RUNNING_LABEL = "running_lora_adapters"
LORA_WAITING_LABEL = "waiting_lora_adapters"
LORA_MAX_LABEL = "max_lora"


class MetricsExtractError(ValueError):
    """A scrape had none of the fields the scheduler needs (wrong engine or path)."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """Where one field lives: a family, optional label matchers, optional value label.

    `label` set means the field is read from that label of the series (info-style
    gauges like `vllm:cache_config_info{block_size="16"} 1`), not from its value.
    """

    family: str
    matchers: tuple[tuple[str, str], ...] = ()
    label: str = ""

    @classmethod
    def parse(cls, text: str, label: str = "") -> MetricSpec | None:
        """`family` or `family{a="x",b=y}` → spec; empty text → None (field disabled)."""
        text = text.strip()
        if not text:
            return None
        brace = text.find("{")
        if brace == -1:
            return cls(text, (), label)
        if not text.endswith("}"):
            raise ValueError(f"metric spec {text!r}: missing closing '}}'")
        family = text[:brace].strip()
        if not family:
            raise ValueError(f"metric spec {text!r}: missing family name before '{{'")
        matchers: list[tuple[str, str]] = []
        body = text[brace + 1 : -1].strip()
        for part in filter(None, (p.strip() for p in body.split(","))):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise ValueError(
                    f"metric spec {text!r}: matcher {part!r} must look like label=value"
                )
            matchers.append((key.strip(), value.strip().strip("\"'")))
        return cls(family, tuple(matchers), label)

    def select(self, samples_by_family: Mapping[str, Sequence[Sample]]) -> list[Sample]:
        """Samples of this spec's family whose labels match every matcher."""
        samples = samples_by_family.get(self.family)
        if not samples:
            return []
        if not self.matchers:
            return list(samples)
        return [s for s in samples if all(s.labels.get(k) == v for k, v in self.matchers)]

    def __str__(self) -> str:
        if not self.matchers:
            return self.family
        inner = ",".join(f'{k}="{v}"' for k, v in self.matchers)
        return f"{self.family}{{{inner}}}"


def _specs(*items: MetricSpec | None) -> tuple[MetricSpec, ...]:
    return tuple(i for i in items if i is not None)


@dataclass(frozen=True, slots=True)
class EngineMap:
    """For each engine-neutral field, the specs to try in order (first present wins).

    A fallback chain is how renamed metrics are handled: newer vLLM reports
    `vllm:kv_cache_usage_perc`, older releases `vllm:gpu_cache_usage_perc`.
    """

    name: str
    waiting: tuple[MetricSpec, ...] = ()
    running: tuple[MetricSpec, ...] = ()
    kv_usage: tuple[MetricSpec, ...] = ()
    lora: tuple[MetricSpec, ...] = ()
    block_size: tuple[MetricSpec, ...] = ()
    num_blocks: tuple[MetricSpec, ...] = ()
    # KV blocks the server keeps off the GPU (CPU offload), when it reports them
    offload_blocks: tuple[MetricSpec, ...] = ()
    # The label naming a series' data-parallel rank ("" = the engine has none).
    rank_label: str = ""
    families: frozenset[str] = field(init=False, default=frozenset())

    def __post_init__(self) -> None:
        fams = {s.family for specs in self._all() for s in specs}
        object.__setattr__(self, "families", frozenset(fams))

    def _all(self) -> tuple[tuple[MetricSpec, ...], ...]:
        return (
            self.waiting,
            self.running,
            self.kv_usage,
            self.lora,
            self.block_size,
            self.num_blocks,
            self.offload_blocks,
        )

    def core_families(self) -> list[str]:
        """Families of the fields the scheduler cannot do without, for error messages."""
        return [s.family for specs in (self.waiting, self.running, self.kv_usage) for s in specs]


VLLM = EngineMap(
    name="vllm",
    waiting=_specs(MetricSpec("vllm:num_requests_waiting")),
    running=_specs(MetricSpec("vllm:num_requests_running")),
    kv_usage=_specs(
        MetricSpec("vllm:kv_cache_usage_perc"),
        MetricSpec("vllm:gpu_cache_usage_perc"),  # the older name, before the rename
    ),
    lora=_specs(MetricSpec("vllm:lora_requests_info")),
    block_size=_specs(MetricSpec("vllm:cache_config_info", label="block_size")),
    num_blocks=_specs(MetricSpec("vllm:cache_config_info", label="num_gpu_blocks")),
    # CacheConfig.num_cpu_blocks: the CPU-tier blocks (a label like the others; "None"
    # when the server keeps no KV off the GPU, which reads as unreported)
    offload_blocks=_specs(MetricSpec("vllm:cache_config_info", label="num_cpu_blocks")),
    # vLLM labels every series with `engine` = the DP rank's index (vllm/v1/metrics/loggers.py)
    rank_label="engine",
)

SGLANG = EngineMap(
    name="sglang",
    waiting=_specs(MetricSpec("sglang:num_queue_reqs")),
    running=_specs(MetricSpec("sglang:num_running_reqs")),
    kv_usage=_specs(MetricSpec("sglang:token_usage")),
    block_size=_specs(MetricSpec("sglang:cache_config_info", label="page_size")),
    num_blocks=_specs(MetricSpec("sglang:cache_config_info", label="num_pages")),
    rank_label="dp_rank",
)

TRTLLM_SERVE = EngineMap(
    name="trtllm-serve",
    waiting=_specs(MetricSpec("trtllm_num_requests_waiting")),
    running=_specs(MetricSpec("trtllm_num_requests_running")),
    kv_usage=_specs(MetricSpec("trtllm_kv_cache_utilization")),
    block_size=_specs(MetricSpec("trtllm_kv_cache_tokens_per_block")),
    num_blocks=_specs(MetricSpec("trtllm_kv_cache_max_blocks")),
)

_TRITON_KV = "nv_trt_llm_kv_cache_block_metrics"
TRITON_TRTLLM = EngineMap(
    name="triton-tensorrt-llm",
    waiting=_specs(MetricSpec("nv_trt_llm_request_metrics", (("request_type", "waiting"),))),
    running=_specs(MetricSpec("nv_trt_llm_request_metrics", (("request_type", "scheduled"),))),
    kv_usage=_specs(MetricSpec(_TRITON_KV, (("kv_cache_block_type", "fraction"),))),
    block_size=_specs(MetricSpec(_TRITON_KV, (("kv_cache_block_type", "tokens_per"),))),
    num_blocks=_specs(MetricSpec(_TRITON_KV, (("kv_cache_block_type", "max"),))),
)

ENGINES: dict[str, EngineMap] = {m.name: m for m in (VLLM, SGLANG, TRTLLM_SERVE, TRITON_TRTLLM)}


def get_engine(
    engine: str | EngineMap, engines: Mapping[str, EngineMap] | None = None
) -> EngineMap:
    """The map for an engine name (or the map itself); unknown names list the known ones."""
    if isinstance(engine, EngineMap):
        return engine
    table = ENGINES if engines is None else engines
    found = table.get(engine) or table.get(engine.lower())
    if found is None:
        raise MetricsExtractError(
            f"unknown engine {engine!r}; known engines: {', '.join(sorted(table))}"
        )
    return found


def engine_for(
    endpoint: Endpoint,
    default: str = DEFAULT_ENGINE,
    label_keys: Sequence[str] = ENGINE_LABEL_KEYS,
) -> str:
    """The engine named by the endpoint's labels (first key present), else `default`."""
    for key in label_keys:
        value = endpoint.labels.get(key)
        if value:
            return value.strip().lower()
    return default


def _values(specs: Sequence[MetricSpec], samples: Mapping[str, Sequence[Sample]]) -> list[float]:
    """Values of the first spec that has any usable (non-NaN) sample."""
    for spec in specs:
        vals: list[float] = []
        for s in spec.select(samples):
            v = s.value
            if spec.label:
                try:
                    v = float(s.labels.get(spec.label, ""))
                except ValueError:
                    continue
            if not math.isnan(v):
                vals.append(v)
        if vals:
            return vals
    return []


def _by_rank(
    specs: Sequence[MetricSpec], samples: Mapping[str, Sequence[Sample]], label: str
) -> dict[int, float]:
    """Rank → value of the first spec with a usable sample (ranks summed if repeated)."""
    for spec in specs:
        out: dict[int, float] = {}
        for s in spec.select(samples):
            raw = s.labels.get(label)
            if raw is None or not raw.isdigit() or math.isnan(s.value):
                continue
            out[int(raw)] = out.get(int(raw), 0.0) + s.value
        if out:
            return out
    return {}


def _ranks(emap: EngineMap, samples: Mapping[str, Sequence[Sample]]) -> tuple[RankLoad, ...]:
    """Per-rank load when the page shows two ranks or more; () for a single-rank server
    (the common case costs one pass over three families per scrape, none per request)."""
    waiting = _by_rank(emap.waiting, samples, emap.rank_label)
    running = _by_rank(emap.running, samples, emap.rank_label)
    kv = _by_rank(emap.kv_usage, samples, emap.rank_label)
    ranks = sorted(set(waiting) | set(running) | set(kv))
    if len(ranks) < 2:
        return ()
    out = []
    for r in ranks:
        usage = kv.get(r, 0.0)
        out.append(
            RankLoad(
                rank=r,
                waiting_queue_size=_count([waiting.get(r, 0.0)]),
                running_requests=_count([running.get(r, 0.0)]),
                kv_cache_usage=min(1.0, max(0.0, usage)) if math.isfinite(usage) else 1.0,
            )
        )
    return tuple(out)


def _count(vals: list[float]) -> int:
    total = sum(vals)
    if math.isinf(total):
        return 0
    return max(0, round(total))


def _adapters(text: str) -> frozenset[str]:
    return frozenset(a for a in (p.strip() for p in text.split(",")) if a)


def _int_label(sample: Sample, label: str) -> int | None:
    try:
        value = float(sample.labels.get(label, ""))
    except ValueError:
        return None
    return max(0, int(value)) if math.isfinite(value) else None


def _lora(specs: Sequence[MetricSpec], samples: Mapping[str, Sequence[Sample]]) -> Sample | None:
    """The latest LoRA info series: its value is a timestamp, the largest wins."""
    for spec in specs:
        best: Sample | None = None
        for s in spec.select(samples):
            if math.isnan(s.value):
                continue
            if best is None or s.value > best.value:
                best = s
        if best is not None:
            return best
    return None


def extract(
    engine: str | EngineMap,
    samples_by_family: Mapping[str, Sequence[Sample]],
    now: float,
    previous: EndpointMetrics | None = None,
) -> EndpointMetrics:
    """Build `EndpointMetrics` from parsed samples, stamped `update_time=now`.

    Fields whose family is absent keep their `previous` value (upstream allows partial
    updates), or the default when there is none. If none of waiting/running/KV usage is
    present the page is not this engine's: `MetricsExtractError` lists what was missing.
    """
    emap = get_engine(engine)
    base = previous if previous is not None else EndpointMetrics()
    changes: dict[str, object] = {"update_time": now}

    waiting = _values(emap.waiting, samples_by_family)
    running = _values(emap.running, samples_by_family)
    kv = _values(emap.kv_usage, samples_by_family)
    if not (waiting or running or kv):
        missing = ", ".join(emap.core_families()) or "(none configured)"
        raise MetricsExtractError(
            f"no {emap.name} metrics on the page: missing families {missing}"
            " (is the engine label or the metrics path right?)"
        )
    if waiting:
        changes["waiting_queue_size"] = _count(waiting)
    if running:
        changes["running_requests"] = _count(running)
    if kv:
        usage = sum(kv) / len(kv)
        changes["kv_cache_usage"] = min(1.0, max(0.0, usage)) if math.isfinite(usage) else 1.0

    if emap.rank_label:
        changes["ranks"] = _ranks(emap, samples_by_family)

    lora = _lora(emap.lora, samples_by_family)
    if lora is not None:
        changes["active_models"] = _adapters(lora.labels.get(LORA_RUNNING_LABEL, ""))
        changes["waiting_models"] = _adapters(lora.labels.get(LORA_WAITING_LABEL, ""))
        max_lora = _int_label(lora, LORA_MAX_LABEL)
        if max_lora is not None:
            changes["max_active_models"] = max_lora

    block = _values(emap.block_size, samples_by_family)
    if block and math.isfinite(max(block)):
        changes["cache_block_size"] = max(0, int(max(block)))
    blocks = _values(emap.num_blocks, samples_by_family)
    if blocks and math.isfinite(max(blocks)):
        changes["cache_num_blocks"] = max(0, int(max(blocks)))
    offload = _values(emap.offload_blocks, samples_by_family)
    if offload and math.isfinite(max(offload)):
        changes["cache_offload_blocks"] = max(0, int(max(offload)))

    return replace(base, **changes)  # type: ignore[arg-type]
