"""The profile of a simulator preset, measured in virtual time: seconds, not minutes.

`epp profile --virtual-preset llama-3.1-8b-h100` runs the same plan as an HTTP sweep,
but each point goes straight through the simulator's own scheduler
(`epp.sim.scheduler.Scheduler`, vLLM V1's policy) and step-cost model
(`epp.sim.latency.StepCostModel`) on a virtual clock, exactly as a running `epp sim`
does minus the event loop (the same replacement `bench/sim_calibration.py` makes). It
writes the NPZ files the replay (`epp plan replay`) interpolates, so replay and
preset agree by construction; `docs/BENCHMARKS.md@a73a134` "Planner: profiler" checks that an
HTTP sweep of a running `epp sim` lands on the same numbers.

Every point starts from an empty engine: prefill with one prompt nobody sent before,
decode with its prompts sent once first (max_tokens 1) so the measured streams find
their prompts in the prefix cache and decode undisturbed, as the HTTP sweep does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from epp.planner.profiler.measure import DecodeTiming, PrefillTiming, steady_decode
from epp.planner.profiler.plan import DecodeLoad, EndpointLimits
from epp.planner.profiler.results import Endpoint
from epp.sim import presets
from epp.sim.config import SimConfig
from epp.sim.kvcache import KVCache
from epp.sim.latency import StepCostModel
from epp.sim.lora import LoraRegistry
from epp.sim.scheduler import Scheduler
from epp.sim.sequence import Channel, SimRequest, State

# GPUs behind one replica of each preset (its name says so: "4xh100" is TP=4).
PRESET_GPUS = {"tiny": 1, "llama-3.1-8b-h100": 1, "llama-3.1-70b-4xh100": 4}


def preset_gpus(name: str) -> int:
    return PRESET_GPUS.get(presets.get(name).name, 1)


class _Engine:
    """One empty engine on a virtual clock; `run` steps it until every request is done
    and returns each request's token times (model seconds)."""

    def __init__(self, config: SimConfig) -> None:
        kv = KVCache(config.num_gpu_blocks, config.block_size, enable_caching=True)
        self.sched = Scheduler(config, kv, LoraRegistry((), config.max_loras), output_ids=[1])
        self.cost = StepCostModel(config)
        self.now = 0.0

    def run(self, reqs: list[SimRequest]) -> list[list[float]]:
        for r in reqs:
            self.sched.add(r, self.now)
        times: list[list[float]] = [[] for _ in reqs]
        while not all(r.done for r in reqs):
            plan = self.sched.schedule(self.now)
            if plan is None:
                wake = self.sched.next_wakeup(self.now)
                if wake is None:
                    raise RuntimeError("virtual engine stalled with requests unfinished")
                self.now = max(wake, self.now)
                continue
            before = [r.generated for r in reqs]
            end = self.now + self.cost.seconds(plan.shape)
            self.sched.finish_step(plan, end)
            self.now = end
            for i, r in enumerate(reqs):
                times[i] += [end] * (r.generated - before[i])
        if any(r.state is not State.FINISHED for r in reqs):
            raise RuntimeError("a virtual request was aborted")
        return times


@dataclass
class VirtualTarget:
    """A `driver.Target` backed by a preset in virtual time."""

    config: SimConfig
    endpoint: Endpoint
    _ids: count = field(default_factory=lambda: count(1000))

    @classmethod
    def for_preset(cls, name: str, num_gpus: int | None = None) -> VirtualTarget:
        preset = presets.get(name)
        gpus = num_gpus or preset_gpus(name)
        return cls(presets.config_for(name), Endpoint(f"virtual:{preset.name}", gpus))

    def _prompt(self, isl: int) -> list[int]:
        """Distinct token ids: no block of it was ever cached."""
        return [next(self._ids) for _ in range(isl)]

    async def limits(self) -> EndpointLimits:
        c = self.config
        return EndpointLimits(c.num_gpu_blocks * c.block_size, c.model_len)

    async def prefill(self, isl: int, osl: int) -> PrefillTiming:
        req = SimRequest(self._prompt(isl), osl, Channel(stream=False))
        _Engine(self.config).run([req])
        return PrefillTiming(1000 * (req.first_token_at - req.arrival))  # type: ignore[operator]

    async def decode(self, load: DecodeLoad) -> DecodeTiming:
        engine = _Engine(self.config)
        prompts = [self._prompt(load.isl) for _ in range(load.num_request)]
        engine.run([SimRequest(p, 1, Channel(stream=False)) for p in prompts])
        streams = engine.run([SimRequest(p, load.osl, Channel(stream=False)) for p in prompts])
        return steady_decode(streams)
