"""The pool as the EPP sees it: endpoints, their latest metrics, in-flight counts, health.

The datastore owns mutable state; scheduling never sees it directly. Each request gets
an immutable list of `EndpointSnapshot`s (`Datastore.snapshot()`), so plugins compute
over a consistent picture and a scrape landing mid-cycle cannot tear it.
No I/O happens here: the datalayer fills it, the ext_proc side reads and counts.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

ROLE_LABEL = "llm-d.ai/role"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Identity of one model server (one port of one pod)."""

    name: str
    address: str
    port: int
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def hostport(self) -> str:
        if ":" in self.address:  # IPv6 literal
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"

    @property
    def role(self) -> str | None:
        return self.labels.get(ROLE_LABEL)


@dataclass(frozen=True, slots=True)
class RankLoad:
    """One data-parallel rank of an endpoint, from the series labelled with its index
    (vLLM's `engine` label, SGLang's `dp_rank`)."""

    rank: int
    waiting_queue_size: int = 0
    running_requests: int = 0
    kv_cache_usage: float = 0.0


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """What a model server last reported on /metrics (engine-neutral names).

    Fields follow the upstream EPP's metrics struct: queue and running counts,
    KV-cache usage as a 0..1 fraction, LoRA residency, and the cache geometry from
    `vllm:cache_config_info`. `update_time` is the clock reading of the scrape.
    """

    waiting_queue_size: int = 0
    running_requests: int = 0
    kv_cache_usage: float = 0.0
    active_models: frozenset[str] = frozenset()
    waiting_models: frozenset[str] = frozenset()
    max_active_models: int = 0
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    cache_offload_blocks: int = 0  # off-GPU (CPU offload) blocks, when reported
    update_time: float = 0.0
    # Per data-parallel rank, by rank, when the scrape showed two ranks or more (one
    # server running `--data-parallel-size N` behind one API port); empty otherwise.
    # The fields above stay the endpoint's totals, so endpoint-level scheduling is
    # unchanged; the `data-parallel-rank-picker` reads these to name a rank.
    ranks: tuple[RankLoad, ...] = ()


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """One endpoint as a scheduling cycle sees it: identity, metrics, EPP-side load."""

    endpoint: Endpoint
    metrics: EndpointMetrics
    inflight_requests: int = 0
    # Prompt tokens of requests still waiting for their first token plus expected output
    # tokens of requests still generating (see `Datastore.acquire`).
    inflight_tokens: int = 0
    # The prompt part alone: prefill work not yet done (llm-d's TTFT gate reads only this).
    inflight_prefill_tokens: int = 0
    # When the oldest request routed here that has not had its first response byte yet
    # was routed (the datastore's in-flight clock, `Datastore.inflight_clock`); None when
    # every request here has had it. Its age tells how far the server is into the work
    # queued ahead of a new request (a long prompt's prefill step half done leaves half
    # its time to wait), which the token counts alone cannot.
    oldest_pending_at: float | None = None
    healthy: bool = True
    models: frozenset[str] | None = None
    # Being drained by the planner: never picked, its in-flight requests finish.
    draining: bool = False

    def serves(self, model: str) -> bool:
        """True if the endpoint serves `model`, or has not told us what it serves."""
        return self.models is None or model in self.models or model in self.metrics.active_models

    @property
    def name(self) -> str:
        return self.endpoint.name

    @property
    def hostport(self) -> str:
        return self.endpoint.hostport


@dataclass(slots=True)
class _EndpointState:
    endpoint: Endpoint
    metrics: EndpointMetrics = field(default_factory=EndpointMetrics)
    inflight_requests: int = 0
    inflight_prefill_tokens: int = 0
    inflight_decode_tokens: int = 0
    # Requests still waiting for their first byte: ticket → routing time, oldest first
    # (tickets are stamped in increasing time order, and an OrderedDict keeps the oldest
    # at its head in O(1) when others leave from the middle).
    awaiting_first: OrderedDict[int, float] = field(default_factory=OrderedDict)
    scrape_ok: bool = False
    last_error: str = ""
    models: frozenset[str] | None = None
    draining: bool = False
    # The snapshot handed to scheduling, rebuilt only after a change, and the clock
    # reading until which its `healthy=True` holds (staleness is the only change that
    # happens by time alone).
    snap: EndpointSnapshot | None = None
    healthy_until: float = 0.0


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@dataclass(frozen=True, eq=False)
class _Listener:
    fn: Callable[[], None]
    loop: asyncio.AbstractEventLoop | None

    def notify(self) -> None:
        if self.loop is None or self.loop is _running_loop():
            self.fn()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.fn)


class Datastore:
    """Endpoints keyed by name; health is derived from scrape success and age.

    `staleness` is how old the last good scrape may be before the endpoint counts as
    unhealthy. An endpoint that was never scraped is unhealthy, unless metrics are
    not collected at all (`require_metrics=False`), e.g. in unit tests.
    """

    def __init__(
        self,
        staleness: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        require_metrics: bool = True,
        inflight_clock: Callable[[], float] | None = None,
    ) -> None:
        self._states: dict[str, _EndpointState] = {}
        self._by_hostport: dict[str, str] = {}
        self.staleness = staleness
        self.clock = clock
        self.require_metrics = require_metrics
        # Stamps `oldest_pending_at` (default: `clock`). The server passes the wall
        # monotonic clock: a server keeps working while the EPP's loop stalls, so a pending
        # request's age is real time, not the stall-corrected time staleness is judged in.
        self.inflight_clock = inflight_clock or clock
        self._tickets = itertools.count(1)
        self._listeners: list[_Listener] = []
        # Called after each metrics update, on the updating thread (the scraper's loop):
        # flow control retries dispatch when fresh metrics may show freed capacity.
        self.metrics_listeners: list[Callable[[], None]] = []
        self._served: frozenset[str] | None = None  # cache of served_models()
        # The last snapshot, kept up to date incrementally: `snapshot()` rebuilds only the
        # endpoints touched since (`_dirty`), and rechecks staleness for all of them only
        # once the earliest `healthy_until` has passed (at 1,000 endpoints
        # a full pass per request was a large part of the scheduling time).
        self._view: list[EndpointSnapshot] | None = None
        self._index: dict[str, int] = {}
        self._dirty: list[_EndpointState] = []
        self._next_expiry = float("inf")
        # The planner thread takes snapshots too: the view and its dirty list change
        # under this lock (uncontended on the request path: ~0.1 µs).
        self._snap_lock = threading.Lock()
        # Writes waiting in another thread's hand-over (the scraper thread's), applied
        # at the start of every snapshot (see `add_inbox`).
        self._inboxes: list[Callable[[], None]] = []

    # ---- membership -------------------------------------------------------
    def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """Replace the pool; known endpoints keep their metrics and counters."""
        new: dict[str, _EndpointState] = {}
        for ep in endpoints:
            old = self._states.get(ep.name)
            if old is not None and old.endpoint == ep:
                new[ep.name] = old
            else:
                new[ep.name] = _EndpointState(endpoint=ep)
        with self._snap_lock:
            self._states = new
            self._view = None  # membership changed: the next snapshot is built whole
        self._by_hostport = {s.endpoint.hostport: name for name, s in new.items()}
        self._served = None
        for listener in list(self._listeners):
            listener.notify()

    def add_endpoint(self, endpoint: Endpoint) -> None:
        """Add (or replace) one endpoint, keeping the others: a connector's new replica."""
        kept = [e for e in self.endpoints() if e.name != endpoint.name]
        self.set_endpoints([*kept, endpoint])

    def remove_endpoint(self, name: str) -> None:
        """Take one endpoint out of the pool (a connector stopped it)."""
        if name in self._states:
            self.set_endpoints([e for e in self.endpoints() if e.name != name])

    def set_draining(self, name: str, draining: bool = True) -> None:
        """Mark `name` as draining: the director never picks it again, but it stays in
        the pool (scraped, its in-flight requests counted) until it is removed."""
        s = self._states.get(name)
        if s is not None and s.draining != draining:
            s.draining = draining
            self._touch(s)

    def on_change(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call `fn` after every membership change; returns a function that unsubscribes.

        A listener that subscribed inside an event loop is always called on that loop's
        thread: a change made from another thread is handed to the loop, so listeners
        (scraper, KV-event subscriber, prefix indexes) never race a scheduling cycle.
        """
        listener = _Listener(fn, _running_loop())
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def endpoints(self) -> list[Endpoint]:
        return [s.endpoint for s in self._states.values()]

    def get(self, name: str) -> Endpoint | None:
        s = self._states.get(name)
        return s.endpoint if s else None

    def by_hostport(self, hostport: str) -> Endpoint | None:
        name = self._by_hostport.get(hostport)
        return self._states[name].endpoint if name else None

    def __len__(self) -> int:
        return len(self._states)

    # ---- metrics ----------------------------------------------------------
    def update_metrics(self, name: str, metrics: EndpointMetrics) -> None:
        s = self._states.get(name)
        if s is None:
            return
        if metrics.active_models != s.metrics.active_models:
            self._served = None
        s.metrics = metrics
        s.scrape_ok = True
        s.last_error = ""
        self._touch(s)
        for fn in self.metrics_listeners:
            fn()

    def mark_scrape_failed(self, name: str, error: str) -> None:
        s = self._states.get(name)
        if s is None:
            return
        s.scrape_ok = False
        s.last_error = error
        self._touch(s)

    def set_models(self, name: str, models: Iterable[str]) -> None:
        """Models the endpoint reports serving (/v1/models); None means not yet known."""
        s = self._states.get(name)
        if s is not None:
            s.models = frozenset(models)
            self._touch(s)
            self._served = None

    def models(self, name: str) -> frozenset[str] | None:
        s = self._states.get(name)
        return s.models if s else None

    def served_models(self) -> frozenset[str]:
        """Every model name some endpoint reports (/v1/models, or a LoRA adapter running
        per its metrics): the names that may become metric labels. Cached until one of
        those sources changes."""
        if self._served is None:
            names: set[str] = set()
            for s in self._states.values():
                names.update(s.models or ())
                names.update(s.metrics.active_models)
            self._served = frozenset(names)
        return self._served

    def metrics(self, name: str) -> EndpointMetrics | None:
        s = self._states.get(name)
        return s.metrics if s else None

    def last_error(self, name: str) -> str:
        s = self._states.get(name)
        return s.last_error if s else ""

    def is_healthy(self, name: str, now: float | None = None) -> bool:
        s = self._states.get(name)
        if s is None:
            return False
        return self._healthy(s, self.clock() if now is None else now)

    def _healthy(self, s: _EndpointState, now: float) -> bool:
        if not self.require_metrics:
            return True
        return s.scrape_ok and (now - s.metrics.update_time) <= self.staleness

    # ---- in-flight accounting (the EPP's own view of load) ----------------
    # A request holds, from routing until its response ends: one request, its prompt
    # tokens until its first token arrives (prefill pending), and its expected output
    # tokens (decode). The ext_proc side reports both moments (epp/extproc/stream.py).
    def acquire(self, name: str, prompt_tokens: int = 0, output_tokens: int = 0) -> int:
        """A request was routed to `name`. Returns its ticket: pass it to `prefill_done`
        and `release` so the request leaves the endpoint's awaiting-first-byte list (0
        when `name` is not in the pool)."""
        s = self._states.get(name)
        if s is None:
            return 0
        ticket = next(self._tickets)
        s.inflight_requests += 1
        s.inflight_prefill_tokens += prompt_tokens
        s.inflight_decode_tokens += output_tokens
        s.awaiting_first[ticket] = self.inflight_clock()
        self._touch(s)
        return ticket

    def prefill_done(self, name: str, prompt_tokens: int, ticket: int = 0) -> None:
        """A request on `name` got its first token: its prompt is no longer pending work."""
        s = self._states.get(name)
        if s is not None:
            s.inflight_prefill_tokens = max(0, s.inflight_prefill_tokens - prompt_tokens)
            s.awaiting_first.pop(ticket, None)
            self._touch(s)

    def release(
        self, name: str, prompt_tokens: int = 0, output_tokens: int = 0, ticket: int = 0
    ) -> None:
        """A request on `name` ended; `prompt_tokens` is what `prefill_done` did not give back."""
        s = self._states.get(name)
        if s is not None:
            s.inflight_requests = max(0, s.inflight_requests - 1)
            s.inflight_prefill_tokens = max(0, s.inflight_prefill_tokens - prompt_tokens)
            s.inflight_decode_tokens = max(0, s.inflight_decode_tokens - output_tokens)
            s.awaiting_first.pop(ticket, None)
            self._touch(s)

    def inflight(self, name: str) -> tuple[int, int]:
        """(requests, tokens) in flight on `name`; tokens = pending prompt + expected output."""
        s = self._states.get(name)
        if s is None:
            return (0, 0)
        return (s.inflight_requests, s.inflight_prefill_tokens + s.inflight_decode_tokens)

    # ---- what scheduling sees --------------------------------------------
    def add_inbox(self, drain: Callable[[], None]) -> Callable[[], None]:
        """Call `drain()` at the start of every `snapshot()`; returns its remover.

        For writes that wait in another thread's queue (the scraper thread's hand-over):
        a scheduling cycle then sees every result that arrived before it, without one
        cross-thread wake-up of the loop per result. `drain` runs on whatever thread
        takes the snapshot (the planner's too), so it must apply writes only when it
        runs on the datastore's own loop.
        """
        self._inboxes.append(drain)
        return lambda: self._inboxes.remove(drain) if drain in self._inboxes else None

    def _touch(self, s: _EndpointState) -> None:
        """`s` changed: its snapshot is rebuilt by the next `snapshot()`."""
        if s.snap is not None:
            with self._snap_lock:
                s.snap = None
                self._dirty.append(s)

    def snapshot(self) -> list[EndpointSnapshot]:
        """Immutable per-endpoint views (a new list each call); unchanged endpoints reuse
        their last view, so a call costs the endpoints changed since the last one."""
        for drain in self._inboxes:
            drain()
        with self._snap_lock:
            return self._snapshot(self.clock())

    def _snapshot(self, now: float) -> list[EndpointSnapshot]:
        view = self._view
        if view is None:
            self._dirty.clear()
            self._index = {name: i for i, name in enumerate(self._states)}
            view = self._view = [self._build(s, now) for s in self._states.values()]
            self._next_expiry = min(
                (s.healthy_until for s in self._states.values() if s.snap and s.snap.healthy),
                default=float("inf"),
            )
            return list(view)
        if self._dirty:
            index = self._index
            for s in self._dirty:
                if s.snap is None:  # not rebuilt yet (touched twice, or removed)
                    i = index.get(s.endpoint.name)
                    if i is not None and self._states.get(s.endpoint.name) is s:
                        snap = view[i] = self._build(s, now)
                        if snap.healthy:
                            self._next_expiry = min(self._next_expiry, s.healthy_until)
            self._dirty.clear()
        if now > self._next_expiry:  # some healthy view may have gone stale
            expiry = float("inf")
            for i, s in enumerate(self._states.values()):
                snap = view[i]
                if snap.healthy and now > s.healthy_until:
                    snap = view[i] = self._build(s, now)
                if snap.healthy:
                    expiry = min(expiry, s.healthy_until)
            self._next_expiry = expiry
        return list(view)

    def _build(self, s: _EndpointState, now: float) -> EndpointSnapshot:
        snap = s.snap = EndpointSnapshot(
            endpoint=s.endpoint,
            metrics=s.metrics,
            inflight_requests=s.inflight_requests,
            inflight_tokens=s.inflight_prefill_tokens + s.inflight_decode_tokens,
            inflight_prefill_tokens=s.inflight_prefill_tokens,
            oldest_pending_at=next(iter(s.awaiting_first.values()), None),
            healthy=self._healthy(s, now),
            models=s.models,
            draining=s.draining,
        )
        s.healthy_until = (
            float("inf") if not self.require_metrics else s.metrics.update_time + self.staleness
        )
        return snap
