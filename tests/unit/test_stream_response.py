"""The response phases of the ext_proc state machine, on exact protobufs: every chunk
passes through unchanged, in-flight counts follow the response (prompt until the first
token, the request until the end, exactly once), and each routed request yields one
record for the observer and the PostResponse plugins."""

import json
import math
import random

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.completion import ResponseObserver
from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint
from epp.director import Director
from epp.extproc.stream import Phase, RequestStream
from epp.planner.core.types import Role
from epp.scheduling.registry import Handle
from tests.unit.test_stream import BASE_HEADERS, MODES, body_msg, headers_msg

# "x" * 400 → 400 chars / 4 = 100 prompt tokens (the estimate); max_tokens 30 → 30 output.
PROMPT_TOKENS, OUTPUT_TOKENS = 100, 30
BODY = json.dumps({"model": "m", "prompt": "x" * 400, "max_tokens": 30, "stream": True}).encode()
USAGE = {
    "prompt_tokens": 90,
    "completion_tokens": 3,
    "prompt_tokens_details": {"cached_tokens": 64},
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Plugin:
    name, type_name = "spy", "spy"

    def __init__(self) -> None:
        self.calls = []

    def post_response(self, request, response, endpoint):
        self.calls.append((request.request_id, response, endpoint.name))


def setup(observer=True):
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint("e0", "10.0.0.1", 8000, {"llm-d.ai/role": "decode"})])
    ds.set_models("e0", ["m"])  # served, so "m" is its own metric label (not "other")
    cfg = load_default_config(Handle(rng=random.Random(0)))
    director = Director(ds, cfg.scheduler, cfg.pre_request, random.Random(0))
    records, plugin = [], Plugin()
    obs = ResponseObserver([plugin], [records.append]) if observer else None
    clock = Clock()
    s = RequestStream(director, 1 << 20, obs, clock)
    first = headers_msg(BASE_HEADERS)  # Envoy's protocol_config, as deploy/envoy/envoy.yaml sets it
    first.protocol_config.response_body_mode = MODES.FULL_DUPLEX_STREAMED
    s.handle(first)
    s.handle(body_msg(BODY, True))  # routed at t=100
    return s, ds, clock, records, plugin


def response_headers(status="200", ctype="text/event-stream", eos=False):
    hdrs = {":status": status, "content-type": ctype}
    return pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs.items()]
            ),
            end_of_stream=eos,
        )
    )


def response_body(data: bytes, eos: bool):
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


def passthrough(data: bytes, eos: bool):
    return pb.ProcessingResponse(
        response_body=pb.BodyResponse(
            response=pb.CommonResponse(
                body_mutation=pb.BodyMutation(
                    streamed_response=pb.StreamedBodyResponse(body=data, end_of_stream=eos)
                )
            )
        )
    )


def event(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def token(text):
    return event({"choices": [{"index": 0, "text": text}]})


def test_streamed_response_passes_through_chunk_by_chunk_and_accounts_per_phase():
    s, ds, clock, records, plugin = setup()
    assert ds.inflight("e0") == (1, PROMPT_TOKENS + OUTPUT_TOKENS)
    assert s.handle(response_headers()) == [
        pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    ]
    assert s.phase is Phase.RESPONDING
    clock.now = 100.25
    first = token("a")
    assert s.handle(response_body(first, False)) == [passthrough(first, False)]
    # First token: the prompt is no longer pending prefill; the request and output remain.
    assert ds.inflight("e0") == (1, OUTPUT_TOKENS)
    assert ds.snapshot()[0].inflight_prefill_tokens == 0
    clock.now = 100.35
    assert s.handle(response_body(token("b"), False)) == [passthrough(token("b"), False)]
    clock.now = 100.45
    last = token("c") + event({"choices": [], "usage": USAGE}) + event(b"[DONE]")
    assert s.handle(response_body(last, True)) == [passthrough(last, True)]
    assert ds.inflight("e0") == (0, 0) and s.phase is Phase.DONE
    (rec,) = records
    # TTFT 100.25 − 100 = 250 ms; ITL (100.45 − 100.25) / (3 − 1) tokens = 100 ms.
    assert math.isclose(rec.ttft_ms, 250.0) and math.isclose(rec.itl_ms, 100.0)
    assert math.isclose(rec.duration_s, 0.45)
    assert (rec.isl, rec.osl, rec.cached_tokens) == (90, 3, 64)  # from usage, not estimates
    assert (rec.ok, rec.status, rec.endpoint, rec.role) == (True, 200, "e0", Role.DECODE)
    assert rec.finished_at == 100.45
    assert plugin.calls == [("rid-7", rec, "e0")]
    s.close()  # the stream ends afterwards: nothing is given back or reported twice
    assert ds.inflight("e0") == (0, 0) and len(records) == 1


def test_trailers_end_the_response():
    s, ds, _, records, _ = setup()
    s.handle(response_headers())
    s.handle(response_body(token("a"), False))
    assert ds.inflight("e0")[0] == 1
    out = s.handle(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    assert out == [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
    assert ds.inflight("e0") == (0, 0) and len(records) == 1 and records[0].ok


def test_stream_closed_mid_response_releases_once_and_reports_a_failure():
    s, ds, clock, records, _ = setup()
    s.handle(response_headers())
    clock.now = 100.5
    s.handle(response_body(token("a"), False))
    clock.now = 101.0
    s.close()  # client disconnect or upstream reset: Envoy resets the stream
    s.close()
    assert ds.inflight("e0") == (0, 0)
    (rec,) = records
    assert rec.ok is False and rec.status == 200 and math.isclose(rec.ttft_ms, 500.0)
    assert rec.osl == 1 and math.isnan(rec.itl_ms)  # one token: no gap


def test_stream_closed_before_any_response_reports_status_0():
    s, ds, _, records, _ = setup()
    s.close()
    assert ds.inflight("e0") == (0, 0)
    (rec,) = records
    assert (rec.ok, rec.status, rec.osl) == (False, 0, 0) and math.isnan(rec.ttft_ms)


def test_upstream_error_status_with_body_is_a_failed_record():
    s, ds, _, records, _ = setup()
    s.handle(response_headers(status="503", ctype="application/json"))
    body = json.dumps({"error": {"message": "overloaded", "code": 503}}).encode()
    assert s.handle(response_body(body, True)) == [passthrough(body, True)]
    assert ds.inflight("e0") == (0, 0)
    assert (records[0].ok, records[0].status) == (False, 503)


def test_headers_only_response_ends_at_the_headers():
    s, ds, _, records, _ = setup()
    s.handle(response_headers(status="204", eos=True))
    assert ds.inflight("e0") == (0, 0) and records[0].status == 204


def test_non_streamed_json_ttft_is_the_end_of_the_body_and_usage_is_read():
    s, ds, clock, records, _ = setup()
    s.handle(response_headers(ctype="application/json"))
    body = json.dumps({"choices": [{"text": "abc"}], "usage": USAGE}).encode()
    clock.now = 100.5
    s.handle(response_body(body[:20], False))
    assert ds.inflight("e0") == (1, PROMPT_TOKENS + OUTPUT_TOKENS)  # nothing reached the client
    clock.now = 101.0
    s.handle(response_body(body[20:], True))
    (rec,) = records
    assert math.isclose(rec.ttft_ms, 1000.0) and math.isnan(rec.itl_ms)
    assert (rec.isl, rec.osl, rec.cached_tokens, rec.ok) == (90, 3, 64, True)


def test_failing_sink_and_plugin_never_reach_the_request():
    s, ds, _, records, plugin = setup()

    def broken(_):
        raise RuntimeError("sink bug")

    s.observer.subscribe(broken)
    plugin.post_response = broken
    s.handle(response_headers())
    out = s.handle(response_body(token("a"), True))
    assert out == [passthrough(token("a"), True)]
    assert ds.inflight("e0") == (0, 0) and len(records) == 1


def test_response_path_off_still_passes_through_and_releases_at_the_end():
    s, ds, _, records, plugin = setup(observer=False)
    s.handle(response_headers())
    assert s.handle(response_body(token("a"), False)) == [passthrough(token("a"), False)]
    assert ds.inflight("e0") == (1, PROMPT_TOKENS + OUTPUT_TOKENS)  # no meter: no first token
    s.handle(response_body(b"", True))
    assert ds.inflight("e0") == (0, 0) and records == [] and plugin.calls == []


def test_response_chunk_above_62000_bytes_goes_back_split_and_unchanged():
    s, _, _, _, _ = setup()
    s.handle(response_headers(ctype="application/json"))
    big = b"x" * 100_000
    out = s.handle(response_body(big, True))
    # 100,000 = 62,000 + 38,000; end_of_stream only on the last piece.
    assert out == [passthrough(big[:62_000], False), passthrough(big[62_000:], True)]


def test_running_requests_gauge_follows_the_response():
    from epp.observability import REGISTRY

    def running():
        labels = {"model_name": "m"}
        return REGISTRY.get_sample_value("inference_objective_running_requests", labels) or 0.0

    before = running()
    s, _, _, _, _ = setup()
    assert running() == before + 1  # routed, generating
    s.handle(response_headers())
    s.handle(response_body(token("a"), True))
    assert running() == before
    s.close()
    assert running() == before  # once


def test_a_measurement_bug_never_costs_the_response():
    s, ds, _, records, _ = setup()
    s.handle(response_headers())

    class Broken:
        def feed(self, chunk, now):
            raise ValueError("meter bug")

    s.meter = Broken()
    out = s.handle(response_body(token("a"), False))
    assert out == [passthrough(token("a"), False)]  # passed through all the same
    assert s.handle(response_body(token("b"), True)) == [passthrough(token("b"), True)]
    assert ds.inflight("e0") == (0, 0)
    assert records == []  # a half-measured record would mislead the planner
