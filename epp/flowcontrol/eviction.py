"""In-flight eviction: stop running sheddable requests when higher-priority work waits.

llm-d-router's `flowControl.enableEviction` (`pkg/epp/flowcontrol/eviction/`,
`pkg/epp/flowcontrol/controller/internal/reclamation.go`), same rules:

- **which**: only sheddable requests (priority < 0; `eviction-sheddable-filter`), lowest
  priority first, and among equals the most recently dispatched first, the one with the
  least work (KV cache) sunk in it (`eviction-priority-then-time-ordering`); never one
  whose priority is not strictly below the waiting demand's;
- **when**: the dispatch step finds the queue's head blocked by saturation (≥ the
  ceiling) and requests are waiting: one reclamation decision, if the pacing gate is
  open: no earlier eviction still unconfirmed (its stream has not ended yet) or cooling
  (`grace` after its confirmation: the time the freed capacity takes to show in the
  saturation signal);
- **how many**: the deficit in the saturation gauge's own units over one request's mean
  share of it, `n = max(1, ceil((saturation − ceiling − pending) / (saturation /
  in_flight)))`, at most `max_per_decision` (upstream 2) and at most the evictable count;
- an eviction not confirmed within `confirmation_timeout` (10 s upstream) counts as
  confirmed, so a hung stream cannot close the gate for ever.

The mechanism is the stream's (`RequestStream.evict`): the EPP answers the request's
ext_proc stream with an ImmediateResponse 429 carrying `x-llm-d-request-dropped-reason:
evicted-priority`; Envoy then resets the upstream request, which is how the model server
learns to abort it (vLLM and `epp sim` abort a request whose client went away), and the
client gets the 429 (or, once its response has started, an SSE error event naming the
reason, then the reset). Its stream's end gives its in-flight counts back as every
request's end does, exactly once; that end is the confirmation.

Pure apart from the metrics: time comes from the caller; the controller (asyncio) calls
`reclaim` on its loop, the stream calls `ended` there too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Histogram

from epp.observability import REGISTRY

# llm-d-router's defaults (`pkg/epp/flowcontrol/controller/config.go`).
MAX_REVOCATIONS_PER_DECISION = 2
CONFIRMATION_TIMEOUT_S = 10.0
# The grace after a confirmation, by how the saturation signal sees freed capacity
# (`cmd/epp/runner/runner.go` deriveEvictionConfirmationGrace): the EPP's own in-flight
# count drops when the stream ends (10 ms covers the dispatch loop's jitter); a scraped
# signal needs the engine to free the KV cache and the next fresh scrape.
LEADING_SENSOR_GRACE_S = 0.010
ENGINE_RECLAIM_BUDGET_S = 0.250

CONFIRMED = "confirmed"
TIMED_OUT = "timed_out"

REVOCATIONS_ISSUED = Counter(
    "llm_d_epp_flow_control_revocations_issued",
    "In-flight eviction revocations issued, by the priority of the demand they make room for.",
    ["priority", "inference_pool"],
    registry=REGISTRY,
)
REVOCATIONS = Counter(
    "llm_d_epp_flow_control_revocations",
    "In-flight eviction revocations by terminal outcome (confirmed, timed_out).",
    ["outcome", "inference_pool"],
    registry=REGISTRY,
)
CONFIRMATION_SECONDS = Histogram(
    "llm_d_epp_flow_control_revocation_confirmation_seconds",
    "Time from an eviction to the end of the evicted request's stream.",
    ["inference_pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)


@dataclass(eq=False, slots=True)
class Running:
    """One routed sheddable request that may be evicted. `stop()` asks its stream to end
    it (False: it cannot any more, e.g. its response already ended)."""

    priority: int
    dispatched_at: float
    request_id: str
    stop: Callable[[], bool]
    evicted_at: float = -1.0  # when it was told to stop; < 0: not evicted


@dataclass(slots=True)
class _Cooling:
    credit: float
    until: float


@dataclass
class Evictor:
    """The tracked sheddable requests and the reclamation decisions over them."""

    pool_name: str = "default"
    grace: float = LEADING_SENSOR_GRACE_S
    confirmation_timeout: float = CONFIRMATION_TIMEOUT_S
    max_per_decision: int = MAX_REVOCATIONS_PER_DECISION
    # Tracked, not evicted (insertion order = dispatch order); evicted, not yet ended.
    _running: dict[Running, None] = field(default_factory=dict)
    _outstanding: dict[Running, float] = field(default_factory=dict)  # → its credit
    _cooling: list[_Cooling] = field(default_factory=list)
    pending: float = 0.0  # saturation units still expected back from evictions
    evicted_total: int = 0

    # ---- the streams' side -----------------------------------------------------------
    def track(self, item: Running) -> None:
        self._running[item] = None

    def ended(self, item: Running, now: float) -> None:
        """The request's stream ended (response done, client gone, or evicted: the
        confirmation). Idempotent."""
        self._running.pop(item, None)
        credit = self._outstanding.pop(item, None)
        if credit is None:
            return
        self._cooling.append(_Cooling(credit, now + self.grace))
        REVOCATIONS.labels(CONFIRMED, self.pool_name).inc()
        CONFIRMATION_SECONDS.labels(self.pool_name).observe(max(0.0, now - item.evicted_at))

    # ---- the controller's side -------------------------------------------------------
    @property
    def evictable(self) -> int:
        return len(self._running)

    def gate_open(self, now: float) -> bool:
        """No eviction unconfirmed or cooling (stop-and-wait pacing); retires timed-out
        ones and expired cooling first."""
        for item, credit in list(self._outstanding.items()):
            if now - item.evicted_at >= self.confirmation_timeout:
                del self._outstanding[item]
                self._cooling.append(_Cooling(credit, now + self.grace))
                REVOCATIONS.labels(TIMED_OUT, self.pool_name).inc()
        if self._cooling:
            kept = [c for c in self._cooling if now < c.until]
            for c in self._cooling:
                if now >= c.until:
                    self.pending = max(0.0, self.pending - c.credit)
            self._cooling = kept
        return not self._outstanding and not self._cooling

    def next_change(self) -> float | None:
        """When the gate may open by time alone (a cooling ends, a confirmation times
        out); None when nothing is pending."""
        times = [c.until for c in self._cooling]
        times += [i.evicted_at + self.confirmation_timeout for i in self._outstanding]
        return min(times) if times else None

    def victims(self, below: int) -> list[Running]:
        """Evictable requests in eviction order whose priority is < `below`."""
        order = sorted(self._running, key=lambda r: (r.priority, -r.dispatched_at))
        return [r for r in order if r.priority < below]

    def reclaim(
        self, saturation: float, ceiling: float, demand: int, in_flight: int, now: float
    ) -> list[Running]:
        """One decision (the caller saw `gate_open`): evict up to n requests of priority
        below `demand`; returns those told to stop."""
        if in_flight <= 0 or not self._running:
            return []
        credit = saturation / in_flight
        if not credit > 0 or math.isinf(credit):
            return []
        net = saturation - ceiling - self.pending
        if net < 0:
            return []
        n = min(max(1, math.ceil(net / credit)), self.max_per_decision)
        out: list[Running] = []
        for item in self.victims(demand):
            if len(out) == n:
                break
            del self._running[item]
            item.evicted_at = now
            if not item.stop():
                continue  # already over: nothing to reclaim from it
            self._outstanding[item] = credit
            self.pending += credit
            out.append(item)
        if out:
            self.evicted_total += len(out)
            REVOCATIONS_ISSUED.labels(str(demand), self.pool_name).inc(len(out))
        return out


def confirmation_grace(detector: object, refresh_s: float) -> float:
    """The pacing grace for a saturation detector (upstream derives it, not configures
    it): the concurrency detector leads (it counts the stream's end at once), a scraped
    one lags by a scrape interval, its staleness window and the engine's reclaim time."""
    if getattr(detector, "type_name", "") == "concurrency-detector":
        return LEADING_SENSOR_GRACE_S
    params = getattr(detector, "params", None)
    staleness = float(getattr(params, "metrics_staleness_threshold", 0.2))
    return refresh_s + staleness + ENGINE_RECLAIM_BUDGET_S


def new_evictor(detector: object, pool_name: str, refresh_s: float) -> Evictor:
    return Evictor(pool_name=pool_name, grace=confirmation_grace(detector, refresh_s))
