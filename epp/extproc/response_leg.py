"""One routed request's response, measured and accounted: what both response paths share.

The in-path stream (`RequestStream`, Envoy waits for every response chunk to come back)
and the observer stream (`ObserverStream`, Envoy's `observability_mode`: it sends and
does not wait) see the same response phases; this class is what they do with them. The
`ResponseMeter` notes the first token (the prompt stops counting as in-flight prefill,
`Director.first_token`); the end (last body chunk, trailers, headers with end_of_stream,
or the stream ending first) gives the in-flight counts back (`Director.release`, exactly
once) and hands the request's record to the observer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.completion import ResponseObserver, build_record
from epp.director import Director, RoutingDecision
from epp.extproc import messages as m
from epp.request import InferenceRequest
from epp.response import ResponseMeter

log = logging.getLogger("epp.extproc")


class ResponseLeg:
    """`observer` None (`--response-path off`): nothing is measured, the end still
    releases the hold."""

    __slots__ = (
        "clock",
        "decision",
        "director",
        "done",
        "meter",
        "observer",
        "request",
        "routed_at",
        "status",
    )

    def __init__(
        self,
        director: Director,
        observer: ResponseObserver | None,
        clock: Callable[[], float],
        request: InferenceRequest,
        decision: RoutingDecision,
        routed_at: float,
    ) -> None:
        self.director = director
        self.observer = observer
        self.clock = clock
        self.request = request
        self.decision = decision
        self.routed_at = routed_at
        self.status = 0
        self.meter: ResponseMeter | None = None
        self.done = False

    def headers(self, headers: pb.HttpHeaders) -> None:
        if self.observer is not None:
            h = m.header_map(headers)
            status = h.get(":status", "")
            self.status = int(status) if status.isdigit() else 0
            streamed = h.get("content-type", "").startswith("text/event-stream")
            self.meter = ResponseMeter(streamed)
        if headers.end_of_stream:
            self.end(complete=True)

    def body(self, chunk: bytes, end_of_stream: bool) -> None:
        meter = self.meter
        if meter is not None and not self.done:
            try:
                if meter.feed(chunk, self.clock()):
                    self.director.first_token(self.decision)
            except Exception:
                self._measurement_failed()
        if end_of_stream:
            self.end(complete=True)

    def end(self, complete: bool) -> None:
        """Exactly once: in-flight given back, the record to the observer. `complete`
        False: the stream ended before the response did (client gone, upstream reset)."""
        if self.done:
            return
        now = self.clock()
        try:
            if self.meter is not None and self.meter.finish(now):
                self.director.first_token(self.decision)
        except Exception:
            self._measurement_failed()
        self._finish(complete, now)

    def end_logged(
        self, meter: ResponseMeter, status: int, complete: bool, ended_at: float
    ) -> None:
        """Exactly once, from Envoy's access-log entry (epp/extproc/access_log.py): the
        response as `meter` holds it, measured by Envoy, ended at `ended_at`."""
        if self.done:
            return
        if self.observer is not None:
            self.meter, self.status = meter, status
        if meter.first_token_at is not None:
            self.director.first_token(self.decision)
        self._finish(complete, ended_at)

    def _finish(self, complete: bool, now: float) -> None:
        self.done = True
        decision, request = self.decision, self.request
        self.director.release(decision)
        if self.observer is None or decision.result is None:
            return
        # No meter on a complete response = its measurement failed: no record.
        if self.meter is not None or not complete:
            record = build_record(
                request, decision, self.meter, self.status, self.routed_at, now, complete
            )
            self.observer.finished(request, decision, record)

    def _measurement_failed(self) -> None:
        """A bug in measuring must not cost the response: the rest passes through
        unmeasured and no record is made (a half-measured one would mislead)."""
        rid = self.request.request_id
        log.exception("measuring the response of request %s failed; passing it through", rid)
        self.meter = None
