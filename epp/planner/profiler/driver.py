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

from epp.planner.profiler.measure import DecodeTiming, PrefillTiming, median
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

    async def prefill(self, isl: int, osl: int) -> PrefillTiming:
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


def _median_prefill(timings: list[PrefillTiming], isl: int, num_gpus: int) -> PrefillResult:
    server = [t.server_ttft_ms for t in timings if t.server_ttft_ms is not None]
    return PrefillResult(
        isl,
        median([t.ttft_ms for t in timings]),
        num_gpus,
        median(server) if len(server) == len(timings) else None,
    )


async def _prefill(
    target: Target, isl: int, osl: int, repeats: int, progress: Callable[[], None]
) -> PrefillResult:
    timings = []
    for _ in range(repeats):
        progress()
        timings.append(await target.prefill(isl, osl))
    return _median_prefill(timings, isl, target.endpoint.num_gpus)


async def _decode(target: Target, load: DecodeLoad) -> DecodeResult:
    t = await target.decode(load)
    gpus = target.endpoint.num_gpus
    return DecodeResult(load, t.itl_ms, t.tokens_per_s / gpus, t.server_itl_ms)


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
        await target.prefill(MIN_ISL, plan.prefill_osl)  # the first request pays set-up
        prefill = await _prefill(
            target,
            settings.isl,
            plan.prefill_osl,
            settings.repeats,
            lambda name=name: counter.step(f"{name} prefill isl={settings.isl}"),
        )
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
    counter.total += len(p_plan.prefill_isls) * settings.repeats + len(d_plan.decode)
    prefill_points = []
    p_name = p_target.endpoint.name
    for isl in p_plan.prefill_isls:
        prefill_points.append(
            await _prefill(
                p_target,
                isl,
                p_plan.prefill_osl,
                settings.repeats,
                lambda isl=isl: counter.step(f"{p_name} prefill sweep isl={isl}"),
            )
        )
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
