"""One observability-mode ext_proc stream (`epp serve --response-path observer`).

Envoy's second ext_proc filter (deploy/envoy/envoy-observer.yaml, `observability_mode:
true`) sends and does not wait: it forwards every response chunk to the client at once
and ignores whatever the processor answers, so this stream answers nothing. What Envoy
1.40 sends on it (verified with the binary, see the filter's comments):

- a routed request: `request_headers` (as the routing filter left them, so with
  `x-epp-route-id`), `response_headers`, each `response_body` chunk as it passes, then
  an empty `response_body` with end_of_stream (or `response_trailers`); every message has
  `observability_mode` true;
- a local reply of the routing filter (the EPP's own 4xx/5xx): no `request_headers`,
  only the response; nothing to join, ignored;
- a client gone or an upstream reset mid-response: the messages so far, no end_of_stream;
- in every case the gRPC stream is half-closed `deferred_close_timeout` (5 s) after the
  HTTP stream ended: `close()` then ends a response that did not end (complete=False).

The request's `ResponseLeg` is claimed from the `RouteTable` by the route id; from then on
this stream does what the in-path stream does with the response (`ResponseLeg`). Once
there is nothing (more) to observe, `handle` says so and the servicer ends the gRPC
stream: ext_proc.proto lets an observability-mode processor close the stream "to indicate
that no more messages are needed", which spares Envoy sending the rest and holding the
stream for the deferred close.
"""

from __future__ import annotations

import logging

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.extproc import messages as m
from epp.extproc.handoff import RouteTable
from epp.extproc.response_leg import ResponseLeg
from epp.headers import ROUTE_ID

log = logging.getLogger("epp.extproc")


class ObserverStream:
    def __init__(self, routes: RouteTable) -> None:
        self.routes = routes
        self.leg: ResponseLeg | None = None
        self.joined = False  # request headers seen (claimed or not)

    def handle(self, msg: pb.ProcessingRequest) -> bool:
        """Take one message; False once nothing more is wanted on this stream."""
        kind = msg.WhichOneof("request")
        if kind == "request_headers" and not self.joined:
            self.joined = True
            route_id = m.header_map(msg.request_headers).get(ROUTE_ID)
            self.leg = self.routes.claim(route_id)
            return self.leg is not None
        leg = self.leg
        if leg is None or leg.done:
            return False  # not ours to measure (local reply, another replica's, expired)
        if kind == "response_headers":
            leg.headers(msg.response_headers)
        elif kind == "response_body":
            leg.body(msg.response_body.body, msg.response_body.end_of_stream)
        elif kind == "response_trailers":
            leg.end(complete=True)
        return not leg.done

    def close(self) -> None:
        """The stream ended: a response that did not end is given back, incomplete."""
        if self.leg is not None:
            self.leg.end(complete=False)
