"""The asyncio side of flow control: hold a request until the pool can take it.

`await controller.acquire(request, size)` returns when the request may be routed, or
raises `EppError`: 429 when it cannot wait (sheddable while the pool is saturated or
others wait; the queue or its band full), 503 when it waited `defaultRequestTTL`. The
caller routes at once after it returns (no await in between: `RequestStream` calls the
synchronous `handle` next), so the request counts as in flight before anyone else is let
through.

Rules (GIE's dispatch cycle, gie-epp.md §5.4, `pkg/epp/flowcontrol/controller/internal/
processor.go`):
- saturation = the config's saturation detector over the pool's routable endpoints
  (healthy, not draining), as upstream computes it per pool, not per request;
- a request goes straight through when the saturation is below the ceiling
  (`static-usage-limit-policy`: `threshold` 1.0, for sheddable requests
  `sheddableThreshold`) and nobody is waiting; otherwise a request of priority ≥ 0
  waits, a sheddable one (< 0) gets 429 at once;
- dispatch: while saturation < ceiling, the queue's next item (highest band, next flow
  in turn, oldest) is let through, **one at a time**: the next only after the previous
  one was routed, so an in-flight-based detector sees each one before the next decision
  (upstream dispatches a batch per cycle against a 50 ms cached saturation);
- a dispatch attempt runs when capacity may have freed: a request ended
  (`capacity_freed`, from `Director.release`), new metrics arrived, the pool changed,
  or a request joined. Nothing polls; an idle queue costs nothing.
- each waiting request has one timer (its TTL); a client that goes away (its ext_proc
  stream ends, so its task is cancelled) leaves the queue at once;
- a request's TTL is `defaultRequestTTL`, or less if its `x-llm-d-inference-ttl` header
  asks for less (`effective_ttl`); the deadline orderings (`edf-ordering-policy`,
  `slo-deadline-ordering-policy`) sort a band's flows by it or by `x-slo-ttft-ms`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from epp.admission import Objectives, SaturationDetector
from epp.config.errors import ConfigError
from epp.datastore import Datastore, EndpointSnapshot
from epp.errors import EppError
from epp.flowcontrol import metrics as fm
from epp.flowcontrol.config import FlowControlConfig, duration
from epp.flowcontrol.eviction import Evictor
from epp.flowcontrol.queue import DEFAULT_FLOW, FlowQueue, Item
from epp.headers import INFERENCE_TTL, SLO_TTFT_MS
from epp.observability import model_label
from epp.request import InferenceRequest


def effective_ttl(request: InferenceRequest, default: float) -> float:
    """Seconds `request` may wait: its `x-llm-d-inference-ttl` (a Go duration, "2s",
    "500ms", as llm-d-router's FlowControlAdmissionController reads it), never more than
    the configured `default` (0 = no bound, then the header alone). A malformed, zero or
    negative header is ignored, as upstream ignores it: the default applies."""
    raw = request.headers.get(INFERENCE_TTL)
    if raw:
        try:
            ttl = duration(raw.strip(), INFERENCE_TTL)
        except ConfigError:
            ttl = 0.0
        if ttl > 0:
            return min(ttl, default) if default > 0 else ttl
    return default


def slo_ttft_seconds(request: InferenceRequest) -> float | None:
    """The request's `x-slo-ttft-ms` in seconds (None when absent, malformed or ≤ 0)."""
    raw = request.headers.get(SLO_TTFT_MS)
    if not raw:
        return None
    try:
        ms = float(raw)
    except ValueError:
        return None
    return ms / 1000.0 if math.isfinite(ms) and ms > 0 else None


def capacity_rejected(message: str) -> EppError:
    return EppError(429, message, "too_many_requests")


def ttl_expired(message: str) -> EppError:
    return EppError(503, message, "queue_timeout")


class FlowController:
    def __init__(
        self,
        config: FlowControlConfig,
        detector: SaturationDetector,
        datastore: Datastore,
        objectives: Objectives,
        pool_name: str = "default",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.detector = detector
        self.datastore = datastore
        self.objectives = objectives
        self.pool_name = pool_name
        self.clock = clock
        self.queue = FlowQueue(
            config.max_requests, config.max_bytes, config.bands, config.default_band
        )
        self.saturation = 0.0  # as last computed (the pool_saturation gauge)
        self._granted = 0  # let through, not yet routed (0 or 1)
        self._kick_pending = False
        self._fairness_labels = fm.FairnessLabels()
        self._loop: asyncio.AbstractEventLoop | None = None  # the request loop, once known
        # `flowControl.enableEviction`: running sheddable requests stopped for waiting
        # higher-priority ones (epp/flowcontrol/eviction.py); the streams track into it.
        self.eviction: Evictor | None = None
        self._eviction_timer: asyncio.TimerHandle | None = None

    # ---- the request's side ---------------------------------------------------------
    async def acquire(self, request: InferenceRequest, size: int) -> None:
        """Return when `request` (`size` body bytes) may be routed; raise EppError if not."""
        t0 = self.clock()
        priority = self.objectives.priority(request)
        flow = request.fairness_key or DEFAULT_FLOW  # the session key when no fairness id
        served = self.datastore.served_models()
        labels = (
            self._fairness_labels(flow),
            str(priority),
            model_label(request.model, served),
            model_label(request.target_model, served),
        )
        snaps = self._routable()
        if not snaps:
            return  # nothing to wait for: the director answers (503) at once
        sat = self._saturation(snaps)
        ceiling = self.config.ceiling if priority >= 0 else self.config.sheddable_ceiling
        if sat < ceiling and not self.queue.requests and not self._granted:
            self._record(labels, fm.DISPATCHED, t0, t0)
            return
        if priority < 0:
            self._record(labels, fm.REJECTED_CAPACITY, t0, t0)
            why = (
                f"the pool is saturated ({sat:.2f} by {self.detector.name}; sheddable "
                f"requests pass below {ceiling:g})"
                if sat >= ceiling
                else f"{self.queue.requests + self._granted} requests of priority >= 0 are "
                "ahead of it"
            )
            raise capacity_rejected(
                f"{why} and objective {request.objective!r} is sheddable (priority "
                f"{priority}); retry later"
            )
        full = self.queue.capacity_error(priority, size)
        if full is not None:
            self._record(labels, fm.REJECTED_CAPACITY, t0, t0)
            raise capacity_rejected(f"{full}; retry later")
        loop = self._loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        ttl = effective_ttl(request, self.config.ttl)
        slo = slo_ttft_seconds(request)
        item = Item(
            priority,
            flow,
            size,
            fut,
            labels,
            ttl_deadline=t0 + ttl if ttl > 0 else math.inf,
            slo_deadline=t0 + slo if slo is not None else math.inf,
        )
        self.queue.push(item)
        fm.ENQUEUE_DURATION.labels(labels[0], labels[1], fm.QUEUED).observe(self.clock() - t0)
        timer = loop.call_later(ttl, self._expire, item, ttl) if ttl > 0 else None
        self._kick()
        try:
            await fut
        except asyncio.CancelledError:  # the client went away (its stream ended)
            if item.queued:
                self.queue.remove(item)
            elif self._was_granted(fut):
                self._granted -= 1
                self._kick()
            self._record(labels, fm.EVICTED_CANCELLED, t0, None)
            raise
        except EppError:
            self._record(labels, fm.EVICTED_TTL, t0, None)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._granted -= 1
        self._record(labels, fm.DISPATCHED, t0, None)
        self._kick()  # runs after the caller has routed this request

    def _expire(self, item: Item, ttl: float) -> None:
        fut: asyncio.Future[None] = item.payload
        if self.queue.remove(item) and not fut.done():
            source = (
                "flowControl.defaultRequestTTL"
                if ttl == self.config.ttl
                else f"the request's {INFERENCE_TTL} header"
            )
            fut.set_exception(
                ttl_expired(
                    f"the request waited {ttl:g}s in the flow-control queue "
                    f"(priority {item.priority}) and the pool stayed saturated; retry later "
                    f"(the wait is {source})"
                )
            )

    @staticmethod
    def _was_granted(fut: asyncio.Future[None]) -> bool:
        return fut.done() and not fut.cancelled() and fut.exception() is None

    # ---- capacity frees --------------------------------------------------------------
    def capacity_freed(self) -> None:
        """A request ended, metrics arrived or the pool changed: try to dispatch."""
        self._kick()

    def _kick(self) -> None:
        if self._kick_pending or not self.queue.requests or self._loop is None:
            return
        self._kick_pending = True
        self._loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        """Let the next waiting request through if the pool has room (one per call)."""
        self._kick_pending = False
        if self._granted or not self.queue.requests:
            return
        t0 = time.perf_counter()
        snaps = self._routable()
        # No routable endpoint: waiting cannot help; let it through to its 503.
        if snaps and self._saturation(snaps) >= self.config.ceiling:
            if self.eviction is not None:
                self._maybe_evict(snaps)
            fm.DISPATCH_CYCLE.observe(time.perf_counter() - t0)
            return
        while (item := self.queue.pop()) is not None:
            fut: asyncio.Future[None] = item.payload
            if not fut.done():  # a cancelled one is on its way out
                self._granted += 1
                fut.set_result(None)
                break
        fm.DISPATCH_CYCLE.observe(time.perf_counter() - t0)

    def _maybe_evict(self, snaps: list[EndpointSnapshot]) -> None:
        """The queue's head is blocked by saturation: one eviction decision if the pacing
        gate is open, and a wake-up for when it may open by time alone."""
        ev = self.eviction
        assert ev is not None
        now = self.clock()
        band = self.queue.peek_band()
        if band is not None and ev.evictable and ev.gate_open(now):
            in_flight = sum(s.inflight_requests for s in snaps)
            ev.reclaim(self.saturation, self.config.ceiling, band.priority, in_flight, now)
        at = ev.next_change()
        if at is not None and self._eviction_timer is None and self._loop is not None:
            self._eviction_timer = self._loop.call_later(max(0.0, at - now), self._eviction_due)

    def _eviction_due(self) -> None:
        self._eviction_timer = None
        self._kick()

    # ---- helpers ---------------------------------------------------------------------
    def _routable(self) -> list[EndpointSnapshot]:
        return [s for s in self.datastore.snapshot() if s.healthy and not s.draining]

    def _saturation(self, snaps: list[EndpointSnapshot]) -> float:
        self.saturation = self.detector.saturation(snaps)
        return self.saturation

    def _record(
        self, labels: tuple[str, ...], outcome: str, t0: float, t_enqueue: float | None
    ) -> None:
        fairness, priority, model, target = labels
        now = self.clock()
        fm.QUEUE_DURATION.labels(
            fairness, priority, outcome, self.pool_name, model, target
        ).observe(now - t0)
        if t_enqueue is not None:
            fm.ENQUEUE_DURATION.labels(fairness, priority, outcome).observe(now - t_enqueue)

    def metrics_snapshot(self) -> tuple[str, float, list[tuple[tuple[str, ...], int]]]:
        """(pool, saturation, [(labels, bytes)] per queued request), for the gauges."""
        return self.pool_name, self.saturation, [(i.labels, i.size) for i in self.queue.items()]
