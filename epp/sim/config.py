"""What a simulated model server is (fixed at start) and what can go wrong with it (live).

The two are kept apart on purpose: `SimConfig` is shared by every replica of a cluster
and never changes once a server runs, while each server owns its own `Faults`, which
tests and `POST /admin` flip while traffic flows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SimConfig:
    """A model server's shape and speed. All latencies are in *model* time.

    `time_scale` is the only knob in wall-clock terms: every wait is divided by it, so a
    test can run a "5 ms per token" model 50x faster while the metrics still say 5 ms.
    """

    model: str = "tiny"
    lora_modules: tuple[str, ...] = ()
    max_loras: int = 1
    max_num_seqs: int = 8
    prefill_ms_per_token: float = 0.05
    decode_ms_per_token: float = 5.0
    # Extra decode time per additional running sequence, as a fraction of one step
    # (0.1 means a batch of 11 decodes at twice the single-sequence step time).
    batch_slowdown: float = 0.0
    time_scale: float = 1.0
    kv_capacity_tokens: int = 65536
    block_size: int = 16
    enable_prefix_caching: bool = False
    default_max_tokens: int = 16
    failure_rate: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model name must not be empty")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.time_scale <= 0 or not math.isfinite(self.time_scale):
            raise ValueError("time_scale must be a positive number")
        if self.block_size < 1 or self.kv_capacity_tokens < self.block_size:
            raise ValueError("kv_capacity_tokens must hold at least one block")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if min(self.prefill_ms_per_token, self.decode_ms_per_token, self.batch_slowdown) < 0:
            raise ValueError("latencies must not be negative")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError("failure_rate must be within [0, 1]")
        # Accept a list from callers; a tuple keeps the frozen config hashable.
        object.__setattr__(self, "lora_modules", tuple(self.lora_modules))

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @property
    def served_models(self) -> tuple[str, ...]:
        """Every name a request may use: the base model first, then LoRA adapters."""
        return (self.model, *self.lora_modules)


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
