"""What the latency model reads: feature sets over (endpoint state, request) and the
per-endpoint history some of them need.

Two sets, chosen by the producer's `features` parameter and compared side by side in
`bench/predictor_accuracy.py` (docs/BENCHMARKS.md@a73a134 "Predictor accuracy per load level"):

- `basic` (default): TTFT and TPOT linear in the scraped queue counts, KV use and the
  EPP's in-flight counts (requests, prefill tokens, decode tokens).
- `basic+age` / `queue+age`: the same plus, for TTFT, the age of the endpoint's oldest
  request still waiting for its first byte (`pending_age_ms`). More accurate (TTFT MAPE
  8.7 → 7.1 % at 25 % load, 20.1 → 16.9 % at 47 %) but, as a linear term, it extrapolates:
  an old pending request that is queued rather than being prefilled makes the endpoint
  look nearly done, and at 25-35 % load routing on it sent more chats behind long
  prefills (docs/BENCHMARKS.md@a73a134 "Closer to the anchor"). Not the default.
- `queue` adds the terms queueing theory says TTFT and TPOT are made of, each scaled by
  the endpoint's own measured speed so that one pool-wide fit could serve a 2x slower
  server too:
  * `queue_wait`: requests ahead of this one × the endpoint's mean request duration /
    its batch slots (the wait once the batch is full); "ahead" is the EPP's own in-flight
    count beyond the slots (fresher than the scraped queue), slots the most requests the
    endpoint was seen running;
  * `prefill_work`: (this prompt's uncached tokens + the in-flight prefill tokens) × the
    endpoint's recent TPOT (a server that decodes 2x slower prefills about 2x slower);
  * `recent_ttft` / `recent_tpot`: the endpoint's recent measurements (EWMA);
  * for TPOT, `prefill_interference`: in-flight prefill tokens × recent TPOT.

  Measured (`bench/predictor_accuracy.py`): no better than `basic` on the simulator's
  pool (within ±1 point of MAPE at every load level): the per-endpoint fits already learn
  the slow server's speed, and with load-aware routing queues stay short enough to be
  linear. What did help was the fit's objective (`model.fit(relative=True)`). Kept as an
  option for pools where queues grow long (a real server's prefill/decode ratio differs
  from the simulator's).

Every set keeps columns 1–2 of TTFT (uncached prompt, in-flight prefill tokens) and
column 3 of TPOT (KV use) where the cold-start formula (`model.ColdStart`) reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from epp.datastore import EndpointSnapshot

EWMA_ALPHA = 0.1  # weight of the newest observation: about the last 10-20 requests count


@dataclass(frozen=True, slots=True)
class Recent:
    """An endpoint's recent measurements (ms), EWMA over its finished requests."""

    ttft_ms: float
    tpot_ms: float
    duration_ms: float
    slots: int  # the most requests it was seen running at once (scraped), ≥ 1


class EndpointHistory:
    """Recent TTFT / TPOT / duration per endpoint and its batch slots. Updated on the request
    loop once per finished request (a few float operations); bounded by the pool's endpoints
    (`retain` drops the ones that left it)."""

    def __init__(self, alpha: float = EWMA_ALPHA) -> None:
        self.alpha = alpha
        self._by: dict[str, Recent] = {}
        self._pool: Recent | None = None  # for endpoints without history of their own

    def get(self, name: str) -> Recent | None:
        return self._by.get(name) or self._pool

    def observe(
        self, name: str, ttft_ms: float, tpot_ms: float, duration_ms: float, running: int = 0
    ) -> None:
        """Fold one finished request in (NaN measurements leave that average as it was)."""
        self._by[name] = self._fold(self._by.get(name), ttft_ms, tpot_ms, duration_ms, running)
        self._pool = self._fold(self._pool, ttft_ms, tpot_ms, duration_ms, running)

    def retain(self, names: set[str]) -> None:
        """Forget every endpoint not in `names` (the pool changed)."""
        for name in [n for n in self._by if n not in names]:
            del self._by[name]

    def _fold(
        self, old: Recent | None, ttft: float, tpot: float, duration: float, running: int
    ) -> Recent:
        if old is None:
            return Recent(_or(ttft, 0.0), _or(tpot, 0.0), _or(duration, 0.0), max(1, running))
        a = self.alpha
        return Recent(
            old.ttft_ms if ttft != ttft else old.ttft_ms + a * (ttft - old.ttft_ms),
            old.tpot_ms if tpot != tpot else old.tpot_ms + a * (tpot - old.tpot_ms),
            old.duration_ms
            if duration != duration
            else old.duration_ms + a * (duration - old.duration_ms),
            max(old.slots, running),
        )


def _or(v: float, default: float) -> float:
    return default if v != v else v  # NaN → default


NO_HISTORY = Recent(0.0, 0.0, 0.0, 1)

Features = tuple[float, ...]


@dataclass(frozen=True)
class FeatureSet:
    name: str
    ttft_names: tuple[str, ...]
    tpot_names: tuple[str, ...]
    # (endpoint, this request's uncached prompt tokens, history, now): `now` is the time
    # of the pick in the clock of `EndpointSnapshot.oldest_pending_at`.
    ttft: Callable[[EndpointSnapshot, int, EndpointHistory, float], Features]
    tpot: Callable[[EndpointSnapshot, EndpointHistory], Features]


def pending_age_ms(e: EndpointSnapshot, now: float) -> float:
    """How long (ms) the oldest request routed to `e` has waited for its first byte at
    `now`; 0 when none waits. The EPP knows how many prompt tokens are queued on an
    endpoint but not how far the server is into them: a chat routed behind a long prompt
    whose 300 ms prefill step is 250 ms done waits 50 ms, not 300. Measured in
    bench/predictor_accuracy.py: TTFT MAPE 8.7 → 7.1 % at 25 % load (docs/BENCHMARKS.md)."""
    since = e.oldest_pending_at
    return 0.0 if since is None else max(0.0, 1000.0 * (now - since))


def basic_ttft(
    e: EndpointSnapshot, uncached_prompt: int, h: EndpointHistory, now: float
) -> Features:
    m = e.metrics
    return (
        1.0,
        float(uncached_prompt),
        float(e.inflight_prefill_tokens),
        float(m.waiting_queue_size),
        float(m.running_requests),
        m.kv_cache_usage,
    )


def basic_tpot(e: EndpointSnapshot, h: EndpointHistory) -> Features:
    m = e.metrics
    decode = max(0, e.inflight_tokens - e.inflight_prefill_tokens)
    return (
        1.0,
        float(m.running_requests),
        float(m.waiting_queue_size),
        m.kv_cache_usage,
        float(e.inflight_requests),
        decode / 1000.0,
    )


def queue_ttft(
    e: EndpointSnapshot, uncached_prompt: int, h: EndpointHistory, now: float
) -> Features:
    m = e.metrics
    r = h.get(e.name) or NO_HISTORY
    slots = max(r.slots, m.running_requests, 1)
    ahead = max(0, e.inflight_requests - slots, m.waiting_queue_size)
    prefill = uncached_prompt + e.inflight_prefill_tokens
    return (
        1.0,
        float(uncached_prompt),
        float(e.inflight_prefill_tokens),
        float(m.waiting_queue_size),
        float(m.running_requests),
        m.kv_cache_usage,
        ahead * r.duration_ms / slots,
        prefill * r.tpot_ms / 1000.0,
        r.ttft_ms,
    )


def queue_tpot(e: EndpointSnapshot, h: EndpointHistory) -> Features:
    m = e.metrics
    r = h.get(e.name) or NO_HISTORY
    decode = max(0, e.inflight_tokens - e.inflight_prefill_tokens)
    return (
        1.0,
        float(m.running_requests),
        float(m.waiting_queue_size),
        m.kv_cache_usage,
        float(e.inflight_requests),
        decode / 1000.0,
        r.tpot_ms,
        e.inflight_prefill_tokens * r.tpot_ms / 1000.0,
    )


BASIC = FeatureSet(
    "basic",
    ("1", "uncached_prompt", "inflight_prefill", "waiting", "running", "kv"),
    ("1", "running", "waiting", "kv", "inflight_requests", "inflight_decode_ktok"),
    basic_ttft,
    basic_tpot,
)
QUEUE = FeatureSet(
    "queue",
    (*BASIC.ttft_names, "queue_wait", "prefill_work", "recent_ttft"),
    (*BASIC.tpot_names, "recent_tpot", "prefill_interference"),
    queue_ttft,
    queue_tpot,
)


def with_pending_age(base: FeatureSet) -> FeatureSet:
    """`base` with `pending_age_ms` as its last TTFT column (`features: basic+age`)."""

    def ttft(e: EndpointSnapshot, uncached: int, h: EndpointHistory, now: float) -> Features:
        return (*base.ttft(e, uncached, h, now), pending_age_ms(e, now))

    return FeatureSet(
        f"{base.name}+age",
        (*base.ttft_names, "pending_age_ms"),
        base.tpot_names,
        ttft,
        base.tpot,
    )


FEATURE_SETS: dict[str, FeatureSet] = {
    s.name: s for s in (BASIC, QUEUE, with_pending_age(BASIC), with_pending_age(QUEUE))
}
