"""One ext_proc stream (= one HTTP request) as an explicit state machine.

`handle(message) -> responses` is synchronous and pure apart from the director's
accounting, so tests drive it with exact protobufs and compare exact protobufs. The
gRPC servicer calls `handle_async`, the same but for one thing: a body larger than
PARSE_OFF_LOOP_BYTES is parsed in a worker thread, so one huge request does not stall
every other stream on the event loop for the whole parse.

Body modes differ in what Envoy waits for:
- FULL_DUPLEX_STREAMED (what gateways use): Envoy streams headers and body chunks
  without waiting; we hold everything until end of stream, then send the header
  response (destination, clear_route_cache) and the whole body back as
  `streamed_response` chunks of at most 62,000 bytes. A normal body mutation is
  rejected by Envoy in this mode.
- BUFFERED: Envoy waits for the header response before sending the one body message,
  so headers are answered at once (client routing headers removed) and the
  destination travels as a header mutation on the body response.
- STREAMED: like BUFFERED, but one response per chunk; held until the last chunk so
  the destination is known, the first carrying the header mutation.

The response (when Envoy sends it: response headers SEND, body FULL_DUPLEX_STREAMED,
trailers SEND) passes through unchanged: headers answered at once, every body chunk
answered with a `streamed_response` of the same bytes (in FULL_DUPLEX_STREAMED Envoy
forwards only what the processor sends back). On the way the `ResponseMeter` notes the
first token (the request's prompt stops counting as in-flight prefill) and the end
(last body chunk, trailers, or headers with end_of_stream), where the in-flight counts
are given back and the observer gets the request's record. A stream that ends before
its response did (client gone, upstream reset) gives them back in `close()`. What is done
with the response phases is `ResponseLeg`'s (epp/extproc/response_leg.py), shared with
the observer stream.

With `routes` (`--response-path observer`) the response never comes on this stream:
Envoy's second, observability-mode ext_proc filter sends it on its own stream
(epp/extproc/observer.py). Routing then tags the upstream request with `x-epp-route-id`
and parks the request's leg in the `RouteTable` for that stream to claim; this stream's
end gives nothing back.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.body_budget import BodyTicket
from epp.completion import ResponseObserver
from epp.director import Director, RoutingDecision
from epp.errors import EVICTED_PRIORITY, EppError, internal_error, timed_out, too_large
from epp.extproc import messages as m
from epp.extproc.handoff import RouteTable
from epp.extproc.refusals import RefusalLog
from epp.extproc.response_leg import ResponseLeg
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.eviction import Evictor, Running
from epp.headers import DESTINATION_ENDPOINT, PREFILLER_HOST_PORT, REQUEST_ID, ROUTE_ID
from epp.limits import BodyBudget, BodyLimits, HeaderLimits
from epp.observability import REQUESTS_REFUSED
from epp.request import (
    DEFAULT_BODY_LIMITS,
    InferenceRequest,
    is_anthropic_path,
    new_request,
    parse_body,
)
from epp.response import ResponseMeter
from epp.rewrite import ModelRewrites
from epp.scheduling.types import CycleState

if TYPE_CHECKING:
    from epp.tracing import RequestTrace, RequestTracer

log = logging.getLogger("epp.extproc")

# Above this many body bytes the JSON parse (and the re-serialisation a model rewrite
# needs) runs in a worker thread. Measured with bench/parse_offload.py (docs/BENCHMARKS.md):
# below it the parse costs the loop a few ms at most, less than the hand-off; from 1 MiB
# the thread cuts the loop's longest stall 3x. json.loads itself holds the GIL, so a huge
# body still stalls the loop for that one call: the body-size limit bounds it.
PARSE_OFF_LOOP_BYTES = 256 * 1024

# Above this many body bytes, when a plugin tokenizes the prompt (`Director.prepares`:
# a prefix producer with a `tokenizer`), the parse AND that request-only work
# (`Scheduler.prepare`) run in a worker thread before routing. Tokenizing costs ~2.4 µs
# of CPU per token (docs/BENCHMARKS.md@a73a134 "Chat rendering and tokenizing"): a 16 KiB prompt
# is ~4K tokens, ~10 ms on the loop, against ~0.1-0.2 ms for the hop; below it the hop
# costs about what it saves.
PREPARE_OFF_LOOP_BYTES = 16 * 1024

# The process's log of refusals (rate-limited per status); tests pass their own.
REFUSALS = RefusalLog(log)

_MODES = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = _MODES.FULL_DUPLEX_STREAMED
BUFFERED = _MODES.BUFFERED
STREAMED = _MODES.STREAMED


class Phase(enum.Enum):
    AWAIT_HEADERS = "await_headers"
    GATHER_BODY = "gather_body"
    ROUTED = "routed"
    RESPONDING = "responding"  # response headers seen, body streaming
    DONE = "done"  # the response ended; in-flight given back
    REJECTED = "rejected"


class RequestStream:
    """`observer` None switches the response measurement off (`--response-path off`):
    response phases, if Envoy sends them, still pass through and end the in-flight hold.
    `routes`: the observer mode (see the module doc)."""

    def __init__(
        self,
        director: Director,
        max_body_bytes: int,
        observer: ResponseObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        refusals: RefusalLog = REFUSALS,
        *,
        body_limits: BodyLimits = DEFAULT_BODY_LIMITS,
        header_limits: HeaderLimits | None = None,
        budget: BodyBudget | None = None,
        routes: RouteTable | None = None,
        tracer: RequestTracer | None = None,
    ) -> None:
        self.director = director
        # epp/tracing.py: None (off) costs one `is None` test per stage
        self.tracer = tracer
        self.trace: RequestTrace | None = None
        self.max_body_bytes = max_body_bytes
        self.observer = observer
        self.clock = clock
        self.refusals = refusals
        self.body_limits = body_limits
        self.header_limits = header_limits or HeaderLimits()
        # Bytes of this stream's body reserved in the server-wide budget (epp/limits.py).
        self.budget = budget
        self._ticket: BodyTicket | None = None
        self.routes = routes
        self.phase = Phase.AWAIT_HEADERS
        self.request_body_mode = FULL_DUPLEX
        self.response_body_mode = _MODES.NONE
        self.request: InferenceRequest | None = None
        self.decision: RoutingDecision | None = None
        self.subset: list[str] | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._generated_id = False
        self.routed_at = 0.0
        # The response's measurement and accounting; None until routed, and for good
        # when parked for the observer stream (`routes`).
        self.leg: ResponseLeg | None = None
        # `--response-path log`: the parked leg's id, to take it back if Envoy sends the
        # response on this stream after all.
        self._route_id = ""
        # (raw body, parse outcome) when handle_async parsed the body in a worker thread
        self._preparsed: tuple[bytes, _Parsed | Exception] | None = None
        # In-flight eviction (flowControl.enableEviction): this request's entry while it
        # may be evicted (None: it cannot be), and the task `evict` wakes: the servicer's,
        # set while it waits for Envoy's next message (`waiter`).
        self.running: Running | None = None
        self._evictor: Evictor | None = None
        self.evicted = False
        self.waiter: asyncio.Task | None = None

    @property
    def meter(self) -> ResponseMeter | None:
        return self.leg.meter if self.leg is not None else None

    @meter.setter
    def meter(self, meter: ResponseMeter | None) -> None:
        assert self.leg is not None
        self.leg.meter = meter

    # ---- entry points -----------------------------------------------------
    def handle(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = msg.WhichOneof("request")
        if self.phase is Phase.REJECTED:
            return []  # Envoy has our ImmediateResponse; anything else is moot
        if msg.HasField("protocol_config"):
            self.request_body_mode = msg.protocol_config.request_body_mode or FULL_DUPLEX
            self.response_body_mode = msg.protocol_config.response_body_mode
        try:
            if kind == "request_headers":
                return self._on_request_headers(msg)
            if kind == "request_body":
                return self._on_request_body(msg.request_body)
            if kind == "request_trailers":
                return self._on_request_trailers()
            if kind == "response_headers":
                return self._on_response_headers(msg.response_headers)
            if kind == "response_body":
                return self._on_response_body(msg.response_body)
            if kind == "response_trailers":
                self._end_response(complete=True)
                return [m.response_trailers_passthrough()]
        except EppError as e:
            return self._reject(e)
        except Exception as e:  # a bug must cost this request a 500, not the whole stream
            error = internal_error(f"unexpected {type(e).__name__} in the endpoint picker")
            error.__cause__ = e
            return self._reject(error)
        log.warning("ignoring ext_proc message of unknown kind %r", kind)
        return []

    def needs_async(self, msg: pb.ProcessingRequest) -> bool:
        """Whether `handle_async(msg)` could do more than `handle(msg)`: scale from zero
        or flow control is on, or `msg` completes a body large enough for a worker
        thread. False for almost every message, so the servicer calls `handle` without
        a coroutine per message; True only means "take `handle_async`"."""
        director = self.director
        if director.cold_start is not None or director.flow_control is not None:
            return True
        if self.phase is not Phase.GATHER_BODY:
            return False
        kind = msg.WhichOneof("request")
        if kind == "request_body":
            body = msg.request_body
            if not body.end_of_stream:
                return False
            size = self._size + len(body.body)
        elif kind == "request_trailers":
            size = self._size
        else:
            return False
        low = PREPARE_OFF_LOOP_BYTES if director.prepares else PARSE_OFF_LOOP_BYTES
        return size > low

    async def handle_async(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """`handle`, with a large body parsed in a worker thread, and a request that
        finds an empty pool held while it scales from zero (`Director.await_capacity`)."""
        director = self.director
        if (
            director.cold_start is not None  # scale from zero is on
            and self.phase is not Phase.REJECTED
            and self._routes_now(msg)
        ):
            try:
                await director.await_capacity()
            except EppError as e:
                return self._reject(e)
        low = PREPARE_OFF_LOOP_BYTES if self.director.prepares else PARSE_OFF_LOOP_BYTES
        raw = self._final_body(msg, low)
        if raw is not None:
            assert self.request is not None
            director = self.director if self.director.prepares else None
            t0 = time.perf_counter()
            try:
                outcome: _Parsed | Exception
                outcome = await asyncio.to_thread(
                    _parse, self.request, raw, self.body_limits, self.director.rewrites, director
                )
            except Exception as e:  # raised again by _complete, on the usual error path
                outcome = e
            self._preparsed = (raw, outcome)
            if self.trace is not None:
                self.trace.stage("llm_d.epp.parse", t0, time.perf_counter(), off_loop=True)
        flow = self.director.flow_control
        if flow is not None and self.phase is Phase.GATHER_BODY and self._routes_now(msg):
            try:
                await self._wait_in_flow_control(msg, flow)
            except EppError as e:
                return self._reject(e)
            except Exception as e:  # a bug costs this request a 500, as in `handle`
                error = internal_error(f"unexpected {type(e).__name__} in flow control")
                error.__cause__ = e
                return self._reject(error)
        return self.handle(msg)  # synchronous: a request let through is routed before any other

    async def _wait_in_flow_control(self, msg: pb.ProcessingRequest, flow: FlowController) -> None:
        """Parse the completed body (if not yet), then wait for flow control's go-ahead.
        A body that fails to parse or is over the limit does not wait: `handle` refuses it."""
        if self._preparsed is None:
            raw = self._final_body(msg, 0)
            if raw is None:
                return
            assert self.request is not None
            try:
                outcome: _Parsed | Exception
                outcome = _parse(self.request, raw, self.body_limits, self.director.rewrites)
            except Exception as e:
                outcome = e
            self._preparsed = (raw, outcome)
        raw, outcome = self._preparsed
        if isinstance(outcome, Exception):
            return
        if self.trace is None:
            await flow.acquire(outcome[0], len(raw))
            return
        t0, admitted = time.perf_counter(), False
        try:
            await flow.acquire(outcome[0], len(raw))
            admitted = True
        finally:
            self.trace.stage(
                "llm_d.epp.flow_control.wait", t0, time.perf_counter(), admitted=admitted
            )

    def _routes_now(self, msg: pb.ProcessingRequest) -> bool:
        """`msg` completes the request, so handling it routes."""
        kind = msg.WhichOneof("request")
        if kind == "request_headers":
            return self.phase is Phase.AWAIT_HEADERS and msg.request_headers.end_of_stream
        if self.phase is not Phase.GATHER_BODY:
            return False
        return kind == "request_trailers" or (
            kind == "request_body" and msg.request_body.end_of_stream
        )

    def _final_body(self, msg: pb.ProcessingRequest, min_size: int) -> bytes | None:
        """The whole body if `msg` completes one of min_size (exclusive)..max_body_bytes
        (the caller's min_size: PARSE_OFF_LOOP_BYTES, or PREPARE_OFF_LOOP_BYTES when a
        plugin tokenizes, `Director.prepares`; 0 for any body)."""
        if self.phase is not Phase.GATHER_BODY:
            return None
        kind = msg.WhichOneof("request")
        if kind == "request_body" and msg.request_body.end_of_stream:
            parts = [*self._chunks, msg.request_body.body]
        elif kind == "request_trailers":
            parts = self._chunks
        else:
            return None
        size = sum(map(len, parts))
        if not min_size < size <= self.max_body_bytes:
            return None
        return b"".join(parts)

    def body_timed_out(self, seconds: float) -> list[pb.ProcessingResponse]:
        """The client did not finish its body within `seconds`: a 408, and its bytes freed.
        Nothing if the body already ended (the stream is routed or refused)."""
        if self.phase is not Phase.GATHER_BODY and self.phase is not Phase.AWAIT_HEADERS:
            return []
        return self._reject(
            timed_out(
                f"request not complete within {seconds:g}s of the stream's start "
                "(set by epp serve --body-timeout)"
            )
        )

    def body_too_slow(self, min_rate: float, grace: float) -> list[pb.ProcessingResponse]:
        """The body arrives slower than `min_rate` bytes/s on average (after `grace`
        seconds): a 408 long before the body timeout, and its bytes freed."""
        if self.phase is not Phase.GATHER_BODY and self.phase is not Phase.AWAIT_HEADERS:
            return []
        return self._reject(
            EppError(
                408,
                f"request body arrived too slowly ({self._size} bytes so far): the minimum "
                f"is {min_rate:g} bytes/s on average after the first {grace:g}s (set by epp "
                "serve --min-body-rate)",
                "request_body_too_slow",
            )
        )

    def close(self) -> None:
        """The stream ended (normally, by error or by cancellation): give back what we hold."""
        self._drop_body()
        if self.leg is not None and self.phase is not Phase.DONE:
            self._end_response(complete=False)
        if self.trace is not None:
            self.trace.end()  # routed in observer mode, or refused: no-op if it ended

    # ---- response phases --------------------------------------------------
    def _on_response_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        self.phase = Phase.RESPONDING
        if self.leg is None and self._route_id and self.routes is not None:
            # `--response-path log`, but Envoy sends the response here (an in-path config,
            # or a gateway that programs its own ext_proc): measure it here, as `on` does,
            # rather than hold the request until an access-log entry that may never come.
            self.leg = self.routes.take_back(self._route_id)
        if self.trace is not None:
            self.trace.response_started()
        if self.leg is not None:
            self.leg.headers(headers)
        if headers.end_of_stream:
            self._end_response(complete=True)
        return [m.response_headers_passthrough()]

    def _on_response_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self.leg is not None:
            self.leg.body(body.body, end_of_stream=False)
        out = m.response_body_passthrough(body, self.response_body_mode == FULL_DUPLEX)
        if body.end_of_stream:
            self._end_response(complete=True)
        return out

    def _end_response(self, complete: bool) -> None:
        """Exactly once per stream: in-flight given back, the record to the observer."""
        if self.phase is Phase.DONE:
            return
        self.phase = Phase.DONE
        if self.leg is not None:
            self.leg.end(complete)
        if self.running is not None:
            assert self._evictor is not None
            self._evictor.ended(self.running, self.clock())
            self.running = None
        if self.trace is not None:
            status = self.leg.status if self.leg is not None else 0
            self.trace.end(status or None, complete=complete)

    # ---- in-flight eviction ------------------------------------------------
    def _track_for_eviction(self) -> None:
        """A routed sheddable request, with the in-path response (its stream stays open
        until the response ends, so it can be stopped), joins the evictable set."""
        flow = self.director.flow_control
        if flow is None or flow.eviction is None:
            return
        assert self.request is not None
        priority = flow.objectives.priority(self.request)
        if priority >= 0:
            return
        self._evictor = flow.eviction
        self.running = Running(priority, self.routed_at, self.request.request_id, self.evict)
        self._evictor.track(self.running)

    def evict(self) -> bool:
        """Stop this request (the evictor's call, on the loop): the servicer answers its
        stream with `eviction_responses()`, at once if it is waiting for Envoy (its task
        is woken), else before its next wait. False when there is nothing to stop."""
        if self.evicted or self.phase not in (Phase.ROUTED, Phase.RESPONDING):
            return False
        self.evicted = True
        if self.waiter is not None:
            self.waiter.cancel()
        return True

    def eviction_responses(self) -> list[pb.ProcessingResponse]:
        """What tells Envoy, and the client, that the request was evicted: an
        ImmediateResponse 429 with `x-llm-d-request-dropped-reason: evicted-priority`
        (llm-d-router's ImmediateResponseEvictor). Envoy resets the upstream request
        (the model server aborts it); a client whose response has not started gets the
        429; one whose SSE stream has started first gets an error event naming the
        reason, then the reset (a started response cannot change its status)."""
        error = EppError(
            429,
            "the request was evicted to make room for requests of higher priority "
            "(flowControl.enableEviction); retry later",
            "evicted",
            reason=EVICTED_PRIORITY,
        )
        out: list[pb.ProcessingResponse] = []
        meter = self.meter
        if (
            self.phase is Phase.RESPONDING
            and self.response_body_mode == FULL_DUPLEX
            and meter is not None
            and meter.streamed
        ):
            event = b"data: " + error.body() + b"\n\n"
            out += m.streamed_body_responses(event, end_of_stream=False, request=False)
        if self.leg is not None:
            self.leg.status = 429  # the record says who ended it (ok is False: incomplete)
        return [*out, *self._reject(error)]

    def _routed(self) -> dict[str, str]:
        """The request is routed (`self.decision`): its response leg, kept here or parked
        for the observer stream; returns the headers that go with it."""
        assert self.request is not None and self.decision is not None
        self.routed_at = self.clock()
        self.phase = Phase.ROUTED
        leg = ResponseLeg(
            self.director, self.observer, self.clock, self.request, self.decision, self.routed_at
        )
        if self.routes is None:
            self.leg = leg
            if self.director.flow_control is not None:
                self._track_for_eviction()
            return {}
        route_id = self.routes.put(leg)
        if self.routes.claimant == "log":
            self._route_id = route_id
        return {ROUTE_ID: route_id}

    @property
    def body_bytes(self) -> int:
        """Request-body bytes received so far (the servicer's minimum-rate timer)."""
        return self._size

    def _drop_body(self) -> None:
        self._chunks = []
        if self._ticket is not None and self._ticket.held:
            assert self.budget is not None
            self.budget.release(self._ticket)

    # ---- request phases ---------------------------------------------------
    def _on_request_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if self.phase is not Phase.AWAIT_HEADERS:
            raise EppError(400, "request headers received twice on one stream")
        headers, regular, size = m.header_map_counted(msg.request_headers)
        req = new_request(headers, headers.get(":path", "/"), headers.get(":method", "POST"))
        # Set on the upstream request when missing or replaced (invalid: see request.py).
        self._generated_id = req.request_id != headers.get(REQUEST_ID)
        self.request = req  # before the header check, so a 431 is logged with its id
        if self.tracer is not None:
            self.trace = self.tracer.start(headers, {"llm_d.epp.request.id": req.request_id})
        self._check_header_limits(msg.request_headers, headers, regular, size)
        self.subset = m.subset_hint(msg)
        if msg.request_headers.end_of_stream:
            self.decision = self.director.route_bodyless(req, self.subset)
            extra = self._routed()
            return [
                m.headers_response(
                    set_headers=self._routing_headers(None) | extra,
                    remove=self._removals(),
                    clear_route_cache=True,
                    destinations=self.decision.destinations,
                )
            ]
        self.phase = Phase.GATHER_BODY
        if self.budget is not None:
            source, connection = m.client_of(msg, headers)
            declared = headers.get("content-length", "")
            self._ticket = self.budget.ticket(
                source, connection, int(declared) if declared.isdigit() else 0
            )
        if self.request_body_mode == FULL_DUPLEX:
            return []
        # Envoy waits for this answer before it sends the body.
        remove = m.CLIENT_FORBIDDEN_HEADERS
        if m.CLIENT_FORBIDDEN_IF_SENT in headers:
            remove = (*remove, m.CLIENT_FORBIDDEN_IF_SENT)
        return [m.headers_response(set_headers={}, remove=remove)]

    def _check_header_limits(
        self, raw: pb.HttpHeaders, headers: dict[str, str], regular: int, size: int
    ) -> None:
        """431 if the EPP's own headers would push the request over Envoy's limits: the
        destination and x-prefiller-host-port (unless the client sent them: they are
        overwritten), x-request-id when it is generated, content-length when absent,
        x-epp-route-id in observer mode.
        `regular`, `size`: the client's non-pseudo headers and bytes (`header_map_counted`)."""
        added = (
            (DESTINATION_ENDPOINT not in headers)
            + (PREFILLER_HOST_PORT not in headers)
            + (self._generated_id and REQUEST_ID not in headers)
            + ("content-length" not in headers and not raw.end_of_stream)
            + (self.routes is not None and ROUTE_ID not in headers)
            + (self.tracer is not None and "traceparent" not in headers)
        )
        self.header_limits.check(regular, size, added)

    def _on_request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self.phase is not Phase.GATHER_BODY:
            raise EppError(400, "request body received before headers or after routing")
        self._size += len(body.body)
        if self._size > self.max_body_bytes:
            raise too_large(
                f"request body exceeds the limit of {self.max_body_bytes} bytes "
                "(set by epp serve --max-body-bytes)"
            )
        if self.budget is not None:
            self.budget.take(len(body.body), self._ticket)
        self._chunks.append(body.body)
        if not body.end_of_stream:
            return []
        return self._complete(trailers=False)

    def _on_request_trailers(self) -> list[pb.ProcessingResponse]:
        if self.phase is Phase.GATHER_BODY:
            # The body ended without end_of_stream: trailers close the request.
            return [*self._complete(trailers=True), m.request_trailers_response()]
        return [m.request_trailers_response()]

    def _complete(self, trailers: bool) -> list[pb.ProcessingResponse]:
        assert self.request is not None
        n_chunks = len(self._chunks)
        preparsed, self._preparsed = self._preparsed, None
        trace = self.trace
        if preparsed is None:
            raw = b"".join(self._chunks)
            self._drop_body()
            if trace is None:
                req, new_body, state = _parse(
                    self.request, raw, self.body_limits, self.director.rewrites
                )
            else:
                t0 = time.perf_counter()
                req, new_body, state = _parse(
                    self.request, raw, self.body_limits, self.director.rewrites
                )
                trace.stage("llm_d.epp.parse", t0, time.perf_counter(), bytes=len(raw))
        else:
            raw, outcome = preparsed
            self._drop_body()
            if isinstance(outcome, Exception):
                raise outcome
            req, new_body, state = outcome
        if trace is None:
            self.decision = self.director.route(req, self.subset, state)
        else:
            with trace.routing():
                self.decision = self.director.route(req, self.subset, state)
            trace.span.set_attribute("gen_ai.request.model", req.model)
            trace.span.set_attribute("llm_d.epp.target_endpoint", self.decision.destinations[0])
        extra = self._routed()
        body = new_body if new_body is not None else raw
        set_headers, removals = self._routing_headers(body) | extra, self._removals()
        mode = self.request_body_mode
        if mode == FULL_DUPLEX:
            return [
                m.headers_response(
                    set_headers=set_headers,
                    remove=removals,
                    clear_route_cache=True,
                    destinations=self.decision.destinations,
                ),
                *m.streamed_body_responses(body, end_of_stream=not trailers),
            ]
        mutation = m.header_mutation(set_headers, removals)
        metadata = m.destination_metadata(self.decision.destinations)
        first = m.buffered_body_response(mutation, new_body, True, metadata)
        if mode == STREAMED and n_chunks > 1:
            # One answer per chunk; when the body changed, the first carries all of it.
            rest = []
            for _ in range(n_chunks - 1):
                r = m.empty_request_body_response()
                if new_body is not None:
                    r.request_body.response.body_mutation.clear_body = True
                rest.append(r)
            return [first, *rest]
        return [first]

    # ---- helpers ----------------------------------------------------------
    def _routing_headers(self, body: bytes | None) -> dict[str, str]:
        assert self.decision is not None and self.request is not None
        out = {DESTINATION_ENDPOINT: self.decision.destinations[0]}
        out.update(self.decision.headers)
        if self._generated_id:
            out[REQUEST_ID] = self.request.request_id
        if body is not None:
            out["content-length"] = str(len(body))
        if self.trace is not None:
            out.update(self.trace.headers())
        return out

    def _removals(self) -> list[str]:
        assert self.decision is not None
        # The destination header is overwritten by the set, so only the others go.
        out = [
            h
            for h in m.CLIENT_FORBIDDEN_HEADERS
            if h != DESTINATION_ENDPOINT and h not in self.decision.headers
        ]
        sent = m.CLIENT_FORBIDDEN_IF_SENT
        if sent in self.request.headers and sent not in self.decision.headers:  # type: ignore[union-attr]
            out.append(sent)
        return out

    def _reject(self, error: EppError) -> list[pb.ProcessingResponse]:
        if self.request is not None and is_anthropic_path(self.request.path):
            error.anthropic = True  # a Messages client reads Anthropic's error shape
        self.phase = Phase.REJECTED
        self._drop_body()
        if self.trace is not None:
            self.trace.end(error.status, **{"llm_d.epp.refusal": error.code or str(error.status)})
        self.refusals.record(self.request.request_id if self.request else "-", error)
        REQUESTS_REFUSED.labels(error.dropped_reason or error.code or str(error.status)).inc()
        return [m.immediate_response(error)]


# (the parsed request, the body to forward if the model changed, its prepared cycle state)
_Parsed = tuple[InferenceRequest, bytes | None, CycleState | None]


def _parse(
    request: InferenceRequest,
    raw: bytes,
    limits: BodyLimits,
    rewrites: ModelRewrites | None,
    director: Director | None = None,
) -> _Parsed:
    """The request parsed from `raw` (its target model after an InferenceModelRewrite, if
    one matches), the body to forward if the model changes, and with `director`, its
    request-only scheduling work done (`Director.prepare`)."""
    req = parse_body(request, raw, limits)
    if rewrites is not None:
        target = rewrites.target(req.model, req.request_id)
        if target is not None:
            req.target_model = target
    state = director.prepare(req) if director is not None else None
    return req, req.body_for_upstream(), state
