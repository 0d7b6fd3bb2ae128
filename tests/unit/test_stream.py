"""The ext_proc state machine, driven with exact protobufs and checked on exact protobufs."""

import asyncio
import json
import random

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.config.loader import load_default_config
from epp.datastore import Datastore, Endpoint, EndpointMetrics
from epp.director import Director
from epp.extproc import messages as m
from epp.extproc.stream import PARSE_OFF_LOOP_BYTES, Phase, RequestStream
from epp.headers import (
    DATA_PARALLEL_RANK,
    DESTINATION_ENDPOINT,
    DESTINATION_SUBSET,
    LB_METADATA_NAMESPACE,
    MODEL_REWRITE,
    PREFILLER_HOST_PORT,
    REQUEST_ID,
    SUBSET_HINT_NAMESPACE,
)
from epp.scheduling.registry import Handle

MODES = processing_mode_pb2.ProcessingMode


def make_director(n=2, models=None):
    ds = Datastore(require_metrics=False)
    ds.set_endpoints([Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)])
    if models is not None:
        for e in ds.endpoints():
            ds.set_models(e.name, models)
    return director_for(ds), ds


def director_for(ds: Datastore) -> Director:
    cfg = load_default_config(Handle(rng=random.Random(0)))
    return Director(ds, cfg.scheduler, cfg.pre_request, random.Random(0))


def headers_msg(headers: dict[str, str], eos=False, mode=MODES.FULL_DUPLEX_STREAMED, subset=None):
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()
                ]
            ),
            end_of_stream=eos,
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode),
    )
    if subset is not None:
        ns = msg.metadata_context.filter_metadata[SUBSET_HINT_NAMESPACE]
        lst = ns.fields[DESTINATION_SUBSET].list_value
        for s in subset:
            lst.values.add().string_value = s
    return msg


def body_msg(data: bytes, eos: bool):
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


BASE_HEADERS = {":path": "/v1/completions", ":method": "POST", REQUEST_ID: "rid-7"}
BODY = json.dumps({"model": "m", "prompt": "hello there"}).encode()


def expected_headers_response(dest: str, extra: dict[str, str], length: int | None):
    set_headers = {DESTINATION_ENDPOINT: dest, **extra}
    if length is not None:
        set_headers["content-length"] = str(length)
    return m.headers_response(
        m.header_mutation(set_headers, [PREFILLER_HOST_PORT, DATA_PARALLEL_RANK]),
        clear_route_cache=True,
        metadata=m.destination_metadata([dest]),
    )


def test_full_duplex_holds_headers_until_body_complete_then_answers_in_order():
    director, ds = make_director()
    s = RequestStream(director, 1 << 20)
    assert s.handle(headers_msg(BASE_HEADERS)) == []
    assert s.handle(body_msg(BODY[:10], False)) == []
    out = s.handle(body_msg(BODY[10:], True))
    dest = out[0].request_headers.response.header_mutation.set_headers[0].header.raw_value.decode()
    assert dest in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert out == [
        expected_headers_response(dest, {}, len(BODY)),
        pb.ProcessingResponse(
            request_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    body_mutation=pb.BodyMutation(
                        streamed_response=pb.StreamedBodyResponse(body=BODY, end_of_stream=True)
                    )
                )
            )
        ),
    ]
    assert s.phase is Phase.ROUTED
    name = ds.by_hostport(dest).name
    assert ds.inflight(name)[0] == 1
    s.close()
    assert ds.inflight(name) == (0, 0)
    s.close()  # idempotent
    assert ds.inflight(name) == (0, 0)


def test_large_body_is_returned_in_62000_byte_streamed_chunks():
    director, _ = make_director()
    s = RequestStream(director, 1 << 22)
    big = json.dumps({"model": "m", "prompt": "x" * 200_000}).encode()
    s.handle(headers_msg(BASE_HEADERS))
    out = s.handle(body_msg(big, True))
    chunks = [r.request_body.response.body_mutation.streamed_response for r in out[1:]]
    assert [len(c.body) for c in chunks] == [62_000, 62_000, 62_000, len(big) - 186_000]
    assert [c.end_of_stream for c in chunks] == [False, False, False, True]
    assert b"".join(c.body for c in chunks) == big


def test_client_routing_headers_are_overwritten_and_removed():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    hdrs = {
        **BASE_HEADERS,
        DESTINATION_ENDPOINT: "6.6.6.6:1",
        PREFILLER_HOST_PORT: "6.6.6.6:2",
        DATA_PARALLEL_RANK: "3",
    }
    s.handle(headers_msg(hdrs))
    out = s.handle(body_msg(BODY, True))
    mut = out[0].request_headers.response.header_mutation
    dest = [h.header.raw_value for h in mut.set_headers if h.header.key == DESTINATION_ENDPOINT]
    assert dest[0] != b"6.6.6.6:1"
    assert mut.set_headers[0].append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert list(mut.remove_headers) == [PREFILLER_HOST_PORT, DATA_PARALLEL_RANK]


def test_request_id_generated_and_injected_when_absent():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg({":path": "/v1/completions", ":method": "POST"}))
    out = s.handle(body_msg(BODY, True))
    keys = {
        h.header.key: h.header.raw_value.decode()
        for h in out[0].request_headers.response.header_mutation.set_headers
    }
    assert keys[REQUEST_ID] == s.request.request_id and len(keys[REQUEST_ID]) == 36


def test_model_rewrite_changes_body_and_content_length():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg({**BASE_HEADERS, MODEL_REWRITE: "m-longer-name"}))
    out = s.handle(body_msg(BODY, True))
    new_body = out[1].request_body.response.body_mutation.streamed_response.body
    assert json.loads(new_body)["model"] == "m-longer-name"
    keys = {
        h.header.key: h.header.raw_value.decode()
        for h in out[0].request_headers.response.header_mutation.set_headers
    }
    assert keys["content-length"] == str(len(new_body))


def test_bodyless_get_goes_to_a_random_healthy_endpoint():
    director, _ = make_director(n=4)
    seen = set()
    for _ in range(60):
        s = RequestStream(director, 1 << 20)
        (resp,) = s.handle(headers_msg({":path": "/v1/models", ":method": "GET"}, eos=True))
        assert resp.request_headers.response.clear_route_cache
        seen.add(resp.request_headers.response.header_mutation.set_headers[0].header.raw_value)
        s.close()
    assert len(seen) == 4


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{oops", 400, "not valid JSON"),
        (b"[]", 400, "JSON object"),
        (
            json.dumps({"model": "other", "prompt": "p"}).encode(),
            404,
            "model 'other' is not served",
        ),
    ],
)
def test_errors_become_immediate_responses_with_json_body(body, status, fragment):
    director, ds = make_director(models=["m"])
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    (resp,) = s.handle(body_msg(body, True))
    ir = resp.immediate_response
    assert ir.status.code == status
    assert fragment in json.loads(ir.body)["error"]["message"]
    assert ir.headers.set_headers[0].header.key == "content-type"
    assert s.phase is Phase.REJECTED
    assert s.handle(body_msg(b"more", True)) == []  # nothing after a rejection
    s.close()
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())


def test_body_over_limit_gets_413_before_end_of_stream():
    director, _ = make_director()
    s = RequestStream(director, 100)
    s.handle(headers_msg(BASE_HEADERS))
    assert s.handle(body_msg(b"x" * 60, False)) == []
    (resp,) = s.handle(body_msg(b"x" * 60, False))
    assert resp.immediate_response.status.code == 413


def test_subset_hint_restricts_and_empty_subset_is_503():
    director, _ = make_director(n=3)
    for _ in range(20):
        s = RequestStream(director, 1 << 20)
        s.handle(headers_msg(BASE_HEADERS, subset=["10.0.0.3:8000"]))
        out = s.handle(body_msg(BODY, True))
        assert (
            out[0].request_headers.response.header_mutation.set_headers[0].header.raw_value
            == b"10.0.0.3:8000"
        )
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS, subset=[]))
    (resp,) = s.handle(body_msg(BODY, True))
    assert resp.immediate_response.status.code == 503


def test_no_endpoints_is_503():
    ds = Datastore(require_metrics=False)
    director = director_for(ds)
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    (resp,) = s.handle(body_msg(BODY, True))
    assert resp.immediate_response.status.code == 503
    assert b"no endpoints" in resp.immediate_response.body


def test_unhealthy_endpoints_are_skipped_while_a_healthy_one_exists():
    now = [100.0]
    ds = Datastore(staleness=1.0, clock=lambda: now[0])
    ds.set_endpoints([Endpoint("a", "10.0.0.1", 1), Endpoint("b", "10.0.0.2", 1)])
    ds.update_metrics("a", EndpointMetrics(update_time=100.0))
    ds.update_metrics("b", EndpointMetrics(update_time=100.0))
    ds.mark_scrape_failed("b", "connection refused")
    director = director_for(ds)
    for _ in range(10):
        s = RequestStream(director, 1 << 20)
        s.handle(headers_msg(BASE_HEADERS))
        out = s.handle(body_msg(BODY, True))
        assert (
            out[0].request_headers.response.header_mutation.set_headers[0].header.raw_value
            == b"10.0.0.1:1"
        )
        s.close()
    now[0] = 102.0  # a's scrape is now stale too
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    (resp,) = s.handle(body_msg(BODY, True))
    assert resp.immediate_response.status.code == 503
    assert b"connection refused" in resp.immediate_response.body


def test_buffered_mode_answers_headers_first_then_routes_on_body():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    (first,) = s.handle(
        headers_msg({**BASE_HEADERS, DESTINATION_ENDPOINT: "6.6.6.6:1"}, mode=MODES.BUFFERED)
    )
    assert first == m.headers_response(m.header_mutation({}, m.CLIENT_FORBIDDEN_HEADERS))
    (resp,) = s.handle(body_msg(BODY, True))
    common = resp.request_body.response
    assert common.clear_route_cache
    assert common.header_mutation.set_headers[0].header.key == DESTINATION_ENDPOINT
    assert not common.HasField("body_mutation")  # body unchanged: no mutation
    assert (
        resp.dynamic_metadata.fields[LB_METADATA_NAMESPACE]
        .struct_value.fields[DESTINATION_ENDPOINT]
        .string_value
    )


def test_streamed_mode_answers_every_chunk_at_end():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS, mode=MODES.STREAMED))
    assert s.handle(body_msg(BODY[:5], False)) == []
    assert s.handle(body_msg(BODY[5:9], False)) == []
    out = s.handle(body_msg(BODY[9:], True))
    assert len(out) == 3
    assert out[0].request_body.response.header_mutation.set_headers


def test_trailers_end_the_body_in_full_duplex():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    assert s.handle(body_msg(BODY, False)) == []
    out = s.handle(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    assert out[0].HasField("request_headers")
    assert out[1].request_body.response.body_mutation.streamed_response.end_of_stream is False
    assert out[-1] == pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def test_response_phases_pass_through():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    s.handle(body_msg(BODY, True))
    assert s.handle(pb.ProcessingRequest(response_headers=pb.HttpHeaders())) == [
        pb.ProcessingResponse(response_headers=pb.HeadersResponse())
    ]
    assert s.handle(pb.ProcessingRequest(response_trailers=pb.HttpTrailers())) == [
        pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    ]


# ---- large bodies: parsed in a worker thread ------------------------------------------
LARGE = json.dumps({"model": "m", "prompt": "tell me a story " * 20_000}).encode()  # 320 KB


async def run_counting_yields(stream: RequestStream, msgs) -> tuple[list, int]:
    """Feed `msgs` through handle_async; count the loop turns another task got meanwhile
    (0 means the whole stream ran without giving the loop back)."""
    turns = 0
    done = False

    async def other_stream():
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_stream())
    await asyncio.sleep(0)
    start = turns
    out = []
    for msg in msgs:
        out += await stream.handle_async(msg)
    done = True
    await task
    return out, turns - start


@pytest.mark.parametrize(
    ("extra", "body", "trailers"),
    [
        ({}, LARGE, False),
        ({MODEL_REWRITE: "m-longer-name"}, LARGE, False),  # re-serialised in the thread too
        ({}, LARGE, True),  # the body ends with trailers, not end_of_stream
        ({}, b"{" + b" " * (PARSE_OFF_LOOP_BYTES + 1), False),  # invalid JSON: the same 400
    ],
)
async def test_a_large_body_is_parsed_off_the_loop_with_the_same_answer(extra, body, trailers):
    assert len(body) > PARSE_OFF_LOOP_BYTES
    tail = [body_msg(body, False), pb.ProcessingRequest(request_trailers=pb.HttpTrailers())]
    msgs = [headers_msg({**BASE_HEADERS, **extra}), *(tail if trailers else [body_msg(body, True)])]
    sync_director, _ = make_director()
    sync_stream = RequestStream(sync_director, 1 << 20)
    expected = [r for msg in msgs for r in sync_stream.handle(msg)]
    async_director, _ = make_director()
    got, turns = await run_counting_yields(RequestStream(async_director, 1 << 20), msgs)
    assert got == expected
    assert turns >= 1  # the loop ran something else while the body was parsed


async def test_a_small_body_is_parsed_on_the_loop():
    director, _ = make_director()
    msgs = [headers_msg(BASE_HEADERS), body_msg(BODY, True)]
    got, turns = await run_counting_yields(RequestStream(director, 1 << 20), msgs)
    assert got[0].HasField("request_headers")
    assert turns == 0  # no hand-off for a body this small


async def test_a_body_over_the_limit_is_refused_before_any_parse():
    director, _ = make_director()
    stream = RequestStream(director, PARSE_OFF_LOOP_BYTES + 10)
    msgs = [headers_msg(BASE_HEADERS), body_msg(LARGE, True)]
    (resp,), turns = await run_counting_yields(stream, msgs)
    assert resp.immediate_response.status.code == 413
    assert turns == 0


def test_an_unexpected_error_outside_any_plugin_is_a_clean_immediate_response():
    # Nesting 100,000 deep makes json.loads raise RecursionError, which the parser does not
    # expect (issue 13 §1e will make it a 400): the stream still answers, it does not raise.
    director, ds = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    deep = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (resp,) = s.handle(body_msg(deep, True))
    assert resp.immediate_response.status.code in (400, 500)
    assert json.loads(resp.immediate_response.body)["error"]["message"]
    assert s.phase is Phase.REJECTED
    s.close()
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        (
            "/v1/messages",
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            400,
            "max_tokens",
        ),
        (
            "/v1/messages",
            {"model": "other", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
            404,
            "not served",
        ),
        ("/v1/messages/count_tokens", {"model": "other", "messages": []}, 404, "not served"),
    ],
)
def test_messages_errors_come_in_anthropics_shape(path, body, status, fragment):
    director, _ = make_director(models=["m"])
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg({**BASE_HEADERS, ":path": path}))
    (resp,) = s.handle(body_msg(json.dumps(body).encode(), True))
    ir = resp.immediate_response
    assert ir.status.code == status
    shaped = json.loads(ir.body)
    assert shaped["type"] == "error" and set(shaped["error"]) == {"type", "message"}
    assert fragment in shaped["error"]["message"]
    want = "invalid_request_error" if status == 400 else "not_found_error"
    assert shaped["error"]["type"] == want


def test_a_messages_request_is_routed_with_its_prompt():
    director, _ = make_director(models=["m"])
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg({**BASE_HEADERS, ":path": "/v1/messages"}))
    body = {
        "model": "m",
        "max_tokens": 7,
        "system": "S" * 400,
        "messages": [{"role": "user", "content": "x"}],
    }
    (resp, *_) = s.handle(body_msg(json.dumps(body).encode(), True))
    assert resp.HasField("request_headers")
    assert s.request is not None and s.request.api == "messages"
    assert s.request.prompt_tokens_estimate >= 100 and s.request.max_tokens == 7
    s.close()
