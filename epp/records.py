"""What the request side measures and the planner reads: a replica's role, one finished
request, one role's load at one instant.

They live on the request side because the request path produces them (the response
observer, the pool sampler, the latency predictor's training records); the planner
imports them from here, so nothing on the request path imports the planner.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    """A replica's job, as the `llm-d.ai/role` label spells it. An aggregated pool has
    one role; a disaggregated (P/D) pool has two."""

    PREFILL = "prefill"
    DECODE = "decode"
    AGGREGATED = "aggregated"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request as the response path measured it."""

    finished_at: float
    isl: int
    osl: int
    ttft_ms: float
    itl_ms: float  # mean gap between output tokens; NaN with fewer than two tokens
    duration_s: float
    cached_tokens: int = 0
    ok: bool = True
    endpoint: str = ""  # the endpoint that answered (the primary pick)
    role: Role | None = None  # its role; None when not known
    status: int = 0  # HTTP status of the response; 0 when none arrived (reset, disconnect)


@dataclass(frozen=True, slots=True)
class PoolSample:
    """One role's load read at one instant (one `metric-pulling-interval` tick)."""

    role: Role
    waiting: int  # requests queued, summed over the role's ready replicas
    running: int
    kv_mean: float  # mean KV-cache use over the role's ready replicas, 0..1
    ready: int
