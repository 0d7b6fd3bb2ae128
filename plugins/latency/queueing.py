"""A queueing-aware latency estimate from what the EPP knows of an endpoint.

The linear model (`model.py`) learns TTFT as a weighted sum of load counts; a request that
must wait for a batch slot behind a long prompt is a product of terms (how many finish
before it × how long each takes), which a sum of counts under-estimates once queues grow
(predicted / observed chat TTFT 0.75-0.94 at 71-85 % of capacity on `bench/slo_family.py`).
Here the estimate is built from the terms themselves, as an iteration-level scheduler
(vLLM's, Orca's: Yu et al., OSDI 2022) serves a request:

    TTFT ≈ (prompt tokens pending ahead + this prompt's uncached tokens) × prefill ms/token
           + one decode step (the step it joins)
           + completions needed for a batch slot × (mean expected output × TPOT) / slots

- "pending ahead" is the EPP's own count of prompt tokens routed to the endpoint that have
  not had their first token (fresher than a scrape, and it includes the prefill running
  now); the completions needed are the in-flight requests beyond the endpoint's batch
  slots (+1 for this one); the mean expected output is the EPP's in-flight output tokens
  per in-flight request. Every term is the EPP's snapshot, nothing scraped but the slots.
- TPOT ≈ the endpoint's recent inter-token latency (what its mix of decode steps and
  interleaved prefills gave lately).

Per endpoint it learns, from each finished request: its TPOT (EWMA of the measured mean
inter-token gap), its prefill speed (EWMA of TTFT less one step over the prompt tokens
pending at pick, from requests that did not queue for a slot), and its batch slots (the
most running requests a scrape showed). An endpoint without history borrows the pool's;
before any history the cold values apply (llm-d's 15,928 prefill tokens/s default). What
stays wrong — a slower prefill than decode, a mix the EWMA lags — is left to the
per-endpoint calibration (`calibration.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from epp.datastore import EndpointSnapshot

STEP_WAIT = 1.5  # steps a request that joins a busy batch waits: half the current, its own


@dataclass(frozen=True, slots=True)
class Speed:
    """One endpoint's (or the pool's) learned speeds; `samples`: requests folded in."""

    prefill_ms_per_token: float
    tpot_ms: float
    slots: int
    samples: int = 0


@dataclass(frozen=True, slots=True)
class RawPrediction:
    ttft_ms: float
    tpot_ms: float
    queued: bool  # no batch slot free at the pick: the wait is for completions


@dataclass(frozen=True, slots=True)
class _Terms:
    """TTFT = prefill_tokens × prefill ms/token + fixed (ms): the split the learner needs."""

    prefill_tokens: float
    fixed_ms: float
    queued: bool


def _terms(e: EndpointSnapshot, uncached_prompt: int, s: Speed, now: float) -> _Terms:
    slots = max(s.slots, e.metrics.running_requests, 1)
    n = e.inflight_requests
    pending = float(e.inflight_prefill_tokens + uncached_prompt)
    need = n - slots + 1  # completions before a slot frees for this request
    if need > 0:
        mean_out = max(0, e.inflight_tokens - e.inflight_prefill_tokens) / n
        return _Terms(pending, (STEP_WAIT + need * mean_out / slots) * s.tpot_ms, True)
    fixed = STEP_WAIT * s.tpot_ms if n > 0 else 0.0  # an idle server starts at once
    since = e.oldest_pending_at
    if since is not None and s.prefill_ms_per_token > 0:
        # Every pending prompt has a slot, so the oldest has been prefilling since it was
        # routed: that much of the work ahead is done (a chat behind a long prompt whose
        # 300 ms step is 250 ms in waits 50 ms, not 300).
        done = 1000.0 * max(0.0, now - since) / s.prefill_ms_per_token
        pending -= min(done, float(e.inflight_prefill_tokens))
    return _Terms(pending, fixed, False)


def predict(e: EndpointSnapshot, uncached_prompt: int, s: Speed, now: float) -> RawPrediction:
    """The uncalibrated estimate for a request of `uncached_prompt` tokens on `e` at `now`
    (the clock of `e.oldest_pending_at`)."""
    t = _terms(e, uncached_prompt, s, now)
    return RawPrediction(
        t.prefill_tokens * s.prefill_ms_per_token + t.fixed_ms, s.tpot_ms, t.queued
    )


class SpeedLearner:
    """Per-endpoint speeds, EWMA over finished requests (O(1) per request, on the loop).

    The prefill speed is a ratio of two EWMAs — of (TTFT − the fixed terms) and of the
    prefill tokens the request waited for — over requests that found a slot free: a ratio
    of sums, so long prompts (whose TTFT is mostly prefill) set it, not the noise of a
    chat's 10 ms."""

    def __init__(self, cold: Speed, alpha: float, fixed_slots: int = 0) -> None:
        """`fixed_slots` > 0: the servers' batch size is known (vLLM's `max_num_seqs`) and
        not learned; `cold.slots` applies to an endpoint before anything was seen of it."""
        self.cold = cold
        self.alpha = alpha
        self.fixed_slots = fixed_slots
        self._by: dict[str, Speed] = {}
        self._pool: Speed | None = None
        # name ('' = pool) -> (EWMA of prefill ms, EWMA of prefill tokens)
        self._prefill: dict[str, tuple[float, float]] = {}

    def get(self, name: str) -> Speed:
        return self._by.get(name) or self._pool or self.cold

    def observe(
        self,
        e: EndpointSnapshot,
        uncached_prompt: int,
        ttft_ms: float,
        tpot_ms: float,
        routed_at: float,
    ) -> None:
        """Fold one finished request in; `e` is the endpoint as it was at the pick."""
        own = self.get(e.name)
        seen = self._by.get(e.name)
        slots = self.fixed_slots or max(seen.slots if seen else 1, e.metrics.running_requests, 1)
        t = _terms(e, uncached_prompt, own, routed_at)
        sample = None
        if not t.queued and t.prefill_tokens > 0 and ttft_ms == ttft_ms:
            sample = (max(0.0, ttft_ms - t.fixed_ms), t.prefill_tokens)
        self._by[e.name] = self._fold(e.name, self._by.get(e.name), sample, tpot_ms, slots)
        self._pool = self._fold("", self._pool, sample, tpot_ms, slots)

    def retain(self, names: set[str]) -> None:
        for name in [n for n in self._by if n not in names]:
            del self._by[name]
            self._prefill.pop(name, None)

    def _fold(
        self,
        key: str,
        old: Speed | None,
        sample: tuple[float, float] | None,
        tpot: float,
        slots: int,
    ) -> Speed:
        base = old or self.cold
        a = self.alpha if old is not None else 1.0  # the first sample replaces the cold value
        prefill = base.prefill_ms_per_token
        if sample is not None:
            ms, tokens = self._prefill.get(key, sample)
            ms, tokens = (
                ms + self.alpha * (sample[0] - ms),
                tokens + self.alpha * (sample[1] - tokens),
            )
            self._prefill[key] = (ms, tokens)
            prefill = ms / tokens if tokens > 0 else prefill
        return Speed(
            prefill,
            base.tpot_ms if tpot != tpot or tpot <= 0 else base.tpot_ms + a * (tpot - base.tpot_ms),
            self.fixed_slots or max(base.slots if old is not None else 1, slots),
            base.samples + 1 if old is not None else 1,
        )
