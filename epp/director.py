"""One request's life between parsing and the reply to Envoy, free of any wire format.

Candidates are narrowed in a fixed order: the gateway's subset hint, then endpoints
that serve the model, then those the planner is not draining, then healthy ones. The
scheduler runs on that snapshot; the chosen endpoints' in-flight counters are taken at
pick; the ext_proc side reports the response's first token (`first_token`: the prompt
is no longer pending prefill work) and its end (`release`, exactly once, however the
response or the stream ends).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from epp.admission import Admission
from epp.datastore import Datastore, EndpointSnapshot
from epp.errors import EppError, not_found, unavailable
from epp.logsafe import clip
from epp.observability import (
    REQUEST_ERRORS,
    REQUESTS_TOTAL,
    RUNNING_REQUESTS,
    SCHEDULER_ATTEMPTS,
    UNTIMED,
    adder,
    labelled,
    model_label,
    plugin_timer,
)
from epp.request import InferenceRequest
from epp.scheduling.interfaces import PreRequest
from epp.scheduling.scheduler import Scheduler
from epp.scheduling.types import (
    PREFIX_MATCH_KEY,
    CachedPrompt,
    CycleState,
    ProfileResult,
    SchedulingResult,
)

if TYPE_CHECKING:
    from epp.flowcontrol.controller import FlowController
    from epp.rewrite import ModelRewrites

# A 404 names the unknown model and the served ones, clipped: the name is the client's
# (a 1 MB model name once made a 1 MB error body), the list grows with LoRA adapters.
MAX_ECHOED_MODEL = 256
MAX_LISTED_MODELS = 20

log = logging.getLogger("epp.director")

Adder = Callable[[float], None]  # a metric child's `inc` (epp.observability.adder)


@dataclass(frozen=True, slots=True)
class Hold:
    """What one request counts against one endpoint while it is in flight."""

    name: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    ticket: int = 0  # the datastore's, for its awaiting-first-byte list


@dataclass(slots=True)
class RoutingDecision:
    """Where a request goes: destinations best first, extra headers, and what it holds."""

    destinations: list[str]
    headers: dict[str, str] = field(default_factory=dict)
    result: SchedulingResult | None = None
    held: list[Hold] = field(default_factory=list)
    # (model_name, target_model_name) metric labels, bounded by `model_label`; set for
    # scheduled requests (the running-requests gauge, the per-response histograms).
    labels: tuple[str, str] | None = None
    prefill_released: bool = False
    released: bool = False


@dataclass
class ColdStart:
    """Scale from zero: a request that finds no routable endpoint (none, or all
    draining or unhealthy) waits here instead of getting 503 at once. `wake()` tells
    the planner (it starts a replica for every role that has none); the request is
    routed as soon as an endpoint can take it, or gets 503 after `timeout_s`. At most
    `max_waiting` requests wait; more get 503 at once (a bounded queue)."""

    wake: Callable[[], None]
    timeout_s: float = 60.0
    max_waiting: int = 1000
    waiting: int = 0
    poll_s: float = 0.05


class Director:
    """Routes requests with `scheduler` over `datastore`'s endpoints; after a pick, runs
    the `pre_request` hooks (e.g. a prefix index recording where the prompt went)."""

    def __init__(
        self,
        datastore: Datastore,
        scheduler: Scheduler,
        pre_request: Sequence[PreRequest] = (),
        rng: random.Random | None = None,
        admission: Admission | None = None,
        namespace: str = "",
    ) -> None:
        self.datastore = datastore
        self.scheduler = scheduler
        self.pre_request = tuple(pre_request)
        self._pre_timers = [plugin_timer("PreRequest", p) for p in self.pre_request]
        # The pods' namespace, the `namespace` label of scheduling attempts (GIE labels
        # each attempt with the picked pod's namespace; all of a pool's pods share one).
        self.namespace = namespace
        self.rng = rng or random.Random()
        # Called with each admitted request's prompt-token estimate (the planner's
        # demand: admitted requests, not completions, Dynamo #11693). Must be quick.
        self.admission_sinks: list[Callable[[int], None]] = []
        self.cold_start: ColdStart | None = None  # set by the planner with min-endpoint 0
        # Priorities and shedding (epp/admission.py); None admits everything.
        self.admission = admission
        # Flow control (epp/flowcontrol/): the stream waits in it before `route`; told
        # here whenever a request ends, since that may free capacity.
        self.flow_control: FlowController | None = None
        # InferenceModelRewrite rules (epp/rewrite.py), None when there are none; replaced
        # whole when they change (a worker thread parsing a request may be reading it).
        self.rewrites: ModelRewrites | None = None
        # Called with (request, result) after each successful pick (the status page's
        # ring of recent decisions, epp/status/ring.py). Must be quick: no copying here.
        self.decision_sinks: list[Callable[[InferenceRequest, SchedulingResult], None]] = []
        self._adders: dict[tuple[str, str, str, int, int], tuple[Adder, Adder, Adder]] = {}
        self._running: dict[str, Adder] = {}  # model label → the running-requests gauge

    def stop_timing(self) -> None:
        """Record no plugin durations, the scheduler's nor the pre-request hooks'
        (`Scheduler.stop_timing`)."""
        self.scheduler.stop_timing()
        self._pre_timers = [UNTIMED] * len(self.pre_request)

    def candidates(
        self, request: InferenceRequest, subset: Sequence[str] | None
    ) -> list[EndpointSnapshot]:
        """Endpoints allowed to take `request`; raises EppError(404/503) if none."""
        snaps = self.datastore.snapshot()
        if not snaps:
            raise unavailable("the pool has no endpoints")
        if subset is None:
            # The common case in one pass (the same endpoints, in the same order, as the
            # steps below); only a request that ends up with none takes the steps, to
            # say which one left nothing.
            model = request.target_model
            if model:
                ok = [
                    s
                    for s in snaps
                    if s.healthy
                    and not s.draining
                    and (s.models is None or model in s.models or model in s.metrics.active_models)
                ]
            else:
                ok = [s for s in snaps if s.healthy and not s.draining]
            if ok:
                return ok
        else:
            snaps = _restrict_to_subset(snaps, subset)
            if not snaps:
                raise unavailable(
                    "no endpoint of the pool is in the gateway's subset hint "
                    f"({', '.join(subset) or 'empty list'})"
                )
        if request.target_model:
            serving = [s for s in snaps if s.serves(request.target_model)]
            if not serving:
                raise not_found(
                    f"model '{clip(request.target_model, MAX_ECHOED_MODEL)}' is not served "
                    "by this pool" + _known_models_hint(snaps)
                )
            snaps = serving
        active = [s for s in snaps if not s.draining]
        if not active:
            raise unavailable(
                f"all {len(snaps)} candidate endpoints are draining (the planner is scaling down)"
            )
        snaps = active
        healthy = [s for s in snaps if s.healthy]
        if not healthy:
            errors = {self.datastore.last_error(s.name) for s in snaps} - {""}
            detail = f" (last scrape errors: {'; '.join(sorted(errors))})" if errors else ""
            raise unavailable(f"none of the {len(snaps)} candidate endpoints is healthy{detail}")
        return healthy

    def has_capacity(self) -> bool:
        """Some endpoint could take a request now (healthy, not draining)."""
        return any(s.healthy and not s.draining for s in self.datastore.snapshot())

    async def await_capacity(self) -> None:
        """With scale from zero on and nothing routable: wait for a replica (see
        `ColdStart`); raises EppError(503) when the queue is full or time runs out."""
        cold = self.cold_start
        if cold is None or self.has_capacity():
            return
        if cold.waiting >= cold.max_waiting:
            raise unavailable(
                f"the pool is scaling from zero and {cold.waiting} requests already wait "
                "for its first replica; try again shortly"
            )
        cold.waiting += 1
        try:
            cold.wake()
            deadline = time.monotonic() + cold.timeout_s
            while not self.has_capacity():
                if time.monotonic() >= deadline:
                    raise unavailable(
                        f"the pool is scaling from zero and no replica was ready within "
                        f"{cold.timeout_s:g} s; try again shortly"
                    )
                await asyncio.sleep(cold.poll_s)
        finally:
            cold.waiting -= 1

    @property
    def prepares(self) -> bool:
        """Some plugin has request-only work (`Scheduler.prepare`) worth a worker thread."""
        return bool(self.scheduler.preparers)

    def prepare(self, request: InferenceRequest) -> CycleState:
        """The request's cycle state with request-only work done; any thread."""
        return self.scheduler.prepare(request)

    def route(
        self,
        request: InferenceRequest,
        subset: Sequence[str] | None,
        state: CycleState | None = None,
    ) -> RoutingDecision:
        """Schedule a parsed request; raises EppError for any refusal. `state`: what
        `prepare(request)` returned, if it ran (off the loop, for a large request)."""
        served = self.datastore.served_models()
        model = model_label(request.model, served)
        target = model_label(request.target_model, served)
        try:
            candidates = self.candidates(request, subset)
            priority = self.admission.admit(request, candidates) if self.admission else 0
            request.priority = priority
            result = self.scheduler.schedule(request, candidates, state)
        except EppError as e:
            labelled(SCHEDULER_ATTEMPTS, "failure", target, "", "", "").inc()  # no pod: as GIE
            labelled(REQUEST_ERRORS, model, target, str(e.status)).inc()
            raise
        primary = result.primary.targets[0]
        add_attempt, add_request, add_running = self._success_adders(
            model, target, primary.endpoint.name, primary.endpoint.port, priority
        )
        add_attempt(1)
        add_request(1)
        # One dict per request, shared by the decision and the result: pre-request hooks
        # add headers to the result (a DP rank), and the result's own dict may be a shared
        # default that no request may write into.
        result.headers = headers = dict(result.headers)
        decision = RoutingDecision(
            destinations=[t.hostport for t in result.primary.targets],
            headers=headers,
            result=result,
            labels=(model, target),
        )
        self._hold(decision, request, result)
        add_running(1)
        for sink in self.admission_sinks:
            sink(request.prompt_tokens_estimate)
        for plugin, timer in zip(self.pre_request, self._pre_timers, strict=True):
            t = time.perf_counter()
            try:
                plugin.pre_request(request, result)
            except Exception:  # a broken hook must not lose the request
                log.exception("pre-request plugin %r failed", plugin)
            timer.observe(time.perf_counter() - t)
        for decision_sink in self.decision_sinks:
            decision_sink(request, result)
        return decision

    def _success_adders(
        self, model: str, target: str, pod: str, port: int, priority: int
    ) -> tuple[Adder, Adder, Adder]:
        """A routed request's three metric updates (scheduling attempts, requests,
        running requests) as `adder`s, found with one dict lookup per request instead of
        three `labelled` calls and two `str()`s. Bounded as `labelled`'s: model labels go
        through `model_label`, pods are the pool's."""
        key = (model, target, pod, port, priority)
        adders = self._adders.get(key)
        if adders is None:
            running = self._running.get(model)
            if running is None:
                running = self._running[model] = adder(labelled(RUNNING_REQUESTS, model))
            adders = self._adders[key] = (
                adder(
                    labelled(SCHEDULER_ATTEMPTS, "success", target, pod, self.namespace, str(port))
                ),
                adder(labelled(REQUESTS_TOTAL, model, target, str(priority))),
                running,
            )
        return adders

    def route_bodyless(
        self, request: InferenceRequest, subset: Sequence[str] | None
    ) -> RoutingDecision:
        """A request without a body (GET): any healthy endpoint, chosen at random."""
        candidates = self.candidates(request, subset)
        chosen = candidates[self.rng.randrange(len(candidates))]
        decision = RoutingDecision(destinations=[chosen.hostport])
        decision.held.append(Hold(chosen.name, ticket=self.datastore.acquire(chosen.name)))
        return decision

    def _hold(
        self,
        decision: RoutingDecision,
        request: InferenceRequest,
        result: SchedulingResult,
    ) -> None:
        """Count the request against each profile's pick. Its prompt counts only the part
        the pick does not hold in cache when a prefix producer ran (as llm-d counts it): an
        8,500-token prompt with 8,000 cached is 500 tokens of prefill, and counting all of
        it made the affinity gate leave a cached server for a cold one."""
        prompt, output = request.prompt_tokens_estimate, request.expected_output_tokens
        cached: CachedPrompt | None = result.cycle_state.read(PREFIX_MATCH_KEY)
        for res in result.profile_results.values():
            if isinstance(res, ProfileResult) and res.targets:
                name = res.targets[0].endpoint.name
                hit = cached.cached_tokens(name) if cached is not None else 0
                uncached = max(0, prompt - hit)
                ticket = self.datastore.acquire(name, uncached, output)
                decision.held.append(Hold(name, uncached, output, ticket))

    def first_token(self, decision: RoutingDecision) -> None:
        """The response's first token passed: its prompt tokens stop counting (once)."""
        if decision.prefill_released or decision.released:
            return
        decision.prefill_released = True
        for hold in decision.held:
            self.datastore.prefill_done(hold.name, hold.prompt_tokens, hold.ticket)

    def release(self, decision: RoutingDecision) -> None:
        """The request is over: give back everything it still holds (once)."""
        if decision.released:
            return
        decision.released = True
        if decision.labels is not None:
            model = decision.labels[0]
            running = self._running.get(model)  # set by `_success_adders` at routing
            if running is None:  # a decision routed elsewhere (another director)
                running = self._running[model] = adder(labelled(RUNNING_REQUESTS, model))
            running(-1)
        prompt_done = decision.prefill_released
        for hold in decision.held:
            prompt = 0 if prompt_done else hold.prompt_tokens
            self.datastore.release(hold.name, prompt, hold.output_tokens, hold.ticket)
        if self.flow_control is not None:
            self.flow_control.capacity_freed()


def _restrict_to_subset(
    snaps: list[EndpointSnapshot], subset: Sequence[str]
) -> list[EndpointSnapshot]:
    """Keep endpoints named by the hint: `ip:port` matches exactly, a bare `ip` any port."""
    exact = set(subset)
    addresses = {s for s in subset if ":" not in s or (s.startswith("[") and s.endswith("]"))}
    return [s for s in snaps if s.hostport in exact or s.endpoint.address in addresses]


def _known_models_hint(snaps: list[EndpointSnapshot]) -> str:
    known = sorted(set().union(*(s.models or () for s in snaps)))
    if not known:
        return ""
    more = f" and {len(known) - MAX_LISTED_MODELS} more" if len(known) > MAX_LISTED_MODELS else ""
    names = ", ".join(clip(k, MAX_ECHOED_MODEL) for k in known[:MAX_LISTED_MODELS])
    return f"; served models: {names}{more}"
