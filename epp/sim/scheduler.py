"""vLLM V1's scheduling policy, synchronous and clock-free so it can be tested (and
calibrated) step by step without sleeping.

Each `schedule(now)` builds one step the way `vllm/v1/core/sched/scheduler.py` does:

1. Running requests first, in order: each gets the tokens it still lacks (one for a
   decoding sequence, the rest of its prompt for a chunked prefill), within the step's
   token budget (`max_num_batched_tokens`), and no more than `long_prefill_token_threshold`
   prompt tokens for one request when that is set and the request is not alone. If the
   KV cache cannot hold them, the most recently admitted running request is preempted
   (its blocks freed, its progress dropped, back to the head of the queue to be
   recomputed), until it fits.
2. Then, only if nothing was preempted, waiting requests in FIFO order while there is
   budget and fewer than `max_num_seqs` run: each takes its longest prefix-cache hit,
   needs blocks for the rest of its first chunk, and is skipped (not dropped) if its
   LoRA adapter would exceed `max_loras` in the batch or an injected delay holds it.

Then `finish_step(plan, end)` appends a sampled token to every request whose computed
tokens caught up with its tokens, and retires those that reached `max_tokens`.

P/D: a request with `remote_prefill` (decode side) takes its local cache hit, reserves
blocks for the whole prompt and waits, outside the batch, for the KV transfer (its
remaining prompt tokens times `kv_transfer_ms_per_token`); then, as in vLLM, only its
last prompt token is computed, which yields its first token. A request with
`remote_decode` (prefill side) was already capped at one output token by the server.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from epp.sim.config import SimConfig
from epp.sim.kvcache import KVCache
from epp.sim.latency import StepShape
from epp.sim.lora import LoraRegistry
from epp.sim.sequence import SimRequest, State

UNCAPPED = 1 << 62  # a chunk bound no prompt reaches


class SchedulerObserver(Protocol):
    """What metrics need to hear; all times are model seconds."""

    def on_admit(self, req: SimRequest, queue_seconds: float) -> None: ...

    def on_prefix_cache(self, queries: int, hits: int) -> None: ...

    def on_first_token(self, req: SimRequest, ttft_seconds: float) -> None: ...

    def on_next_token(self, req: SimRequest, itl_seconds: float) -> None: ...

    def on_finish(self, req: SimRequest, e2e_seconds: float) -> None: ...

    def on_preempt(self, req: SimRequest) -> None: ...


class NullObserver:
    def on_admit(self, req: SimRequest, queue_seconds: float) -> None:
        pass

    def on_prefix_cache(self, queries: int, hits: int) -> None:
        pass

    def on_first_token(self, req: SimRequest, ttft_seconds: float) -> None:
        pass

    def on_next_token(self, req: SimRequest, itl_seconds: float) -> None:
        pass

    def on_finish(self, req: SimRequest, e2e_seconds: float) -> None:
        pass

    def on_preempt(self, req: SimRequest) -> None:
        pass


@dataclass(slots=True)
class StepPlan:
    """One step: (request, tokens to compute) pairs, and what the step costs depend on."""

    scheduled: list[tuple[SimRequest, int]]
    shape: StepShape
    preempted: list[SimRequest] = field(default_factory=list)


@dataclass
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0  # tokens
    prefix_cache_hits: int = 0  # tokens
    lora_loads: int = 0
    max_running_seen: int = 0
    max_batched_tokens_seen: int = 0


class Scheduler:
    def __init__(
        self,
        config: SimConfig,
        kv: KVCache,
        lora: LoraRegistry,
        observer: SchedulerObserver | None = None,
        output_ids: Sequence[int] = (0,),
    ) -> None:
        self.config = config
        self.kv = kv
        self.lora = lora
        self.observer: SchedulerObserver = observer or NullObserver()
        self.output_ids = list(output_ids) or [0]
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.transferring: list[SimRequest] = []
        self.stats = SchedulerStats()
        self._transfer_s_per_token = config.kv_transfer_ms_per_token / 1000.0
        self._chunk_cap = config.long_prefill_token_threshold or UNCAPPED

    # -- requests --------------------------------------------------------------------------

    def add(self, req: SimRequest, now: float, delay: float = 0.0) -> None:
        req.arrival = now
        req.not_before = now + max(0.0, delay)
        req.state = State.WAITING
        self.waiting.append(req)

    def abort(self, req: SimRequest, reason: str = "aborted") -> bool:
        """Drop a request wherever it is and free its blocks; False if already done."""
        if req.done:
            return False
        if req.state is State.RUNNING:
            self.running.remove(req)
        elif req in self.transferring:
            self.transferring.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        req.state = State.ABORTED
        req.abort_reason = reason
        req.channel.notify()
        return True

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.transferring)

    def next_wakeup(self, now: float) -> float | None:
        """The earliest model time at which an idle scheduler may have work again."""
        times = [r.not_before for r in self.waiting if r.not_before > now]
        times += [r.transfer_ready_at for r in self.transferring]
        return min(times) if times else None

    # -- scheduling --------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan | None:
        if self.transferring:
            self._finish_transfers(now)
        budget = self.config.max_num_batched_tokens
        cap = self.chunk_cap()
        scheduled: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        kv = self.kv

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget, cap)
            if n <= 0:  # nothing left to compute (cannot happen after a finished step)
                i += 1
                continue
            while not kv.allocate(req, req.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req.state is not State.RUNNING:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1

        lora_loads = 0
        if not preempted and self.waiting:
            budget, lora_loads = self._admit_waiting(now, budget, cap, scheduled)

        if not scheduled:
            return None
        return self._plan(scheduled, preempted, lora_loads)

    def chunk_cap(self) -> int:
        """The most prompt tokens one request may compute this step: the long-prefill
        threshold, except for a request alone in the engine, which has nobody to starve
        and takes the whole budget (vLLM 0.32's scheduler does the same)."""
        alone = len(self.running) + len(self.waiting) + len(self.transferring) <= 1
        return self._chunk_cap if not alone else UNCAPPED

    def _admit_waiting(
        self, now: float, budget: int, cap: int, scheduled: list[tuple[SimRequest, int]]
    ) -> tuple[int, int]:
        cfg = self.config
        kv = self.kv
        in_batch = {r.lora for r in self.running if r.lora}
        skipped: list[SimRequest] = []
        lora_loads = 0
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting.popleft()
            if req.not_before > now:
                skipped.append(req)
                continue
            if req.lora and req.lora not in in_batch and len(in_batch) >= cfg.max_loras:
                skipped.append(req)
                continue

            fresh = req.num_computed_tokens == 0
            hits = kv.find_cached_prefix(req) if fresh else []
            computed = len(hits) * kv.block_size if fresh else req.num_computed_tokens
            pull = (
                fresh
                and req.remote_prefill
                and not req.num_transferred_tokens
                and not req.generated
                and not req.preemptions
            )
            n = req.num_tokens - computed if pull else min(req.num_tokens - computed, budget, cap)
            if not self._can_allocate(req, hits, computed + n):
                waiting.appendleft(req)
                break

            if hits:
                kv.touch(hits)
                req.blocks = list(hits)
                req.num_cached_blocks = len(hits)
            kv.allocate(req, computed + n)
            if req.admitted_at is None:
                self._first_admission(req, now, computed)

            if pull:  # decode side of P/D: wait for the prompt's KV, outside the batch
                req.num_computed_tokens = computed
                req.num_transferred_tokens = n
                req.transfer_ready_at = now + n * self._transfer_s_per_token
                self.transferring.append(req)
                continue

            if req.lora:
                if self.lora.activate(req.lora, in_batch):
                    lora_loads += 1
                in_batch.add(req.lora)
            req.num_computed_tokens = computed
            req.state = State.RUNNING
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        if skipped:
            waiting.extendleft(reversed(skipped))
        return budget, lora_loads

    def _can_allocate(self, req: SimRequest, hits: list, num_tokens: int) -> bool:
        """Whether blocks for `num_tokens` fit once the hit blocks are taken (a free hit
        block leaves the free queue when touched, so it cannot also be allocated)."""
        kv = self.kv
        need = -(-num_tokens // kv.block_size) - max(len(req.blocks), len(hits))
        evictable_hits = sum(1 for b in hits if b.ref_cnt == 0)
        return need <= kv.num_free_blocks - evictable_hits

    def _first_admission(self, req: SimRequest, now: float, hit_tokens: int) -> None:
        req.admitted_at = now
        req.num_cached_tokens = hit_tokens
        if self.kv.enable_caching:
            self.stats.prefix_cache_queries += req.num_tokens
            self.stats.prefix_cache_hits += hit_tokens
            self.observer.on_prefix_cache(req.num_tokens, hit_tokens)
        self.observer.on_admit(req, now - req.arrival)

    def _plan(
        self,
        scheduled: list[tuple[SimRequest, int]],
        preempted: list[SimRequest],
        lora_loads: int,
    ) -> StepPlan:
        prefill = decode = context = 0
        cache = self.kv.cache_full_blocks
        lora_id = self.lora.id_of
        for req, n in scheduled:
            if n == 1 and req.generated and req.num_computed_tokens == req.num_tokens - 1:
                decode += 1
            else:
                prefill += n
            # vLLM advances num_computed_tokens (and caches the blocks it fills) when it
            # schedules, before the forward pass runs.
            req.num_computed_tokens += n
            context += req.num_computed_tokens
            cache(req, req.num_computed_tokens, lora_id(req.lora) if req.lora else None)
        stats = self.stats
        stats.steps += 1
        stats.lora_loads += lora_loads
        stats.max_running_seen = max(stats.max_running_seen, len(self.running))
        stats.max_batched_tokens_seen = max(stats.max_batched_tokens_seen, prefill + decode)
        return StepPlan(scheduled, StepShape(prefill, decode, context, lora_loads), preempted)

    def _preempt(self, req: SimRequest) -> None:
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.state = State.WAITING
        req.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)
        self.observer.on_preempt(req)

    def _finish_transfers(self, now: float) -> None:
        ready = [r for r in self.transferring if r.transfer_ready_at <= now]
        if not ready:
            return
        for req in ready:
            self.transferring.remove(req)
            # The prompt's KV is here; only its last token is computed (for the logits).
            req.num_computed_tokens = req.num_tokens - 1
            self.kv.cache_full_blocks(req, req.num_computed_tokens, self.lora.id_of(req.lora))
        self.waiting.extendleft(reversed(ready))

    # -- after the forward pass ----------------------------------------------------------------

    def finish_step(self, plan: StepPlan, end: float) -> list[SimRequest]:
        """Append a token to each request that computed all its tokens; return those that
        produced one (finished ones included)."""
        produced: list[SimRequest] = []
        for req, _ in plan.scheduled:
            if req.state is not State.RUNNING or req.num_computed_tokens < req.num_tokens:
                continue  # aborted during the step, or a prefill chunk with more to come
            self._emit(req, end)
            produced.append(req)
        return produced

    def _emit(self, req: SimRequest, now: float) -> None:
        ids = self.output_ids
        req.tokens.append(ids[req.generated % len(ids)])
        req.generated += 1
        if req.generated == 1:
            req.first_token_at = now
            self.observer.on_first_token(req, now - req.arrival)
        else:
            self.observer.on_next_token(req, now - req.last_token_at)  # type: ignore[operator]
        req.last_token_at = now
        if req.generated >= req.max_tokens:
            self.running.remove(req)
            req.state = State.FINISHED
            req.finished_at = now
            if req.remote_decode:
                req.remote_block_ids = [b.id for b in req.blocks]
            self.kv.free(req)
            self.observer.on_finish(req, now - req.arrival)
            req.channel.notify()
        elif req.channel.stream:
            req.channel.notify()
