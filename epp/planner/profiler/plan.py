"""Which points `epp profile` measures: pure arithmetic on lengths and capacities.

Two phases, as Dynamo's profiler (`benchmarks/profiler/profile_sla.py`; reference
dynamo-planner.md §4):

- **Phase A, the comparison** at the target ISL/OSL, on every endpoint: one prefill
  TTFT at `isl`, and the decode ITL at `isl`/`osl` over the in-flight counts
  `num_request_range(max_kv_tokens // (isl + osl))`. The recommendation is read from these.
- **Phase B, the in-depth sweep** of the chosen endpoints, which the SLA planner
  interpolates: prefill TTFT over `prefill_isl_grid` (batch size 1), decode ITL over
  `decode_grid` (ISL x in-flight requests, OSL 500).

The grids follow Dynamo's `_profile_prefill_helper` and `_profile_decode_helper`
(`benchmarks/profiler/utils/profile_{prefill,decode}.py`) and `get_num_request_range`,
including their rounding, so the arrays line up with the files Dynamo's planner reads.
"""

from __future__ import annotations

from dataclasses import dataclass

# Dynamo's defaults (benchmarks/profiler/utils/defaults.py, profiler_argparse.py).
PREFILL_GRANULARITY = 16
DECODE_GRANULARITY = 6
DECODE_MAX_CONCURRENCY = 2000
DECODE_OSL = 500  # "not too large to reduce ITL variance, not too small to have stable measurement"
PREFILL_OSL = 5  # AIPerf's prefill runs ask for 5 output tokens
PREFILL_CONTEXT_MARGIN = 512  # "leave some room for chat template and system prompt"
MIN_ISL = 100


class PlanError(ValueError):
    """A flag or a server limit leaves nothing to measure; the message names the fix."""


@dataclass(frozen=True, slots=True)
class DecodeLoad:
    """One decode measurement: `num_request` streams of `isl` prompt tokens, `osl` each."""

    isl: int
    osl: int
    num_request: int

    @property
    def context_length(self) -> float:
        """Dynamo's `y_context_length`: the mean context over the decode, `isl + osl/2`."""
        return self.isl + self.osl / 2

    def kv_usage(self, max_kv_tokens: int) -> float:
        """Dynamo's `x_kv_usage`: `(isl + osl/2) * num_request / max_kv_tokens`."""
        return self.context_length * self.num_request / max_kv_tokens


def num_request_range(
    max_concurrency: int,
    granularity: int = DECODE_GRANULARITY,
    attn_dp: int = 1,
    cap: int = DECODE_MAX_CONCURRENCY,
) -> list[int]:
    """Dynamo's `get_num_request_range`: every count if fewer than `granularity` fit,
    else `granularity` points from `attn_dp` to about the maximum (capped at `cap`,
    Dynamo's `DECODE_MAX_CONCURRENCY` 2000)."""
    max_concurrency = min(max_concurrency, cap)
    per_dp = max_concurrency // attn_dp
    if per_dp < granularity:
        return list(range(attn_dp, per_dp * attn_dp + 1, attn_dp))
    if granularity < 2:
        return [attn_dp]
    step = (per_dp - 1) * attn_dp / (granularity - 1)
    return [attn_dp + int(i * step) * attn_dp for i in range(granularity)]


def prefill_isl_grid(max_context_length: int, granularity: int = PREFILL_GRANULARITY) -> list[int]:
    """`range(100, max_ctx - 512, (max_ctx - 512 - 100) // granularity)`."""
    top = max_context_length - PREFILL_CONTEXT_MARGIN
    if top <= MIN_ISL:
        raise PlanError(
            f"--max-context-length {max_context_length} leaves no prefill lengths: it must be"
            f" more than {MIN_ISL + PREFILL_CONTEXT_MARGIN} ({PREFILL_CONTEXT_MARGIN} are kept"
            " for a chat template, as Dynamo does)"
        )
    step = max(1, (top - MIN_ISL) // max(1, granularity))
    return list(range(MIN_ISL, top, step))


def decode_grid(
    max_context_length: int,
    max_kv_tokens: int,
    granularity: int = DECODE_GRANULARITY,
    osl: int = DECODE_OSL,
    max_concurrency: int = DECODE_MAX_CONCURRENCY,
) -> list[DecodeLoad]:
    """ISL in `range(100, max_ctx - osl, (max_ctx - osl) // granularity)`; per ISL the
    in-flight counts `num_request_range(max_kv_tokens // (isl + osl))`; stops at the
    first ISL whose one request does not fit the KV cache."""
    top = max_context_length - osl
    if top <= MIN_ISL:
        raise PlanError(
            f"--max-context-length {max_context_length} leaves no decode lengths with OSL"
            f" {osl}: it must be more than {MIN_ISL + osl}"
        )
    step = max(1, top // max(1, granularity))
    loads: list[DecodeLoad] = []
    for isl in range(MIN_ISL, top, step):
        fit = max_kv_tokens // (isl + osl)
        if fit == 0:
            break
        counts = num_request_range(fit, granularity, cap=max_concurrency)
        loads += [DecodeLoad(isl, osl, n) for n in counts]
    if not loads:
        raise PlanError(
            f"the KV cache ({max_kv_tokens} tokens) cannot hold one request of"
            f" {MIN_ISL}+{osl} tokens"
        )
    return loads


@dataclass(frozen=True, slots=True)
class SweepSettings:
    """What the user asked for (flags), before any server limit is known."""

    isl: int = 3000  # Dynamo's profiler defaults: ISL 3000, OSL 500
    osl: int = 500
    max_context_length: int = 16384
    prefill_granularity: int = PREFILL_GRANULARITY
    decode_granularity: int = DECODE_GRANULARITY
    decode_osl: int = DECODE_OSL
    prefill_osl: int = PREFILL_OSL
    repeats: int = 3  # prefill TTFT is the median of this many unique prompts
    # Most streams at once. Dynamo caps at 2000; a server's max_num_seqs (vLLM's default
    # 256, 1024 on H100) or the client's CPU may call for less.
    max_concurrency: int = DECODE_MAX_CONCURRENCY

    @classmethod
    def quick(cls, **overrides: int) -> SweepSettings:
        """A few points per phase (tests, smoke runs): 4 prefill lengths, 3 decode
        lengths x 3 counts, OSL 100, one prompt per prefill length."""
        values = {
            "prefill_granularity": 4,
            "decode_granularity": 3,
            "decode_osl": 100,
            "repeats": 1,
            **overrides,
        }
        return cls(**values)

    def check(self) -> None:
        names = (
            "isl",
            "osl",
            "prefill_granularity",
            "decode_granularity",
            "repeats",
            "max_concurrency",
        )
        for name in names:
            if getattr(self, name) < 1:
                raise PlanError(f"--{name.replace('_', '-')} must be >= 1")
        if self.decode_osl < 2:
            raise PlanError("--decode-osl must be >= 2 (an ITL needs two tokens)")


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    """What a server says about itself: its KV capacity and longest sequence."""

    max_kv_tokens: int
    max_model_len: int


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """Every point to measure on one endpoint, with the limits they were derived from."""

    comparison_isl: int
    comparison_decode: tuple[DecodeLoad, ...]
    prefill_isls: tuple[int, ...]
    decode: tuple[DecodeLoad, ...]
    prefill_osl: int
    max_context_length: int
    max_kv_tokens: int


def make_plan(settings: SweepSettings, limits: EndpointLimits) -> SweepPlan:
    """Phase A and B points for one endpoint. `max_ctx` is the smaller of
    `--max-context-length` and the server's `max_model_len` (as Dynamo)."""
    settings.check()
    max_ctx = min(settings.max_context_length, limits.max_model_len)
    if settings.isl + settings.osl > limits.max_model_len:
        raise PlanError(
            f"--isl {settings.isl} + --osl {settings.osl} exceeds the server's max_model_len"
            f" {limits.max_model_len}"
        )
    fit = limits.max_kv_tokens // (settings.isl + settings.osl)
    if fit == 0:
        raise PlanError(
            f"the KV cache ({limits.max_kv_tokens} tokens) cannot hold one request of"
            f" --isl {settings.isl} + --osl {settings.osl}"
        )
    comparison = tuple(
        DecodeLoad(settings.isl, settings.osl, n)
        for n in num_request_range(fit, settings.decode_granularity, cap=settings.max_concurrency)
    )
    return SweepPlan(
        comparison_isl=settings.isl,
        comparison_decode=comparison,
        prefill_isls=tuple(prefill_isl_grid(max_ctx, settings.prefill_granularity)),
        decode=tuple(
            decode_grid(
                max_ctx,
                limits.max_kv_tokens,
                settings.decode_granularity,
                settings.decode_osl,
                settings.max_concurrency,
            )
        ),
        prefill_osl=settings.prefill_osl,
        max_context_length=max_ctx,
        max_kv_tokens=limits.max_kv_tokens,
    )
