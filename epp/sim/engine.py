"""The simulated inference engine: a FIFO waiting queue, a bounded running batch and a
step loop, shaped like vLLM's scheduler so the load signals it exposes behave like the
real ones (requests queue when the batch is full, KV usage grows as tokens are made).

Each step of the loop admits waiting requests (FIFO, up to `max_num_seqs` running and
the KV capacity), then runs one engine iteration whose model-time cost comes from
`Engine.step_seconds`: newly admitted requests are prefilled and get their first token,
requests already decoding get one more token each. So TTFT = queue wait + prefill (+ any
decode step it shares), and tokens then follow once per decode step. A more realistic
latency model replaces `step_seconds` (and, for chunked prefill or prefix caching, the
split into prefill/decode sets) without touching the HTTP layer.

Timestamps are model time (see `clock.py`). A step's tokens are stamped at
`step start + step cost`, so oversleeping never shows up as model latency; only the
short real gap between two steps does (multiplied by `time_scale`, so reported times
are exact lower bounds and grow a little noisier as the scale grows).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import math
from dataclasses import dataclass, field
from typing import Protocol

from epp.sim.clock import ModelClock
from epp.sim.config import SimConfig

log = logging.getLogger("epp.sim")


class State(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


_ids = itertools.count()


@dataclass(eq=False)
class SimRequest:
    """One sequence to generate. `sink` receives a `Token` per generated token (the last
    one carries `finish_reason`) or one `Aborted`; several requests may share a sink,
    which is how a batched `/v1/completions` prompt list streams its choices."""

    prompt_tokens: int
    max_tokens: int
    sink: asyncio.Queue[Token | Aborted]
    model: str = ""
    index: int = 0
    finish_reason: str = "length"
    not_before: float = 0.0
    id: int = field(default_factory=lambda: next(_ids))
    state: State = State.WAITING
    arrival: float = 0.0
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    generated: int = 0

    @property
    def kv_reserved_tokens(self) -> int:
        """What admission reserves: the whole sequence, so a running batch never
        outgrows the cache (the sim does not model preemption)."""
        return self.prompt_tokens + self.max_tokens

    @property
    def kv_held_tokens(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(frozen=True, slots=True)
class Token:
    request: SimRequest
    index: int
    time: float
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Aborted:
    request: SimRequest
    reason: str


class EngineObserver(Protocol):
    """What metrics need to hear from the engine; all times are model seconds."""

    def on_admit(self, req: SimRequest, queue_seconds: float) -> None: ...

    def on_first_token(self, req: SimRequest, ttft_seconds: float) -> None: ...

    def on_next_token(self, req: SimRequest, itl_seconds: float) -> None: ...

    def on_finish(self, req: SimRequest, e2e_seconds: float) -> None: ...


class NullObserver:
    def on_admit(self, req: SimRequest, queue_seconds: float) -> None:
        pass

    def on_first_token(self, req: SimRequest, ttft_seconds: float) -> None:
        pass

    def on_next_token(self, req: SimRequest, itl_seconds: float) -> None:
        pass

    def on_finish(self, req: SimRequest, e2e_seconds: float) -> None:
        pass


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
        observer: EngineObserver | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or ModelClock(config.time_scale)
        self.observer: EngineObserver = observer or NullObserver()
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.steps = 0
        self.max_running_seen = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------

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
        for req in [*self.waiting, *self.running]:
            req.state = State.ABORTED
            req.sink.put_nowait(Aborted(req, reason))
        self.waiting.clear()
        self.running.clear()

    # -- requests ------------------------------------------------------------------

    def submit(self, req: SimRequest, delay_seconds: float = 0.0) -> None:
        """Queue a request; with a delay it waits (and counts as waiting) that much
        model time before it may be scheduled."""
        if self._closed:
            raise RuntimeError("engine is stopped")
        req.arrival = self.clock.now()
        req.not_before = req.arrival + max(0.0, delay_seconds)
        req.state = State.WAITING
        self.waiting.append(req)
        self._wake.set()

    def abort(self, req: SimRequest) -> None:
        """Drop a request whose client went away, freeing its slot and KV space."""
        if req.state is State.WAITING:
            self.waiting.remove(req)
        elif req.state is State.RUNNING:
            self.running.remove(req)
        else:
            return
        req.state = State.ABORTED
        self._wake.set()

    # -- load signals ------------------------------------------------------------

    @property
    def kv_blocks_used(self) -> int:
        bs = self.config.block_size
        return sum(math.ceil(r.kv_held_tokens / bs) for r in self.running)

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_usage=min(1.0, self.kv_blocks_used / self.config.num_gpu_blocks),
            running_models=tuple(sorted({r.model for r in self.running})),
            waiting_models=tuple(sorted({r.model for r in self.waiting})),
        )

    # -- the latency model ---------------------------------------------------------

    def step_seconds(self, prefill: list[SimRequest], decode: list[SimRequest]) -> float:
        """Model-time cost of one engine iteration. The extension point for a more
        realistic model (compute vs memory bound, chunked prefill, cache hits)."""
        cfg = self.config
        cost = sum(r.prompt_tokens for r in prefill) * cfg.prefill_ms_per_token
        if decode:
            cost += cfg.decode_ms_per_token * (1.0 + cfg.batch_slowdown * (len(decode) - 1))
        return cost / 1000.0

    # -- the loop ----------------------------------------------------------------

    def _admit(self, now: float) -> None:
        cfg = self.config
        reserved = sum(r.kv_reserved_tokens for r in self.running)
        while len(self.running) < cfg.max_num_seqs:
            # FIFO, except that a request still serving an injected delay lets ready
            # ones behind it go first (the delay must not stall the whole server).
            req = next((r for r in self.waiting if r.not_before <= now), None)
            if req is None:
                return
            if self.running and reserved + req.kv_reserved_tokens > cfg.kv_capacity_tokens:
                return
            self.waiting.remove(req)
            req.state = State.RUNNING
            req.admitted_at = now
            reserved += req.kv_reserved_tokens
            self.running.append(req)
            self.observer.on_admit(req, now - req.arrival)

    async def _idle(self) -> None:
        self._wake.clear()
        timeout = None
        if self.waiting:
            earliest = min(r.not_before for r in self.waiting)
            timeout = self.clock.to_real(earliest - self.clock.now())
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
        while not self._closed:
            start = self.clock.now()
            self._admit(start)
            self.max_running_seen = max(self.max_running_seen, len(self.running))
            if not self.running:
                await self._idle()
                continue
            prefill = [r for r in self.running if r.generated == 0]
            decode = [r for r in self.running if r.generated > 0]
            cost = self.step_seconds(prefill, decode)
            await self.clock.sleep(cost)
            end = start + cost
            self.steps += 1
            for req in prefill + decode:
                if req.state is State.RUNNING:  # not aborted during the sleep
                    self._emit(req, end)

    def _emit(self, req: SimRequest, now: float) -> None:
        index = req.generated
        req.generated += 1
        if index == 0:
            req.first_token_at = now
            self.observer.on_first_token(req, now - req.arrival)
        else:
            assert req.last_token_at is not None
            self.observer.on_next_token(req, now - req.last_token_at)
        req.last_token_at = now
        finish = None
        if req.generated >= req.max_tokens:
            finish = req.finish_reason
            self.running.remove(req)
            req.state = State.FINISHED
            req.finished_at = now
            self.observer.on_finish(req, now - req.arrival)
        req.sink.put_nowait(Token(req, index, now, finish))
