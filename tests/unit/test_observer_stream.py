"""The observer response path (`--response-path observer`) on exact protobufs: the routing
stream tags the request with `x-epp-route-id` and parks its response leg; the observer
stream (Envoy's observability-mode filter) claims it by that id and measures and releases
exactly as the in-path stream does; nothing leaks whatever way either stream ends, and
an unclaimed leg is given back by the sweep after the join timeout."""

import math
import random

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.completion import ResponseObserver
from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc import messages as m
from epp.extproc.handoff import JOIN_TIMEOUT, RouteTable
from epp.extproc.observer import ObserverStream
from epp.extproc.stream import Phase, RequestStream
from epp.headers import (
    DATA_PARALLEL_RANK,
    DESTINATION_ENDPOINT,
    PREFILLER_HOST_PORT,
    REQUEST_ID,
    ROUTE_ID,
)
from epp.scheduling.registry import Handle
from tests.unit.test_stream import BASE_HEADERS, body_msg, headers_msg
from tests.unit.test_stream_response import (
    BODY,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    USAGE,
    Clock,
    event,
    response_body,
    response_headers,
    token,
)


def setup(join_timeout=JOIN_TIMEOUT):
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("e0", "10.0.0.1", 8000)])
    ds.set_models("e0", ["m"])
    cfg = load_default_config(Handle(rng=random.Random(0)))
    director = Director(ds, cfg.scheduler, cfg.pre_request, random.Random(0))
    records = []
    observer = ResponseObserver([], [records.append])
    clock = Clock()
    routes = RouteTable(join_timeout, clock)
    return ds, director, observer, clock, routes, records


def route(director, observer, clock, routes, headers=BASE_HEADERS):
    """The routing stream through routing; returns it and its answer."""
    s = RequestStream(director, 1 << 20, observer, clock, routes=routes)
    assert s.handle(headers_msg(headers)) == []
    return s, s.handle(body_msg(BODY, True))


def observed(msg: pb.ProcessingRequest) -> pb.ProcessingRequest:
    msg.observability_mode = True  # every message Envoy's observer filter sends has it
    return msg


def request_headers_with(route_id: str | None) -> pb.ProcessingRequest:
    hdrs = {**BASE_HEADERS, DESTINATION_ENDPOINT: "10.0.0.1:8000"}
    if route_id is not None:
        hdrs[ROUTE_ID] = route_id
    return observed(
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(
                headers=base_pb2.HeaderMap(
                    headers=[
                        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs.items()
                    ]
                )
            )
        )
    )


def test_routing_sets_the_route_id_and_parks_the_hold_until_the_observer_ends_it():
    ds, director, observer, clock, routes, records = setup()
    s, out = route(director, observer, clock, routes)
    route_id = f"{routes.nonce}.1"  # the first id this table gives
    assert out[0] == m.headers_response(
        m.header_mutation(
            {
                DESTINATION_ENDPOINT: "10.0.0.1:8000",
                "content-length": str(len(BODY)),
                ROUTE_ID: route_id,
            },
            [PREFILLER_HOST_PORT, DATA_PARALLEL_RANK],
        ),
        clear_route_cache=True,
        metadata=m.destination_metadata(["10.0.0.1:8000"]),
    )
    s.close()  # Envoy closes the routing stream: the response comes on the other one
    assert s.phase is Phase.ROUTED and len(routes) == 1  # it never sees the response
    assert ds.inflight("e0") == (1, PROMPT_TOKENS + OUTPUT_TOKENS) and records == []

    obs = ObserverStream(routes)
    assert obs.handle(request_headers_with(route_id)) is True  # ours: more wanted
    assert len(routes) == 0 and routes.claimed == 1
    assert obs.handle(observed(response_headers())) is True
    clock.now = 100.25
    obs.handle(observed(response_body(token("a"), False)))
    assert ds.inflight("e0") == (1, OUTPUT_TOKENS)  # first token: prefill no longer pending
    clock.now = 100.45
    last = token("b") + token("c") + event({"choices": [], "usage": USAGE}) + event(b"[DONE]")
    obs.handle(observed(response_body(last, False)))
    # Envoy's STREAMED observer ends with an empty chunk carrying end_of_stream.
    clock.now = 100.5
    # ended: nothing more wanted, the servicer closes the stream
    assert obs.handle(observed(response_body(b"", True))) is False
    assert ds.inflight("e0") == (0, 0)
    (rec,) = records
    # TTFT 100.25 − 100 = 250 ms; ITL (100.45 − 100.25) / (3 − 1) tokens = 100 ms.
    assert math.isclose(rec.ttft_ms, 250.0) and math.isclose(rec.itl_ms, 100.0)
    assert (rec.isl, rec.osl, rec.cached_tokens, rec.ok, rec.status) == (90, 3, 64, True, 200)
    obs.close()  # Envoy half-closes 5 s later (deferred close): nothing twice
    assert ds.inflight("e0") == (0, 0) and len(records) == 1


def test_observer_stream_may_come_before_the_routing_stream_closes():
    ds, director, observer, clock, routes, records = setup()
    s, _ = route(director, observer, clock, routes)
    obs = ObserverStream(routes)
    obs.handle(request_headers_with(f"{routes.nonce}.1"))
    obs.handle(observed(response_headers(status="204", eos=True)))
    assert ds.inflight("e0") == (0, 0) and records[0].status == 204
    s.close()  # after the observer ended it: nothing given back twice
    assert ds.inflight("e0") == (0, 0) and len(records) == 1


def test_observer_closed_mid_response_releases_once_as_incomplete():
    ds, director, observer, clock, routes, records = setup()
    route(director, observer, clock, routes)[0].close()
    obs = ObserverStream(routes)
    obs.handle(request_headers_with(f"{routes.nonce}.1"))
    obs.handle(observed(response_headers()))
    clock.now = 100.5
    obs.handle(observed(response_body(token("a"), False)))
    # client gone / upstream reset: no end_of_stream, Envoy half-closes after the
    # deferred close timeout
    clock.now = 105.5
    obs.close()
    obs.close()
    assert ds.inflight("e0") == (0, 0)
    (rec,) = records
    assert (rec.ok, rec.status, rec.osl) == (False, 200, 1) and math.isclose(rec.ttft_ms, 500.0)


def test_trailers_end_the_observed_response():
    ds, director, observer, clock, routes, records = setup()
    route(director, observer, clock, routes)
    obs = ObserverStream(routes)
    obs.handle(request_headers_with(f"{routes.nonce}.1"))
    obs.handle(observed(response_headers()))
    obs.handle(observed(response_body(token("a"), False)))
    obs.handle(observed(pb.ProcessingRequest(response_trailers=pb.HttpTrailers())))
    assert ds.inflight("e0") == (0, 0) and records[0].ok


def test_a_local_reply_with_no_request_headers_is_ignored():
    ds, director, observer, clock, routes, records = setup()
    route(director, observer, clock, routes)
    obs = ObserverStream(routes)  # the EPP's own 400 for another request: response only
    local_reply = observed(response_headers(status="400", ctype="application/json"))
    assert obs.handle(local_reply) is False  # nothing to observe: closed at once
    obs.handle(observed(response_body(b'{"error": {}}', True)))
    obs.close()
    assert len(routes) == 1 and ds.inflight("e0")[0] == 1 and records == []


@pytest.mark.parametrize(
    ("route_id", "foreign", "unknown"),
    [("0123456789ab.1", 1, 0), (None, 0, 1), ("<nonce>.99", 0, 1)],
)
def test_an_id_that_is_not_a_parked_one_claims_nothing(route_id, foreign, unknown):
    ds, director, observer, clock, routes, records = setup()
    route(director, observer, clock, routes)
    if route_id is not None:
        route_id = route_id.replace("<nonce>", routes.nonce)
    obs = ObserverStream(routes)
    assert obs.handle(request_headers_with(route_id)) is False
    obs.handle(observed(response_headers()))
    obs.handle(observed(response_body(token("a"), True)))
    obs.close()
    # Another replica's id (another nonce), no id, an id of ours never given: the parked
    # request stays parked for its own observer or the sweep.
    assert (routes.foreign, routes.unknown) == (foreign, unknown)
    assert len(routes) == 1 and ds.inflight("e0")[0] == 1 and records == []


def test_a_client_cannot_claim_by_sending_a_route_id():
    _, director, observer, clock, routes, _ = setup()
    forged = {**BASE_HEADERS, ROUTE_ID: "forged"}
    _, out = route(director, observer, clock, routes, forged)
    mutation = out[0].request_headers.response.header_mutation
    sent = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert sent[ROUTE_ID] == f"{routes.nonce}.1"  # overwritten by the EPP's own


def test_the_sweep_gives_back_what_no_observer_claimed_after_the_join_timeout():
    ds, director, observer, clock, routes, records = setup(join_timeout=10.0)
    route(director, observer, clock, routes)[0].close()  # parked at t=100
    clock.now = 104.0
    route(director, observer, clock, routes, {**BASE_HEADERS, REQUEST_ID: "rid-8"})  # t=104
    assert ds.inflight("e0")[0] == 2
    clock.now = 109.9
    assert routes.sweep() == 110.0  # nothing old enough; the first expires at 100 + 10
    assert ds.inflight("e0")[0] == 2
    clock.now = 110.0
    assert routes.sweep() == 114.0  # the first given back; the second expires at 104 + 10
    assert ds.inflight("e0")[0] == 1 and routes.expired == 1
    (rec,) = records
    assert (rec.ok, rec.status, rec.finished_at) == (False, 0, 110.0)  # ended by the sweep
    clock.now = 114.0
    assert routes.sweep() is None
    assert ds.inflight("e0") == (0, 0) and len(routes) == 0
    obs = ObserverStream(routes)  # an observer arriving after the sweep: nothing twice
    obs.handle(request_headers_with(f"{routes.nonce}.1"))
    obs.handle(observed(response_body(b"", True)))
    assert ds.inflight("e0") == (0, 0) and routes.unknown == 1 and len(records) == 2


def test_a_bodyless_request_is_parked_too():
    ds, director, observer, clock, routes, _ = setup()
    s = RequestStream(director, 1 << 20, observer, clock, routes=routes)
    get = {":path": "/v1/models", ":method": "GET", REQUEST_ID: "rid-9"}
    (out,) = s.handle(headers_msg(get, eos=True))
    mutation = out.request_headers.response.header_mutation
    assert {h.header.key for h in mutation.set_headers} >= {DESTINATION_ENDPOINT, ROUTE_ID}
    s.close()
    assert len(routes) == 1 and ds.inflight("e0")[0] == 1


def test_a_join_timeout_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="join_timeout must be > 0"):
        RouteTable(0.0)
