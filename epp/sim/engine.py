"""The simulated inference engine: vLLM's scheduler (`scheduler.py`) driven by a step
loop that spends each step's cost (`latency.py`) in model time.

Each iteration asks the scheduler for a step, sleeps the step's model-time length
(`Engine.step_seconds`, the hook to change the latency model), then lets the scheduler
append the sampled tokens. Requests that arrive during a step join the next one, as in a
real engine. KV events produced by the step are handed to the publisher, if any.

Timestamps are model time (see `clock.py`). A step's tokens are stamped at
`step start + step cost`, so oversleeping never shows up as model latency; only the
short real gap between two steps does (multiplied by `time_scale`, so reported times
are exact lower bounds and grow a little noisier as the scale grows).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epp.sim.clock import ModelClock
from epp.sim.config import SimConfig
from epp.sim.kvcache import KVCache, KVEvent
from epp.sim.latency import StepCostModel
from epp.sim.lora import LoraRegistry
from epp.sim.scheduler import NullObserver, Scheduler, SchedulerObserver, StepPlan
from epp.sim.sequence import SimRequest, State

log = logging.getLogger("epp.sim")

EngineObserver = SchedulerObserver  # the name the metrics module implements

__all__ = ["Engine", "EngineObserver", "EngineSnapshot", "NullObserver", "SimRequest", "State"]


@dataclass(frozen=True)
class EngineSnapshot:
    """The load signals a model server publishes, read at one instant."""

    running: int
    waiting: int
    kv_usage: float
    running_models: tuple[str, ...]
    waiting_models: tuple[str, ...]


class Engine:
    def __init__(
        self,
        config: SimConfig,
        clock: ModelClock | None = None,
        observer: SchedulerObserver | None = None,
        *,
        lora: LoraRegistry | None = None,
        output_ids: Sequence[int] = (0,),
        publish: Callable[[list[KVEvent]], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or ModelClock(config.time_scale)
        self.observer: SchedulerObserver = observer or NullObserver()
        self.kv = KVCache(
            config.num_gpu_blocks,
            config.block_size,
            enable_caching=config.enable_prefix_caching,
            emit_events=publish is not None,
            offload_blocks=config.kv_offload_blocks,
        )
        self.lora = lora or LoraRegistry(config.lora_modules, config.max_loras)
        self.cost_model = StepCostModel(config)
        self.scheduler = Scheduler(config, self.kv, self.lora, self.observer, output_ids)
        self._publish = publish
        # Every request not known to be done, so a crash can fail even one the scheduler
        # held in hand; pruned as it grows.
        self._live: set[SimRequest] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- views -------------------------------------------------------------------------

    @property
    def waiting(self) -> list[SimRequest]:
        return [*self.scheduler.waiting, *self.scheduler.transferring]

    @property
    def running(self) -> list[SimRequest]:
        return self.scheduler.running

    @property
    def steps(self) -> int:
        return self.scheduler.stats.steps

    @property
    def max_running_seen(self) -> int:
        return self.scheduler.stats.max_running_seen

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.num_used_blocks

    def snapshot(self) -> EngineSnapshot:
        sched = self.scheduler
        waiting_models = {r.model for r in sched.waiting}
        waiting_models.update(r.model for r in sched.transferring)
        return EngineSnapshot(
            running=len(sched.running),
            waiting=sched.num_waiting,
            kv_usage=self.kv.usage,
            running_models=tuple(sorted({r.model for r in sched.running})),
            waiting_models=tuple(sorted(waiting_models)),
        )

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Abort everything in flight (handlers then answer at once) and end the loop."""
        self._abort_all("server is shutting down")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _abort_all(self, reason: str) -> None:
        self._closed = True
        sched = self.scheduler
        for req in {*self._live, *sched.waiting, *sched.transferring, *sched.running}:
            if req.done:
                continue
            req.state = State.ABORTED
            req.abort_reason = reason
            req.channel.notify()
        sched.waiting.clear()
        sched.transferring.clear()
        sched.running.clear()
        self._live.clear()

    # -- requests ----------------------------------------------------------------------

    def submit(self, req: SimRequest, delay_seconds: float = 0.0) -> None:
        """Queue a request; with a delay it waits (and counts as waiting) that much
        model time before it may be scheduled."""
        if self._closed:
            raise RuntimeError("engine is stopped")
        live = self._live
        if len(live) >= 1024 and len(live) > 4 * (len(self.running) + self.scheduler.num_waiting):
            self._live = live = {r for r in live if not r.done}
        live.add(req)
        self.scheduler.add(req, self.clock.now(), delay_seconds)
        self._wake.set()

    def abort(self, req: SimRequest, reason: str = "client disconnected") -> None:
        """Drop a request whose client went away, freeing its slot and KV blocks."""
        if self.scheduler.abort(req, reason):
            self._wake.set()

    def reset_prefix_cache(self) -> bool:
        ok = self.kv.reset()
        self._flush_events()
        return ok

    # -- the latency model -------------------------------------------------------------

    def step_seconds(self, plan: StepPlan) -> float:
        """Model-time cost of one engine step; override to change the latency model."""
        return self.cost_model.seconds(plan.shape)

    # -- the loop ----------------------------------------------------------------------

    def _flush_events(self) -> None:
        if self._publish is not None and self.kv.events:
            self._publish(self.kv.drain_events())

    async def _idle(self, now: float) -> None:
        self._wake.clear()
        wakeup = self.scheduler.next_wakeup(now)
        timeout = None if wakeup is None else self.clock.to_real(wakeup - self.clock.now())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            # A bug here must fail requests loudly, not leave them waiting forever.
            log.exception("simulated engine crashed")
            self._abort_all("engine crashed")

    async def _loop(self) -> None:
        sched = self.scheduler
        clock = self.clock
        while not self._closed:
            start = clock.now()
            plan = sched.schedule(start)
            self._flush_events()
            if plan is None:
                await self._idle(start)
                continue
            cost = self.step_seconds(plan)
            await clock.sleep(cost)
            sched.finish_step(plan, start + cost)
