"""Hostile input on the ext_proc state machine (issue 13 §1e, f, h and §5 limits): each
gets a clean 4xx ImmediateResponse with an OpenAI-style body, and nothing stays held."""

import json

import pytest

from epp.extproc.stream import Phase, RequestStream
from epp.headers import DESTINATION_ENDPOINT, PREFILLER_HOST_PORT, REQUEST_ID
from epp.limits import BodyBudget, BodyLimits, HeaderLimits
from epp.request import MAX_REQUEST_ID_CHARS
from tests.unit.test_stream import BASE_HEADERS, body_msg, headers_msg, make_director

DEFAULT = BodyLimits()


def refuse(body: bytes, limits: BodyLimits = DEFAULT, path: str = "/v1/completions"):
    """Send `body` on one stream; return (status, OpenAI error dict) of its refusal."""
    director, ds = make_director()
    s = RequestStream(director, 64 << 20, body_limits=limits)
    assert s.handle(headers_msg({**BASE_HEADERS, ":path": path})) == []
    (resp,) = s.handle(body_msg(body, True))
    assert resp.WhichOneof("response") == "immediate_response"
    assert s.phase is Phase.REJECTED
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())
    ir = resp.immediate_response
    return ir.status.code, json.loads(ir.body)["error"]


def test_deeply_nested_json_beyond_the_parsers_recursion_is_a_400():
    # 100,000 levels: json.loads raises RecursionError long before the end
    status, err = refuse(b'{"model": "m", "prompt": "x", "a": ' + b"[" * 100_000 + b"]" * 100_000)
    assert status == 400
    assert "nests deeper than 128 levels" in err["message"]
    assert err["type"] == "invalid_request_error"


def test_nesting_over_the_configured_depth_is_a_400_and_under_it_routes():
    # depth: the body object (1) + 9 arrays = 10
    body = b'{"model": "m", "prompt": "x", "a": ' + b"[" * 9 + b"]" * 9 + b"}"
    status, err = refuse(body, BodyLimits(max_json_depth=9))
    assert (status, "--max-json-depth" in err["message"]) == (400, True)
    director, _ = make_director()
    s = RequestStream(director, 1 << 20, body_limits=BodyLimits(max_json_depth=10))
    s.handle(headers_msg(BASE_HEADERS))
    assert s.handle(body_msg(body, True))[0].WhichOneof("response") == "request_headers"


def test_an_integer_of_5000_digits_is_a_400_not_a_500():
    status, err = refuse(b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}")
    assert status == 400
    assert "number the parser refuses" in err["message"]


@pytest.mark.parametrize("escape", [r"\ud800", r"\udfff", r"x\udc00y", r"\ude00\ud83d"])
def test_a_lone_surrogate_is_a_400(escape):
    status, err = refuse(b'{"model": "m", "prompt": "' + escape.encode() + b'"}')
    assert status == 400
    assert "lone UTF-16 surrogate" in err["message"]


def test_a_surrogate_pair_is_an_ordinary_character():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(BASE_HEADERS))
    out = s.handle(body_msg(rb'{"model": "m", "prompt": "smile \ud83d\ude00"}', True))
    assert out[0].WhichOneof("response") == "request_headers"


def test_too_many_messages_is_a_400_naming_the_flag():
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}] * 11}).encode()
    status, err = refuse(body, BodyLimits(max_messages=10), "/v1/chat/completions")
    assert status == 400
    assert err["message"] == (
        "field 'messages' has 11 messages, over the limit of 10 (set by epp serve --max-messages)"
    )


def test_a_prompt_over_the_token_limit_is_a_400_context_length_exceeded():
    # 4,004 characters / 4 = 1,001 estimated tokens > 1,000
    status, err = refuse(
        json.dumps({"model": "m", "prompt": "x" * 4004}).encode(),
        BodyLimits(max_prompt_tokens=1000),
    )
    assert (status, err["code"]) == (400, "context_length_exceeded")
    assert "about 1001 tokens" in err["message"]
    # token ids count exactly: 1,001 ids
    status, err = refuse(
        json.dumps({"model": "m", "prompt": [1] * 1001}).encode(),
        BodyLimits(max_prompt_tokens=1000),
    )
    assert (status, "about 1001 tokens" in err["message"]) == (400, True)


def many_headers(n: int) -> dict[str, str]:
    """BASE_HEADERS (:path, :method, x-request-id) plus filler: n regular headers."""
    return {**BASE_HEADERS, **{f"x-filler-{i}": "v" for i in range(n - 1)}}


def test_headers_that_would_cross_the_gateway_limit_with_the_epps_own_get_431():
    limits = HeaderLimits(max_count=100)
    director, _ = make_director()
    # The EPP adds x-gateway-destination-endpoint and x-prefiller-host-port (2; the
    # client's valid x-request-id is kept), content-length if absent (1); Envoy adds 3.
    # 95 regular headers with content-length: 95 + 2 + 3 = 100 fits;
    # without it: 95 + 3 + 3 = 101 does not.
    ok = {**many_headers(94), "content-length": "10"}  # 95 regular
    s = RequestStream(director, 1 << 20, header_limits=limits)
    assert s.handle(headers_msg(ok)) == []
    s = RequestStream(director, 1 << 20, header_limits=limits)
    (resp,) = s.handle(headers_msg(many_headers(95)))  # 95 regular, no content-length
    ir = resp.immediate_response
    assert ir.status.code == 431
    assert json.loads(ir.body)["error"]["message"].startswith(
        "request has 95 headers; the gateway allows 100 including the 3 the endpoint picker "
        "adds and 3 Envoy adds"
    )
    assert s.phase is Phase.REJECTED
    # A client copy of the routing headers is overwritten, not added: it costs nothing more.
    spoof = {**many_headers(93), "content-length": "10", DESTINATION_ENDPOINT: "6.6.6.6:1"}
    s = RequestStream(director, 1 << 20, header_limits=limits)
    assert s.handle(headers_msg({**spoof, PREFILLER_HOST_PORT: "6.6.6.6:2"})) == []  # 96 + 1 + 3


def test_header_bytes_over_the_gateway_limit_get_431():
    director, _ = make_director()
    s = RequestStream(director, 1 << 20, header_limits=HeaderLimits(max_kb=1))
    (resp,) = s.handle(headers_msg({**BASE_HEADERS, "x-big": "v" * 1024}))
    assert resp.immediate_response.status.code == 431


def routed_request_id(headers: dict[str, str]) -> tuple[str, bool]:
    """(the stream's request id, whether the EPP sets x-request-id upstream)."""
    director, _ = make_director()
    s = RequestStream(director, 1 << 20)
    s.handle(headers_msg(headers))
    out = s.handle(body_msg(b'{"model": "m", "prompt": "x"}', True))
    sets = {
        h.header.key: h.header.raw_value.decode()
        for h in out[0].request_headers.response.header_mutation.set_headers
    }
    assert s.request is not None
    if REQUEST_ID in sets:
        assert sets[REQUEST_ID] == s.request.request_id
    return s.request.request_id, REQUEST_ID in sets


@pytest.mark.parametrize(
    "bad",
    ["id\twith\ttab", "line\nbreak", "sp ace", "é-unicode", "x" * (MAX_REQUEST_ID_CHARS + 1), ""],
)
def test_an_invalid_client_request_id_is_replaced_and_the_replacement_forwarded(bad):
    rid, forwarded = routed_request_id({**BASE_HEADERS, REQUEST_ID: bad})
    assert rid != bad and len(rid) == 36  # a fresh UUID
    assert forwarded


def test_a_valid_client_request_id_is_kept_and_not_rewritten():
    good = "0af7651916cd43dd8448eb211c80319c-" + "a" * (MAX_REQUEST_ID_CHARS - 33)
    assert routed_request_id({**BASE_HEADERS, REQUEST_ID: good}) == (good, False)


def test_the_body_budget_refuses_a_chunk_past_it_and_frees_every_byte():
    director, ds = make_director()
    budget = BodyBudget(1000)
    a = RequestStream(director, 1 << 20, budget=budget)
    b = RequestStream(director, 1 << 20, budget=budget)
    a.handle(headers_msg(BASE_HEADERS))
    b.handle(headers_msg(BASE_HEADERS))
    assert a.handle(body_msg(b" " * 600, False)) == []
    assert budget.held == 600
    (resp,) = b.handle(body_msg(b" " * 401, False))  # 600 + 401 > 1000
    err = json.loads(resp.immediate_response.body)["error"]
    assert (resp.immediate_response.status.code, err["code"]) == (503, "body_buffer_full")
    assert budget.held == 600  # b's refused chunk was never taken
    a.close()  # a's client went away mid-body
    assert budget.held == 0
    c = RequestStream(director, 1 << 20, budget=budget)
    c.handle(headers_msg(BASE_HEADERS))
    c.handle(body_msg(b'{"model": "m",', False))
    assert budget.held == 14
    out = c.handle(body_msg(b' "prompt": "x"}', True))
    assert out[0].WhichOneof("response") == "request_headers"
    assert budget.held == 0  # given back once parsed
    c.close()
    assert all(ds.inflight(e.name) == (0, 0) for e in ds.endpoints())


def test_a_timed_out_body_is_a_408_and_its_bytes_are_freed():
    director, _ = make_director()
    budget = BodyBudget(1000)
    s = RequestStream(director, 1 << 20, budget=budget)
    s.handle(headers_msg(BASE_HEADERS))
    s.handle(body_msg(b'{"model":', False))
    (resp,) = s.body_timed_out(30)
    assert resp.immediate_response.status.code == 408
    assert "--body-timeout" in json.loads(resp.immediate_response.body)["error"]["message"]
    assert budget.held == 0
    assert s.body_timed_out(30) == []  # already refused: nothing more to say
