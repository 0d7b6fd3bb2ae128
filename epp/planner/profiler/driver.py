"""Walk the plan over any target: the comparison at the target ISL/OSL on every
endpoint, the recommendation, then the in-depth sweep of the chosen ones.

A `Target` measures one point at a time; `sweep.HttpTarget` does it against a running
OpenAI server, `virtual.VirtualTarget` in the simulator's virtual time. The walk itself
does no I/O: it reports progress through a callback, so the same code serves
`epp profile --url` and `epp profile --virtual-preset`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from epp.planner.profiler.measure import DecodeTiming, median
from epp.planner.profiler.plan import (
    MIN_ISL,
    DecodeLoad,
    EndpointLimits,
    SweepPlan,
    SweepSettings,
    make_plan,
)
from epp.planner.profiler.results import (
    Candidate,
    DecodeResult,
    Endpoint,
    PrefillResult,
    Recommendation,
    recommend,
)


class Target(Protocol):
    """One endpoint under test. Times are in the server's model time (ms)."""

    endpoint: Endpoint

    async def limits(self) -> EndpointLimits: ...

    async def prefill_ttft_ms(self, isl: int, osl: int) -> float:
        """TTFT of one request with a prompt never sent before (no KV reuse), alone."""
        ...

    async def decode(self, load: DecodeLoad) -> DecodeTiming:
        """`load.num_request` streams together, prompts warmed first (prefix cached)."""
        ...


Progress = Callable[[int, int, str], None]  # (done, total, what is being measured)


@dataclass(frozen=True, slots=True)
class Sla:
    ttft_ms: float
    itl_ms: float


@dataclass(frozen=True, slots=True)
class ProfileReport:
    candidates: tuple[Candidate, ...]
    recommendation: Recommendation
    prefill: tuple[PrefillResult, ...]  # the chosen prefill endpoint's ISL sweep
    decode: tuple[DecodeResult, ...]  # the chosen decode endpoint's ISL x in-flight sweep
    decode_max_kv_tokens: int
    prefill_plan: SweepPlan
    decode_plan: SweepPlan


class _Counter:
    def __init__(self, total: int, report: Progress) -> None:
        self.done, self.total, self.report = 0, total, report

    def step(self, what: str) -> None:
        self.report(self.done, self.total, what)
        self.done += 1

    def finish(self) -> None:
        self.report(self.total, self.total, "done")


async def _prefill(target: Target, isl: int, osl: int, repeats: int) -> PrefillResult:
    ttft = median([await target.prefill_ttft_ms(isl, osl) for _ in range(repeats)])
    return PrefillResult(isl, ttft, target.endpoint.num_gpus)


async def _decode(target: Target, load: DecodeLoad) -> DecodeResult:
    timing = await target.decode(load)
    return DecodeResult(load, timing.itl_ms, timing.tokens_per_s / target.endpoint.num_gpus)


async def profile(
    targets: Sequence[Target],
    settings: SweepSettings,
    sla: Sla,
    progress: Progress = lambda done, total, what: None,
) -> ProfileReport:
    """Phase A on every target, recommend, phase B on the chosen ones (§4)."""
    if not targets:
        raise ValueError("no endpoint to profile")
    plans = [make_plan(settings, await t.limits()) for t in targets]
    total = sum(1 + settings.repeats + len(p.comparison_decode) for p in plans)
    counter = _Counter(total, progress)

    candidates = []
    for target, plan in zip(targets, plans, strict=True):
        name = target.endpoint.name
        counter.step(f"{name} warm-up")
        await target.prefill_ttft_ms(MIN_ISL, plan.prefill_osl)  # first request pays set-up
        ttfts = []
        for _ in range(settings.repeats):
            counter.step(f"{name} prefill isl={settings.isl}")
            ttfts.append(await target.prefill_ttft_ms(settings.isl, plan.prefill_osl))
        prefill = PrefillResult(settings.isl, median(ttfts), target.endpoint.num_gpus)
        decode = []
        for load in plan.comparison_decode:
            counter.step(f"{name} decode isl={load.isl} n={load.num_request}")
            decode.append(await _decode(target, load))
        candidates.append(Candidate(target.endpoint, plan.max_kv_tokens, prefill, tuple(decode)))
    rec = recommend(
        candidates, ttft_ms=sla.ttft_ms, itl_ms=sla.itl_ms, isl=settings.isl, osl=settings.osl
    )

    p_index = candidates.index(rec.prefill.candidate)
    d_index = candidates.index(rec.decode.candidate)
    p_target, p_plan = targets[p_index], plans[p_index]
    d_target, d_plan = targets[d_index], plans[d_index]
    counter.total += len(p_plan.prefill_isls) + len(d_plan.decode)
    prefill_points = []
    for isl in p_plan.prefill_isls:
        counter.step(f"{p_target.endpoint.name} prefill sweep isl={isl}")
        prefill_points.append(await _prefill(p_target, isl, p_plan.prefill_osl, settings.repeats))
    decode_points = []
    for load in d_plan.decode:
        counter.step(f"{d_target.endpoint.name} decode sweep isl={load.isl} n={load.num_request}")
        decode_points.append(await _decode(d_target, load))
    counter.finish()
    return ProfileReport(
        candidates=tuple(candidates),
        recommendation=rec,
        prefill=tuple(prefill_points),
        decode=tuple(decode_points),
        decode_max_kv_tokens=d_plan.max_kv_tokens,
        prefill_plan=p_plan,
        decode_plan=d_plan,
    )
