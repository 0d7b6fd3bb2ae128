"""What a simulated model server is (fixed at start) and what can go wrong with it (live).

The two are kept apart on purpose: `SimConfig` is shared by every replica of a cluster
and never changes once a server runs, while each server owns its own `Faults`, which
tests and `POST /admin` flip while traffic flows.

The step-time model (see `latency.py`) is

    step = step_base_ms                                  (any work in the step)
         + max(weight_read_ms,                           (the matmuls' memory floor)
               prefill_ms_per_token * prefill tokens computed in the step
               + decode_ms_per_token * [decodes] * (1 + batch_slowdown * (decodes - 1)))
         + attention_ms_per_ktoken * context tokens attended / 1000
         + lora_load_ms           * adapters loaded for the step

With `batch_slowdown=1` the decode term is simply `decode_ms_per_token` per decoding
sequence; the calibrated presets (`presets.py`) use that form. The plain defaults below
keep the simulator's original, cheaper shape (a fixed decode step, no base, no floor).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

KV_ROLES = ("both", "prefill", "decode", "none")
# "encode": an encoder-only server (epp.sim.encode); "none": media is encoded where the
# request is prefilled, at no modelled cost (the simulator's default).
EC_ROLES = ("none", "encode")
KV_EVENT_FORMATS = ("map", "array")


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's `--kv-events-config` JSON (vllm/config/kv_events.py), same keys and defaults.

    `topic` may hold `{host}`, `{port}` and `{model}`; empty means the llm-d convention
    `kv@{host}:{port}@{model}`, so every replica of `--replicas N` gets its own topic;
    `null` means the empty topic, vLLM's own default, which is what vllm-router 0.1.17's
    `--kv-event-source` subscribes to (it skips any message whose topic frame differs).
    """

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str | None = ""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> KVEventsConfig:
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown kv-events-config key(s) {unknown}; known: {sorted(known)}")
        values = dict(raw)
        if values.get("publisher") is None:  # vLLM: zmq when enabled, else null
            values["publisher"] = "zmq" if values.get("enable_kv_cache_events") else "null"
        config = cls(**values)
        if config.publisher not in ("zmq", "null"):
            raise ValueError(f"unknown kv-events publisher {config.publisher!r} (zmq or null)")
        if config.enabled and "://" not in config.endpoint:
            raise ValueError(f"kv-events endpoint {config.endpoint!r} is not a ZMQ address")
        return config

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


@dataclass(frozen=True)
class SimConfig:
    """A model server's shape and speed. All latencies are in *model* time.

    `time_scale` is the only knob in wall-clock terms: every wait is divided by it, so a
    test can run a "5 ms per token" model 50x faster while the metrics still say 5 ms.
    Build one from a calibrated preset with `presets.config_for(name, **overrides)`.
    """

    model: str = "tiny"
    preset: str | None = None
    lora_modules: tuple[str, ...] = ()
    max_loras: int = 1
    lora_load_ms: float = 0.0
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 8192
    # vLLM's `--long-prefill-token-threshold` (0: off): no request computes more prompt
    # tokens than this in one step unless it is alone in the engine, so a long prompt is
    # chunked thin and the step's other requests (decodes, short prompts) keep their
    # pace (Sarathi-Serve, OSDI 2024).
    long_prefill_token_threshold: int = 0
    step_base_ms: float = 0.0
    weight_read_ms: float = 0.0
    prefill_ms_per_token: float = 0.05
    decode_ms_per_token: float = 5.0
    # Extra decode time per additional running sequence, as a fraction of one step
    # (0.1 means a batch of 11 decodes at twice the single-sequence step time).
    batch_slowdown: float = 0.0
    attention_ms_per_ktoken: float = 0.0
    time_scale: float = 1.0
    kv_capacity_tokens: int = 65536
    block_size: int = 16
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    tokenizer: str | None = None
    chat_template: str | None = None
    default_max_tokens: int = 16
    failure_rate: float = 0.0
    seed: int = 0
    kv_role: str = "both"
    kv_transfer_ms_per_token: float = 0.001
    ec_role: str = "none"
    encode_ms_per_item: float = 20.0
    encoder_cache_items: int = 1024
    kv_events: KVEventsConfig | None = None
    kv_events_format: str = "map"
    # A CPU tier of this many blocks behind the GPU cache (0: none): blocks evicted from
    # the GPU move there and are announced as vLLM's offloading connector does
    # (BlockStored with medium CPU and no tokens, then BlockRemoved on GPU).
    kv_offload_blocks: int = 0
    # vLLM's `--data-parallel-size` with one API server: this many independent engines
    # (own queue, own KV cache, own `engine="<rank>"` metrics and KV events with their
    # `data_parallel_rank`) behind the one port; `X-data-parallel-rank` picks one.
    data_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.data_parallel_size < 1:
            raise ValueError("data_parallel_size must be >= 1")
        if not self.model:
            raise ValueError("model name must not be empty")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0: off)")
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.time_scale <= 0 or not math.isfinite(self.time_scale):
            raise ValueError("time_scale must be a positive number")
        if self.block_size < 1 or self.kv_capacity_tokens < self.block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        if self.max_model_len is not None and not (
            1 <= self.max_model_len <= self.num_gpu_blocks * self.block_size
        ):
            # vLLM refuses to start when one max-length sequence cannot fit in the cache.
            raise ValueError("max_model_len must be >= 1 and fit in the KV cache")
        if self.long_prefill_token_threshold > self.model_len:
            # vLLM refuses it too (SchedulerConfig: "cannot be greater than the max_model_len")
            raise ValueError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) must not "
                f"exceed the model length ({self.model_len})"
            )
        if self.kv_offload_blocks < 0:
            raise ValueError("kv_offload_blocks must be >= 0")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        latencies = (
            self.step_base_ms, self.weight_read_ms, self.prefill_ms_per_token,
            self.decode_ms_per_token,
            self.batch_slowdown, self.attention_ms_per_ktoken, self.lora_load_ms,
            self.kv_transfer_ms_per_token, self.encode_ms_per_item,
        )  # fmt: skip
        if min(latencies) < 0 or not all(math.isfinite(v) for v in latencies):
            raise ValueError("latencies must not be negative")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError("failure_rate must be within [0, 1]")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {KV_ROLES}")
        if self.ec_role not in EC_ROLES:
            raise ValueError(f"ec_role must be one of {EC_ROLES}")
        if self.encoder_cache_items < 1:
            raise ValueError("encoder_cache_items must be >= 1")
        if self.kv_events_format not in KV_EVENT_FORMATS:
            raise ValueError(f"kv_events_format must be one of {KV_EVENT_FORMATS}")
        # Accept a list from callers; a tuple keeps the frozen config hashable.
        object.__setattr__(self, "lora_modules", tuple(self.lora_modules))

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @property
    def model_len(self) -> int:
        """The longest sequence (prompt + output) a request may ask for."""
        return self.max_model_len or self.num_gpu_blocks * self.block_size

    @property
    def lora_names(self) -> tuple[str, ...]:
        """The adapters of `lora_modules` (each `NAME` or vLLM's `NAME=PATH`)."""
        return tuple(m.split("=", 1)[0] for m in self.lora_modules)

    @property
    def served_models(self) -> tuple[str, ...]:
        """Every name a request may use at start: the base model, then LoRA adapters."""
        return (self.model, *self.lora_names)


@dataclass
class Faults:
    """Misbehaviour switched on at run time (`POST /admin` or directly from Python).

    delay_ms:    extra model-time milliseconds before a request may be scheduled; the
                 request counts as waiting meanwhile, as if the server were backed up.
    fail_rate:   fraction of inference requests answered with HTTP 500.
    metrics:     False makes /metrics never answer (a hung scrape, not a fast error).
    healthy:     False makes /health answer 503.
    fixed_queue: if set, reported as vllm:num_requests_waiting instead of the truth.
    """

    delay_ms: float = 0.0
    fail_rate: float = 0.0
    metrics: bool = True
    healthy: bool = True
    fixed_queue: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a partial update atomically: validate every key before changing any."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {sorted(known)}")
        clean: dict[str, Any] = {}
        for key, value in changes.items():
            clean[key] = _check_fault(key, value)
        for key, value in clean.items():
            setattr(self, key, value)


def _check_fault(key: str, value: Any) -> Any:
    if key in ("metrics", "healthy"):
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        return value
    if key == "fixed_queue":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError("fixed_queue must be a non-negative integer or null")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a number")
    if key == "delay_ms" and value < 0:
        raise ValueError("delay_ms must be >= 0")
    if key == "fail_rate" and not 0.0 <= value <= 1.0:
        raise ValueError("fail_rate must be within [0, 1]")
    return float(value)
