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
plans the whole run at once, up to the first completion or the point where the KV cache
would run out (then it steps singly and the scheduler preempts as usual), and carries
it out only when something needs it: the caller's time passes its end, or a new
request joins the step after those already started. Meanwhile `load()` is computed in
closed form, so a pool can read every replica at every arrival without cutting their
runs. A run is taken only when a single step could not admit anything either: the
queue is empty, or its head cannot be admitted and the run cannot change that (free
blocks only shrink while decoding; `max_num_seqs` is full or not for the whole run).
The result equals single-stepping up to float rounding of the summed step times
(`tests/unit/test_sim_virtual.py` checks every token's time); the one difference is
which physical block a request's new decode block is (contents and cache are the same).

Prompts: with prefix caching off every prompt is distinct in effect, so its token ids
are not built (a list of zeros of the right length; the scheduler only counts them).
With caching on, a request's `hash_ids` (Mooncake's 512-token prefix blocks: equal ids =
equal prefix) become token ids `HASH_BASE + h*block_tokens + offset`, and any tokens
past them ids unique to the request, so two requests share exactly the prefix their
trace says they share; the full KV blocks are named after those ids rather than hashed
(`_trace_prompt`; the same hits, checked against hashing in the tests).
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from epp.sim.config import SimConfig
from epp.sim.kvcache import KVCache
from epp.sim.latency import StepCostModel
from epp.sim.lora import LoraRegistry
from epp.sim.scheduler import Scheduler
from epp.sim.sequence import Channel, SimRequest, State, _ids

OUTPUT_ID = 0  # every generated token; prompt ids below never use it
HASH_BASE = 1 << 20
TAIL_BASE = 1 << 40
_TAIL_SPAN = 1 << 21  # > any model length, so request tails never overlap
_SHARED_CHANNEL = Channel(stream=False)  # nobody waits on a virtual request
# steps `_started_before` walks on from its remembered answer before solving instead (the
# same answer either way: `total` is non-decreasing in m)
_WALK = 4


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


# What `_Request(prompt, osl, _SHARED_CHANNEL, rid=rid)` holds apart from its prompt,
# length, id and own lists: `_new_request` copies it instead of running the dataclass's
# `__init__` (half of the cost of queueing a request, once per request of a replay).
_PROTOTYPE = dict(_Request([0], 1, _SHARED_CHANNEL).__dict__, prompt=())


def _new_request(tokens: list[int], osl: int, rid: int) -> _Request:
    """`_Request(tokens, osl, _SHARED_CHANNEL, rid=rid)` with `prompt` emptied (the
    scheduler works on `tokens`), taking `tokens` (a fresh list) instead of a copy. The
    checks of `SimRequest.__post_init__` are the caller's (`VirtualEngine.add`)."""
    req = _Request.__new__(_Request)
    d = req.__dict__
    d.update(_PROTOTYPE)
    d["max_tokens"] = osl
    d["id"] = next(_ids)
    d["rid"] = rid
    d["remote_block_ids"] = []
    d["blocks"] = []
    d["block_hashes"] = []
    d["extra"] = {}
    d["tokens"] = tokens
    d["num_prompt_tokens"] = len(tokens)
    return req


def token_ids(
    rid: int, hash_ids: Sequence[int], block_tokens: int, start: int, stop: int
) -> list[int]:
    """Token ids at positions [start, stop) of request `rid`'s prompt: inside the
    trace's `hash_ids` blocks (of `block_tokens` tokens) `HASH_BASE + h*block_tokens +
    offset`, so equal ids give equal tokens; past them ids unique to the request."""
    out: list[int] = []
    p = start
    covered = len(hash_ids) * block_tokens
    while p < min(stop, covered):
        j, off = divmod(p, block_tokens)
        n = min(block_tokens - off, stop - p)
        first = HASH_BASE + hash_ids[j] * block_tokens + off
        out.extend(range(first, first + n))
        p += n
    if p < stop:
        first = TAIL_BASE + rid * _TAIL_SPAN + p
        out.extend(range(first, first + stop - p))
    return out


def prompt_tokens(rid: int, isl: int, hash_ids: Sequence[int], block_tokens: int) -> list[int]:
    """The whole prompt of `isl` tokens (see `token_ids`)."""
    return token_ids(rid, hash_ids, block_tokens, 0, isl)


_TRACE_BLOCK = struct.Struct("<cqI").pack  # (b"h", hash id, sub-block) or (b"t", rid, block)


class BlockCounter:
    """`KVCache` with prefix caching off, as a count. Without caching blocks are
    interchangeable: what the scheduler asks (does a request's next chunk fit, how many
    blocks are in use) depends only on how many each request holds, so a request's block
    table is a list of `None`s and the free queue a number. An Azure-like replay spends
    half its time moving `Block`s through `KVCache`'s free queue otherwise; the tests
    check it against `KVCache(enable_caching=False)` step for step."""

    enable_caching = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_free_blocks = num_blocks
        self.evictions = 0

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def find_cached_prefix(self, req: SimRequest) -> list:
        return []

    def touch(self, blocks: list) -> None:
        pass

    def cache_full_blocks(
        self, req: SimRequest, num_tokens: int, lora_id: int | None = None
    ) -> None:
        pass

    def allocate(self, req: SimRequest, num_tokens: int) -> bool:
        n = -(-num_tokens // self.block_size) - len(req.blocks)
        if n <= 0:
            return True
        if n > self.num_free_blocks:
            return False
        self.num_free_blocks -= n
        req.blocks += [None] * n  # type: ignore[list-item]
        return True

    def free(self, req: SimRequest) -> None:
        self.num_free_blocks += len(req.blocks)
        req.blocks = []
        req.num_cached_blocks = 0

    def reset(self) -> bool:
        return self.num_free_blocks == self.num_blocks


class VirtualEngine:
    """One replica. Not thread-safe; the caller owns the clock (see the module doc)."""

    def __init__(
        self,
        config: SimConfig,
        *,
        block_tokens: int = 512,
        macro: bool = True,
        record_token_times: bool = False,
        trace_hashes: bool = True,
        count_blocks: bool = True,
    ) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.config = config
        self.kv: KVCache | BlockCounter
        if config.enable_prefix_caching or not count_blocks:
            self.kv = KVCache(
                config.num_gpu_blocks,
                config.block_size,
                enable_caching=config.enable_prefix_caching,
            )
        else:
            self.kv = BlockCounter(config.num_gpu_blocks, config.block_size)
        self.cost = StepCostModel(config)
        self.scheduler = Scheduler(
            config,
            self.kv,  # type: ignore[arg-type]  # BlockCounter: KVCache without caching
            LoraRegistry((), config.max_loras),
            output_ids=[OUTPUT_ID],
        )
        self.block_tokens = block_tokens
        self.macro = macro
        self.trace_hashes = trace_hashes and block_tokens % config.block_size == 0
        self.record_token_times = record_token_times
        self.clock = 0.0  # when the next step may start (the end of the last one)
        self.macro_steps = 0  # runs jumped over (each counts its steps in scheduler.stats)
        self._run: _DecodeRun | None = None  # planned, not yet carried out
        self._now = 0.0  # the last advance_to target
        self._finished: list[Finished] = []
        # (rid, time) of each first token, when the caller asks for them (a list, not None)
        self.first_tokens: list[tuple[int, float]] | None = None
        # load() without the pending run: (waiting, running, used blocks, tokens left);
        # None after any change to the queues (a pool reads every replica per arrival)
        self._base: tuple[int, int, int, int] | None = None
        self._run_blocks: tuple[_DecodeRun, int, list[int]] | None = None
        # started_before of the pending run, with the budgets it holds for: (run, lo, hi,
        # m) means m for any lo < t - run.start <= hi (arrivals read it between steps)
        self._started: tuple[_DecodeRun, float, float, int] | None = None

    def reset(self) -> None:
        """Become a fresh replica (empty queue, cold prefix cache, clock 0) without
        rebuilding the block pool: a replay that starts and stops replicas by the
        hundred reuses idle engines (building 27,648 blocks costs ~0.1 s)."""
        if not self.idle:
            raise RuntimeError("only an idle engine can be reset")
        if not self.kv.reset():
            raise RuntimeError("an idle engine still holds KV blocks")
        self.kv.evictions = 0
        self.scheduler = Scheduler(
            self.config,
            self.kv,  # type: ignore[arg-type]
            LoraRegistry((), self.config.max_loras),
            output_ids=[OUTPUT_ID],
        )
        self.clock = self._now = 0.0
        self.macro_steps = 0
        self._run = None
        self._finished = []
        self.first_tokens = None
        self._base = None
        self._run_blocks = None
        self._started = None

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
        hashes: list[bytes] = []
        if not self.kv.enable_caching:
            prompt = [0] * isl
        elif self.trace_hashes:
            prompt, hashes = self._trace_prompt(rid, isl, hash_ids)
        else:
            prompt = prompt_tokens(rid, isl, hash_ids, self.block_tokens)
        req = _new_request(prompt, osl, rid)
        req.block_hashes = hashes
        if self.record_token_times:
            req.times = []
        self._cut_run(at)
        if self.idle:
            self.clock = max(self.clock, at)
        self.scheduler.add(req, at)
        self._base = None

    def _trace_prompt(
        self, rid: int, isl: int, hash_ids: Sequence[int]
    ) -> tuple[list[int], list[bytes]]:
        """The prompt with its full KV blocks' hashes named after the trace's blocks
        instead of computed (SHA-256 of every 16 tokens is most of a Mooncake replay's
        time). Equal trace ids mean an equal prefix up to and including that block (the
        trace's definition), so `(hash id, sub-block)` names a prefix as uniquely as a
        chained hash does; blocks past the ids are named after the request. The token ids
        of the full blocks are then never read (zeros); the partial last block's are real,
        because the first block holding output tokens is hashed from them."""
        bs = self.kv.block_size
        per = self.block_tokens // bs
        full = isl // bs
        ids = len(hash_ids)
        hashes = [
            _TRACE_BLOCK(b"h", hash_ids[i // per], i % per)
            if i // per < ids
            else _TRACE_BLOCK(b"t", rid, i)
            for i in range(full)
        ]
        prompt = [0] * (full * bs)
        prompt += token_ids(rid, hash_ids, self.block_tokens, full * bs, isl)
        return prompt, hashes

    @property
    def idle(self) -> bool:
        s = self.scheduler
        return not (s.running or s.waiting or s.transferring)

    def next_event_time(self) -> float:
        """When the engine next changes what it publishes: inside a decode run, the run's
        end (a request completes, or the cache fills); otherwise the next step's start;
        `inf` when there is nothing to do."""
        run = self._run
        if run is not None:
            return run.start + run.total(run.steps)
        return math.inf if self.idle else self.clock

    def due_after(self) -> float:
        """A time up to which `advance_to` changes nothing but the time `load()` reads:
        inside a decode run a hair before its last step starts (the run is carried out
        when a target passes that start; the margin keeps float rounding on the early,
        harmless side), otherwise the next step's start, `inf` when idle. A pool
        advances only the engines whose time has come (`pool.Pool.advance_to`)."""
        run = self._run
        if run is not None:
            return run.start + run.total(run.steps - 1) - 1e-9
        return math.inf if self.idle else self.clock

    def drain_finished(self) -> list[Finished]:
        out, self._finished = self._finished, []
        return out

    def load(self, at: float | None = None) -> Load:
        """The load as of the last `advance_to`, or of time `at` if later when
        `advance_to(at)` would change nothing else (`due_after`): exact inside a decode
        run too, where the run changes only the blocks held and the tokens left, both in
        closed form.

        The queues' part is kept until they change, and a run's new blocks are a
        lookup (`_run_new_blocks`): a pool reads every replica at every arrival, and
        summing every request each time was most of a 50-replica replay's time."""
        base = self._base
        if base is None:
            s = self.scheduler
            tokens = 0
            for queue in (s.running, s.waiting, s.transferring):
                for r in queue:
                    tokens += max(0, r.num_prompt_tokens - r.num_computed_tokens)
                    tokens += r.max_tokens - r.generated
            base = self._base = (s.num_waiting, len(s.running), self.kv.num_used_blocks, tokens)
        waiting, running, used, tokens = base
        run = self._run
        if run is not None:
            m = self._started_before(run, self._now if at is None else max(self._now, at))
            tokens -= m * run.decodes
            used += self._run_new_blocks(run, m)
        return Load(waiting, running, used / self.kv.num_blocks, tokens)

    def gauges(self, at: float) -> tuple[int, int, float]:
        """`load(at)`'s waiting and running requests and KV use: what a scrape of
        /metrics reads, without the tokens left or a `Load`."""
        base = self._base
        if base is None:  # load()'s queues' part without the tokens left (a sum per request)
            s = self.scheduler
            base = (s.num_waiting, len(s.running), self.kv.num_used_blocks)
        used = base[2]
        run = self._run
        if run is not None:
            now = self._now if self._now >= at else at
            used += self._run_new_blocks(run, self._started_before(run, now))
        return base[0], base[1], used / self.kv.num_blocks

    def steady(self) -> tuple[int, int, int, int] | None:
        """A token that stays the very same object for as long as `gauges()` gives the same
        values at any time (no decode run pending, queues unchanged), else None: a pool
        scraping every replica at every arrival skips the ones that cannot have moved."""
        return self._base if self._run is None else None

    def _started_before(self, run: _DecodeRun, t: float) -> int:
        """`run.started_before(t)`, remembered with the budgets it holds for: the same
        answer while `t - run.start` stays within (total(m - 1), total(m)], the very
        comparisons `started_before` makes, so the cache cannot differ from it. Time
        only moves on, so a later budget walks on from the remembered step (an arrival
        comes a step or two later) instead of solving the quadratic again; `total` is
        non-decreasing in m, so the walk stops where `started_before` would."""
        budget = t - run.start
        seen = self._started
        if seen is not None and seen[0] is run and seen[1] < budget:
            m, hi = seen[3], seen[2]
            if budget <= hi:
                return m
            cap, total = run.steps, run.total
            lo = hi
            m += 1
            hi = math.inf if m == cap else total(m)
            walked = 0
            while hi < budget and walked < _WALK:
                lo = hi
                m += 1
                hi = math.inf if m == cap else total(m)
                walked += 1
            if hi >= budget:
                self._started = (run, lo, hi, m)
                return m
            # far ahead (a lightly loaded replica between arrivals): solve instead
        m = run.started_before(t)
        lo = -math.inf if m == 0 else (0.0 if m == 1 else run.total(m - 1))
        hi = 0.0 if m == 0 else (math.inf if m == run.steps else run.total(m))
        self._started = (run, lo, hi, m)
        return m

    def _run_new_blocks(self, run: _DecodeRun, m: int) -> int:
        """`_new_blocks(m)` for the pending run by bisection: each running sequence takes
        a new block at the steps where its token count crosses a block boundary beyond
        the blocks it holds; those steps, for all sequences, sorted, once per run."""
        cached = self._run_blocks
        if cached is None or cached[0] is not run:
            bs = self.kv.block_size
            at_zero = 0
            steps: list[int] = []
            for r in self.scheduler.running:
                n_tok, held = len(r.tokens), len(r.blocks)
                # blocks needed after j steps: ceil((n_tok + j - 1) / bs); it grows by
                # one at the j where n_tok + j - 2 is a multiple of bs
                at_zero += max(0, -(-(n_tok - 1) // bs) - held)
                j = (2 - n_tok) % bs or bs
                while j <= run.steps:
                    if (n_tok + j - 2) // bs + 1 > held:
                        steps.append(j)
                    j += bs
            steps.sort()
            cached = self._run_blocks = (run, at_zero, steps)
        _, at_zero, steps = cached
        return at_zero + bisect.bisect_right(steps, m)

    # -- stepping ------------------------------------------------------------------------

    def advance_to(self, t: float) -> None:
        """Run every step that starts before `t`; the last one may end after `t`.

        A decode run is planned whole and carried out only when something needs its
        result: `t` reaches its last step, or `add()` brings a request that joins the
        step after the ones already started. Until then nothing a caller reads changes
        but what `load()` computes in closed form."""
        self._now = max(self._now, t)
        sched = self.scheduler
        while True:
            run = self._run
            if run is not None:
                # its last step starts at or after t (started_before(t) < steps, cheaply)
                if run.total(run.steps - 1) >= t - run.start:
                    return
                self._apply(run, run.steps)
                continue
            if self.clock >= t or self.idle:
                return
            if self.macro and self._plan_run():
                continue
            self._base = None
            plan = sched.schedule(self.clock)
            if plan is None:  # only requests held back; nothing in this model does that
                wake = sched.next_wakeup(self.clock)
                if wake is None or wake >= t:
                    return
                self.clock = wake
                continue
            end = self.clock + self.cost.seconds(plan.shape)
            produced = sched.finish_step(plan, end)
            self.clock = end
            firsts = self.first_tokens
            for req in produced:
                if firsts is not None and req.generated == 1:
                    firsts.append((req.rid, end))
                if req.times is not None:
                    req.times.append(end)
                if req.state is State.FINISHED:
                    self._finish(req)

    def _cut_run(self, at: float) -> None:
        """Carry out the steps of the pending run that start before `at`; drop the rest
        (the engine plans anew from there)."""
        run = self._run
        if run is not None:
            m = run.started_before(at)
            if m:
                self._apply(run, m)
            self._run = None

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

    def _plan_run(self) -> bool:
        """Plan a run of >= 2 decode-only steps starting now, if the batch allows one."""
        sched = self.scheduler
        cfg = self.config
        running = sched.running
        n = len(running)
        if n == 0 or sched.transferring or n > cfg.max_num_batched_tokens:
            return False
        context = 0
        cap = 1 << 62
        for r in running:
            nt = len(r.tokens)
            if r.num_computed_tokens != nt - 1 or not r.generated:
                return False  # a prefill (or a recompute) is in the batch
            context += nt
            left = r.max_tokens - r.generated
            if left < cap:
                cap = left
        if sched.waiting and not self._head_blocked(n):
            return False
        k = self._kv_fit(cap)
        if k < 2:
            return False
        fixed, per_token = self.cost.decode_terms(n)
        self._run = _DecodeRun(self.clock, k, fixed, per_token, context, n)
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
        want = min(head.num_tokens - computed, budget, sched.chunk_cap())
        return not sched._can_allocate(head, hits, computed + want)

    def _new_blocks(self, m: int) -> int:
        """Blocks the running sequences take on in the first m steps of a decode run."""
        bs = self.kv.block_size
        return sum(
            max(0, -(-(len(r.tokens) + m - 1) // bs) - len(r.blocks))
            for r in self.scheduler.running
        )

    def _kv_fit(self, k: int) -> int:
        """The longest run (<= k steps) whose new decode blocks fit in the free blocks, so
        nothing would be preempted; the next single step then preempts as vLLM does."""
        free = self.kv.num_free_blocks
        if self._new_blocks(k) <= free:
            return k
        lo, hi = 0, k  # fits(lo), not fits(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._new_blocks(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _apply(self, run: _DecodeRun, k: int) -> None:
        """Carry out the first k steps of the run (k == run.steps ends it)."""
        self._run = None
        self._base = None
        sched = self.scheduler
        kv = self.kv
        start = run.start
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
    """`steps` decode-only steps of `decodes` sequences from `start`, attending `context`
    tokens at the first step: step j costs `fixed + per_token * (context + decodes * j)`."""

    start: float
    steps: int
    fixed: float
    per_token: float
    context: int
    decodes: int

    def total(self, m: int) -> float:
        """Seconds of the first m steps."""
        n = self.decodes
        return m * self.fixed + self.per_token * (m * self.context + n * m * (m - 1) / 2)

    def started_before(self, t: float) -> int:
        """How many of the run's steps start before time `t`: 1 + the largest m < steps
        with start + total(m) < t (the quadratic's root, then a fix-up for rounding)."""
        budget = t - self.start
        if budget <= 0:
            return 0
        cap = self.steps
        if self.total(cap - 1) < budget:
            return cap
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
