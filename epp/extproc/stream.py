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

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.completion import ResponseObserver
from epp.director import Director, RoutingDecision
from epp.errors import EppError, internal_error, timed_out, too_large
from epp.extproc import messages as m
from epp.extproc.handoff import RouteTable
from epp.extproc.refusals import RefusalLog
from epp.extproc.response_leg import ResponseLeg
from epp.flowcontrol.controller import FlowController
from epp.headers import DESTINATION_ENDPOINT, PREFILLER_HOST_PORT, REQUEST_ID, ROUTE_ID
from epp.limits import BodyBudget, BodyLimits, HeaderLimits
from epp.request import (
    DEFAULT_BODY_LIMITS,
    InferenceRequest,
    is_anthropic_path,
    new_request,
    parse_body,
)
from epp.response import ResponseMeter
from epp.scheduling.types import CycleState

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
# of CPU per token (docs/BENCHMARKS.md "Chat rendering and tokenizing"): a 16 KiB prompt
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
    ) -> None:
        self.director = director
        self.max_body_bytes = max_body_bytes
        self.observer = observer
        self.clock = clock
        self.refusals = refusals
        self.body_limits = body_limits
        self.header_limits = header_limits or HeaderLimits()
        # Bytes of this stream's body reserved in the server-wide budget (epp/limits.py).
        self.budget = budget
        self._budgeted = 0
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
        # (raw body, parse outcome) when handle_async parsed the body in a worker thread
        self._preparsed: tuple[bytes, _Parsed | Exception] | None = None

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
        a coroutine per message (issue 13 §6); True only means "take `handle_async`"."""
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
            try:
                outcome: _Parsed | Exception
                outcome = await asyncio.to_thread(
                    _parse, self.request, raw, self.body_limits, director
                )
            except Exception as e:  # raised again by _complete, on the usual error path
                outcome = e
            self._preparsed = (raw, outcome)
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
                outcome = _parse(self.request, raw, self.body_limits)
            except Exception as e:
                outcome = e
            self._preparsed = (raw, outcome)
        raw, outcome = self._preparsed
        if isinstance(outcome, Exception):
            return
        await flow.acquire(outcome[0], len(raw))

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

    def close(self) -> None:
        """The stream ended (normally, by error or by cancellation): give back what we hold."""
        self._drop_body()
        if self.leg is not None and self.phase is not Phase.DONE:
            self._end_response(complete=False)

    # ---- response phases --------------------------------------------------
    def _on_response_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        self.phase = Phase.RESPONDING
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
            return {}
        return {ROUTE_ID: self.routes.put(leg)}

    def _drop_body(self) -> None:
        self._chunks = []
        if self.budget is not None and self._budgeted:
            self.budget.give_back(self._budgeted)
        self._budgeted = 0

    # ---- request phases ---------------------------------------------------
    def _on_request_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if self.phase is not Phase.AWAIT_HEADERS:
            raise EppError(400, "request headers received twice on one stream")
        headers, regular, size = m.header_map_counted(msg.request_headers)
        req = new_request(headers, headers.get(":path", "/"), headers.get(":method", "POST"))
        # Set on the upstream request when missing or replaced (invalid: see request.py).
        self._generated_id = req.request_id != headers.get(REQUEST_ID)
        self.request = req  # before the header check, so a 431 is logged with its id
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
            self.budget.take(len(body.body))
            self._budgeted += len(body.body)
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
        if preparsed is None:
            raw = b"".join(self._chunks)
            self._drop_body()
            req, new_body, state = _parse(self.request, raw, self.body_limits)
        else:
            raw, outcome = preparsed
            self._drop_body()
            if isinstance(outcome, Exception):
                raise outcome
            req, new_body, state = outcome
        self.decision = self.director.route(req, self.subset, state)
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
        self.refusals.record(self.request.request_id if self.request else "-", error)
        return [m.immediate_response(error)]


# (the parsed request, the body to forward if the model changed, its prepared cycle state)
_Parsed = tuple[InferenceRequest, bytes | None, CycleState | None]


def _parse(
    request: InferenceRequest,
    raw: bytes,
    limits: BodyLimits,
    director: Director | None = None,
) -> _Parsed:
    """The request parsed from `raw`, the body to forward if the model changes, and with
    `director`, its request-only scheduling work done (`Director.prepare`)."""
    req = parse_body(request, raw, limits)
    state = director.prepare(req) if director is not None else None
    return req, req.body_for_upstream(), state
