"""Eviction on one ext_proc stream, with exact protobufs: which requests are tracked, what
Envoy is sent (a 429 with the reason, after an SSE error event once a stream started),
and that the in-flight counts and the request's record come out exactly once."""

import json
import time

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.admission import Objectives
from epp.completion import ResponseObserver
from epp.extproc.stream import Phase, RequestStream
from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.eviction import Evictor
from epp.headers import OBJECTIVE, REQUEST_ID
from tests.helpers import plugin
from tests.unit.test_stream import MODES, body_msg, headers_msg, make_director

BODY = json.dumps({"model": "m", "prompt": "hello there", "stream": True}).encode()
OBJECTIVES = Objectives({"batch": -1, "critical": 100})


def setup():
    director, ds = make_director(n=1)
    flow = FlowController(
        FlowControlConfig(enable_eviction=True),
        plugin("concurrency-detector", {"maxConcurrency": 1}),
        ds,
        OBJECTIVES,
    )
    flow.eviction = Evictor()
    director.flow_control = flow
    records: list = []
    observer = ResponseObserver(sinks=[records.append])
    return director, ds, flow.eviction, observer, records


def routed(director, observer, objective: str, rid: str) -> RequestStream:
    s = RequestStream(director, 1 << 20, observer)
    hdrs = {":path": "/v1/completions", ":method": "POST", REQUEST_ID: rid, OBJECTIVE: objective}
    first = headers_msg(hdrs)
    # As Envoy's config sends it: the response body streamed through the EPP.
    first.protocol_config.response_body_mode = MODES.FULL_DUPLEX_STREAMED
    s.handle(first)
    s.handle(body_msg(BODY, True))
    assert s.phase is Phase.ROUTED
    return s


def response_headers() -> pb.ProcessingRequest:
    hdrs = [
        base_pb2.HeaderValue(key=":status", raw_value=b"200"),
        base_pb2.HeaderValue(key="content-type", raw_value=b"text/event-stream"),
    ]
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hdrs))
    )


def header_dict(resp: pb.ProcessingResponse) -> dict[str, str]:
    hs = resp.immediate_response.headers.set_headers
    return {h.header.key: h.header.raw_value.decode() for h in hs}


def test_only_sheddable_requests_are_tracked():
    director, _, ev, observer, _ = setup()
    critical = routed(director, observer, "critical", "c-1")
    batch = routed(director, observer, "batch", "b-1")
    assert ev.evictable == 1 and [r.request_id for r in ev.victims(100)] == ["b-1"]
    assert critical.evict is not None  # any stream can be asked; only tracked ones are
    batch.close()
    critical.close()
    assert ev.evictable == 0


def test_evicted_before_its_response_a_429_with_the_reason_and_one_release():
    director, ds, ev, observer, records = setup()
    s = routed(director, observer, "batch", "b-1")
    assert ds.snapshot()[0].inflight_requests == 1
    [victim] = ev.reclaim(1.0, 1.0, 100, 1, now=time.monotonic())  # the streams' clock
    assert victim.request_id == "b-1" and s.evicted
    assert s.evict() is False  # once
    [resp] = s.eviction_responses()
    assert resp.immediate_response.status.code == 429
    assert header_dict(resp)["x-llm-d-request-dropped-reason"] == "evicted-priority"
    assert json.loads(resp.immediate_response.body)["error"]["code"] == "evicted"
    s.close()
    s.close()
    assert ds.snapshot()[0].inflight_requests == 0
    [rec] = records
    assert rec.ok is False and rec.status == 429
    assert not ev.gate_open(time.monotonic())  # confirmed by the stream's end: cooling
    assert ev.gate_open(time.monotonic() + 1.0)  # ... for the grace


def test_evicted_mid_stream_an_sse_error_event_then_the_429():
    director, ds, _, observer, records = setup()
    s = routed(director, observer, "batch", "b-2")
    s.handle(response_headers())
    first = b'data: {"choices":[{"text":"a"}]}\n\n'
    s.handle(pb.ProcessingRequest(response_body=pb.HttpBody(body=first)))
    assert s.phase is Phase.RESPONDING
    assert s.evict()
    event, reset = s.eviction_responses()
    streamed = event.response_body.response.body_mutation.streamed_response
    assert streamed.body.startswith(b'data: {"error"') and b'"evicted"' in streamed.body
    assert not streamed.end_of_stream
    assert reset.immediate_response.status.code == 429
    s.close()
    assert ds.snapshot()[0].inflight_requests == 0
    assert [r.ok for r in records] == [False]


def test_a_finished_request_cannot_be_evicted():
    director, _, ev, observer, records = setup()
    s = routed(director, observer, "batch", "b-3")
    s.handle(response_headers())
    s.handle(
        pb.ProcessingRequest(
            response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True)
        )
    )
    assert s.phase is Phase.DONE and ev.evictable == 0
    assert s.evict() is False
    assert [r.ok for r in records] == [True]
