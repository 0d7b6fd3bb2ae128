"""One simulated model server in virtual time: the simulator's own scheduler, KV cache
and step-cost model, driven by the caller's clock instead of an event loop.

`epp sim` runs `Engine`, which sleeps each step's cost; a replay of an hour of traffic
through a pool of servers cannot. `VirtualEngine` runs the very same `Scheduler`,
`KVCache` and `StepCostModel` (so a replay, a virtual-time profile and a live `epp sim`
agree on every step), stepping only when the caller asks: `add(rid, isl, osl, at)` queues
a request, `advance_to(t)` runs every step that *starts* before `t` (a request that
arrives while a step runs joins the next one, as in `Engine`), `drain_finished()` hands
back what completed, `load()` reads the signals a server publishes.

Speed comes from macro-stepping. Most steps of a loaded server are decode-only: every
running sequence computes one token, nothing is admitted. Such a step costs
`F(n) + c * context` (`StepCostModel.decode_terms`) and the context grows by `n` per step,
so a run of `k` of them costs `k*F + c*(k*T0 + n*k*(k-1)/2)` in closed form. The engine
jumps over the whole run at once, up to the first completion, the caller's limit or
the point where the KV cache would run out (then it steps singly, and the scheduler
preempts as usual). A run is taken only when a single step could not admit anything
either: the queue is empty, or its head cannot be admitted and the run cannot change
that (free blocks only shrink while decoding, and `max_num_seqs` is full or not for
the whole run). The result equals single-stepping up to float rounding of the summed
step times (`tests/unit/test_sim_virtual.py` checks every token's time); the one
difference is which physical block a request's new decode block is (the blocks'
contents and the prefix cache are the same).

Prompts: with prefix caching off every prompt is distinct in effect, so its token ids
are not built (a list of zeros of the right length; the scheduler only counts them).
With caching on, a request's `hash_ids` (Mooncake's 512-token prefix blocks: equal ids =
equal tokens) become token ids `HASH_BASE + h*block_tokens + offset`, and any tokens
past them ids unique to the request, so two requests share exactly the prefix their
trace says they share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from epp.sim.config import SimConfig
from epp.sim.kvcache import KVCache
from epp.sim.latency import StepCostModel
from epp.sim.lora import LoraRegistry
from epp.sim.scheduler import Scheduler
from epp.sim.sequence import Channel, SimRequest, State

OUTPUT_ID = 0  # every generated token; prompt ids below never use it
HASH_BASE = 1 << 20
TAIL_BASE = 1 << 40
_TAIL_SPAN = 1 << 21  # > any model length, so request tails never overlap
_SHARED_CHANNEL = Channel(stream=False)  # nobody waits on a virtual request


@dataclass(frozen=True, slots=True)
class Finished:
    """One completed request, times in the caller's virtual seconds."""

    rid: int
    arrival: float
    first_token: float
    finish: float
    isl: int
    osl: int
    cached_tokens: int  # prompt tokens served from the prefix cache at admission
    preemptions: int
    token_times: tuple[float, ...] = ()  # every output token's time, if recorded

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.arrival

    @property
    def itl_s(self) -> float:
        """Mean gap between output tokens (the request's TPOT); NaN with one token."""
        if self.osl < 2:
            return math.nan
        return (self.finish - self.first_token) / (self.osl - 1)

    @property
    def duration_s(self) -> float:
        return self.finish - self.arrival


@dataclass(frozen=True, slots=True)
class Load:
    """What the server would publish now (vLLM's gauges) plus its work in hand."""

    waiting: int
    running: int
    kv_usage: float  # 0..1, `vllm:kv_cache_usage_perc`
    in_flight_tokens: int  # prompt tokens still to compute + output tokens still to make

    @property
    def in_flight_requests(self) -> int:
        return self.waiting + self.running


@dataclass(eq=False)
class _Request(SimRequest):
    rid: int = -1
    times: list[float] | None = None


def prompt_tokens(rid: int, isl: int, hash_ids: Sequence[int], block_tokens: int) -> list[int]:
    """Token ids for a prompt of `isl` tokens whose leading `block_tokens`-token blocks
    are the trace's `hash_ids`; tokens past them are unique to request `rid`."""
    out: list[int] = []
    for h in hash_ids:
        if len(out) >= isl:
            break
        start = HASH_BASE + h * block_tokens
        out.extend(range(start, start + min(block_tokens, isl - len(out))))
    if len(out) < isl:
        start = TAIL_BASE + rid * _TAIL_SPAN
        out.extend(range(start, start + isl - len(out)))
    return out


class VirtualEngine:
    """One replica. Not thread-safe; the caller owns the clock (see the module doc)."""

    def __init__(
        self,
        config: SimConfig,
        *,
        block_tokens: int = 512,
        macro: bool = True,
        record_token_times: bool = False,
    ) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.config = config
        self.kv = KVCache(
            config.num_gpu_blocks, config.block_size, enable_caching=config.enable_prefix_caching
        )
        self.cost = StepCostModel(config)
        self.scheduler = Scheduler(
            config, self.kv, LoraRegistry((), config.max_loras), output_ids=[OUTPUT_ID]
        )
        self.block_tokens = block_tokens
        self.macro = macro
        self.record_token_times = record_token_times
        self.clock = 0.0  # when the next step may start (the end of the last one)
        self.macro_steps = 0  # runs jumped over (each counts its steps in scheduler.stats)
        self._finished: list[Finished] = []

    # -- requests ------------------------------------------------------------------------

    def add(self, rid: int, isl: int, osl: int, at: float, hash_ids: Sequence[int] = ()) -> None:
        """Queue request `rid` (`isl` prompt tokens, `osl` output tokens) arriving at `at`.
        Call `advance_to(at)` first so the engine's state is that of time `at`."""
        if isl < 1 or osl < 1:
            raise ValueError(f"request {rid}: isl and osl must be >= 1 (got {isl}, {osl})")
        if isl + osl > self.config.model_len:
            raise ValueError(
                f"request {rid}: {isl} prompt + {osl} output tokens exceed the model's "
                f"length {self.config.model_len} (a server would reject it)"
            )
        if self.kv.enable_caching:
            prompt = prompt_tokens(rid, isl, hash_ids, self.block_tokens)
        else:
            prompt = [0] * isl
        req = _Request(prompt, osl, _SHARED_CHANNEL, rid=rid)
        req.prompt = ()  # the scheduler works on req.tokens (a copy); keep one copy
        if self.record_token_times:
            req.times = []
        if self.idle:
            self.clock = max(self.clock, at)
        self.scheduler.add(req, at)

    @property
    def idle(self) -> bool:
        s = self.scheduler
        return not (s.running or s.waiting or s.transferring)

    def next_event_time(self) -> float:
        """When the next step starts (`inf` when there is nothing to do)."""
        return math.inf if self.idle else self.clock

    def drain_finished(self) -> list[Finished]:
        out, self._finished = self._finished, []
        return out

    def load(self) -> Load:
        s = self.scheduler
        tokens = 0
        for queue in (s.running, s.waiting, s.transferring):
            for r in queue:
                tokens += max(0, r.num_prompt_tokens - r.num_computed_tokens)
                tokens += r.max_tokens - r.generated
        return Load(s.num_waiting, len(s.running), self.kv.usage, tokens)

    # -- stepping ------------------------------------------------------------------------

    def advance_to(self, t: float) -> None:
        """Run every step that starts before `t`. The last one may end after `t`."""
        sched = self.scheduler
        while self.clock < t and not self.idle:
            if self.macro and self._macro_step(t):
                continue
            plan = sched.schedule(self.clock)
            if plan is None:  # only requests held back; nothing in this model does that
                wake = sched.next_wakeup(self.clock)
                if wake is None or wake >= t:
                    break
                self.clock = wake
                continue
            end = self.clock + self.cost.seconds(plan.shape)
            produced = sched.finish_step(plan, end)
            self.clock = end
            for req in produced:
                if req.times is not None:
                    req.times.append(end)
                if req.state is State.FINISHED:
                    self._finish(req)

    def _finish(self, req: _Request) -> None:
        assert req.first_token_at is not None and req.finished_at is not None
        self._finished.append(
            Finished(
                rid=req.rid,
                arrival=req.arrival,
                first_token=req.first_token_at,
                finish=req.finished_at,
                isl=req.num_prompt_tokens,
                osl=req.generated,
                cached_tokens=req.num_cached_tokens,
                preemptions=req.preemptions,
                token_times=tuple(req.times) if req.times is not None else (),
            )
        )
        req.tokens = []  # the scheduler is done with it; an hour of prompts is gigabytes
        req.block_hashes = []

    # -- macro-stepping -------------------------------------------------------------------

    def _macro_step(self, limit: float) -> bool:
        """Jump over a run of >= 2 decode-only steps, if one starts now; False if not."""
        sched = self.scheduler
        cfg = self.config
        running = sched.running
        n = len(running)
        if n == 0 or sched.transferring or n > cfg.max_num_batched_tokens:
            return False
        context = 0
        cap = math.inf
        for r in running:
            nt = len(r.tokens)
            if r.num_computed_tokens != nt - 1 or not r.generated:
                return False  # a prefill (or a recompute) is in the batch
            context += nt
            cap = min(cap, r.max_tokens - r.generated)
        if sched.waiting and not self._head_blocked(n):
            return False
        run = _DecodeRun(*self.cost.decode_terms(n), context=context, decodes=n)
        k = int(cap)
        budget = limit - self.clock
        if math.isfinite(budget) and run.total(k - 1) >= budget:
            k = run.steps_starting_before(budget, k)
        k = self._kv_fit(k)
        if k < 2:
            return False
        self._apply(k, run)
        return True

    def _head_blocked(self, decodes: int) -> bool:
        """Whether the scheduler's admission loop would admit nothing this step, and go on
        admitting nothing while the batch only decodes (mirrors `_admit_waiting`)."""
        sched = self.scheduler
        cfg = self.config
        if len(sched.running) >= cfg.max_num_seqs:
            return True
        budget = cfg.max_num_batched_tokens - decodes
        if budget <= 0:
            return True
        head = sched.waiting[0]
        if head.not_before > self.clock or head.lora:
            return False  # held back or adapter-gated: not modelled here, step singly
        fresh = head.num_computed_tokens == 0
        hits = self.kv.find_cached_prefix(head) if fresh else []
        computed = len(hits) * self.kv.block_size if fresh else head.num_computed_tokens
        want = min(head.num_tokens - computed, budget)
        return not sched._can_allocate(head, hits, computed + want)

    def _kv_fit(self, k: int) -> int:
        """The longest run (<= k steps) whose new decode blocks fit in the free blocks, so
        nothing would be preempted; the next single step then preempts as vLLM does."""
        bs = self.kv.block_size
        free = self.kv.num_free_blocks
        running = self.scheduler.running

        def need(m: int) -> int:  # blocks to hold each sequence's tokens after m steps
            return sum(max(0, -(-(len(r.tokens) + m - 1) // bs) - len(r.blocks)) for r in running)

        if need(k) <= free:
            return k
        lo, hi = 0, k  # need(lo) <= free < need(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _apply(self, k: int, run: _DecodeRun) -> None:
        sched = self.scheduler
        kv = self.kv
        start = self.clock
        end = start + run.total(k)
        times = None
        if self.record_token_times:
            times = [start + run.total(j) for j in range(1, k + 1)]
        done: list[_Request] = []
        for r in sched.running:
            held = len(r.tokens) + k - 1  # tokens computed after the run
            r.tokens.extend([OUTPUT_ID] * k)
            r.generated += k
            r.num_computed_tokens = held
            ok = kv.allocate(r, held)
            assert ok, "macro step outgrew the KV cache (_kv_fit is wrong)"
            kv.cache_full_blocks(r, held)
            r.last_token_at = end
            if r.times is not None and times is not None:
                r.times.extend(times)
            if r.generated >= r.max_tokens:
                done.append(r)
        n = len(sched.running)
        stats = sched.stats
        stats.steps += k
        stats.max_batched_tokens_seen = max(stats.max_batched_tokens_seen, n)
        self.macro_steps += 1
        self.clock = end
        if done:
            sched.running = [r for r in sched.running if r.generated < r.max_tokens]
            for r in done:  # in batch order, as finish_step frees them
                r.state = State.FINISHED
                r.finished_at = end
                kv.free(r)
                self._finish(r)


@dataclass(frozen=True, slots=True)
class _DecodeRun:
    """A run of decode-only steps of `decodes` sequences attending `context` tokens at
    its first step: step j costs `fixed + per_token * (context + decodes * j)`."""

    fixed: float
    per_token: float
    context: int
    decodes: int

    def total(self, m: int) -> float:
        """Seconds of the first m steps."""
        n = self.decodes
        return m * self.fixed + self.per_token * (m * self.context + n * m * (m - 1) / 2)

    def steps_starting_before(self, budget: float, cap: int) -> int:
        """How many of the first `cap` steps start before `budget` seconds from now:
        1 + the largest m < cap with total(m) < budget (the quadratic's root, then a
        fix-up for float rounding)."""
        a = self.per_token * self.decodes / 2
        b = self.fixed + self.per_token * self.context - a
        if a > 0:
            m = int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))
        else:
            m = int(budget / b) if b > 0 else cap - 1
        m = max(0, min(m, cap - 1))
        while m > 0 and self.total(m) >= budget:
            m -= 1
        while m < cap - 1 and self.total(m + 1) < budget:
            m += 1
        return m + 1
