"""The sidecar's pure parts: leg bodies, usage rewriting (JSON and SSE), the allowlist."""

import json
import os

import pytest

from epp.headers import REQUEST_ID
from epp.sidecar import protocol as p
from epp.sidecar.allowlist import Allowlist, parse_hostport

BODY = {
    "model": "m",
    "prompt": "hello",
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 50,
    "temperature": 0.2,
}


def test_prefill_leg_body_is_llm_d_nixl_v2():
    out = p.prefill_body(BODY, "completions")
    assert out == {
        "model": "m",
        "prompt": "hello",
        "stream": False,
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "temperature": 0.2,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    assert BODY["stream"] is True and "stream_options" in BODY  # the original is untouched
    responses = p.prefill_body({"model": "m", "input": "x", "max_output_tokens": 9}, "responses")
    assert responses["max_output_tokens"] == 1 and "max_tokens" not in responses


def test_decode_leg_body_restores_the_client_fields_and_adds_the_kv_handle():
    params = {"do_remote_prefill": True, "remote_host": "10.0.0.1", "remote_block_ids": [1, 2]}
    out = p.decode_body(BODY, params)
    assert out == {**BODY, "kv_transfer_params": params}
    bare = p.decode_body({"model": "m", "prompt": "x"}, params)
    assert set(bare) == {"model", "prompt", "kv_transfer_params"}  # omitted stays omitted


def test_which_requests_are_pd_and_the_header_list_form():
    assert p.pd_api("POST", "/v1/chat/completions") == "chat"
    assert p.pd_api("POST", "/v1/completions/") == "completions"
    assert p.pd_api("POST", "/v1/responses") == "responses"
    assert p.pd_api("GET", "/v1/completions") is None
    assert p.pd_api("POST", "/v1/embeddings") is None
    assert p.first_prefiller("10.0.0.1:8000, 10.0.0.2:8000") == "10.0.0.1:8000"
    assert p.first_prefiller(" ") is None and p.first_prefiller(None) is None
    assert p.path_label("/v1/completions") == "/v1/completions"
    assert p.path_label("/v1/secret/abc") == "other"


def test_forwarded_headers_drop_hop_by_hop_host_length_and_the_pd_header():
    headers = [
        ("Host", "a"),
        ("Content-Length", "5"),
        ("Connection", "keep-alive"),
        ("Transfer-Encoding", "chunked"),
        ("X-Prefiller-Host-Port", "1.2.3.4:5"),
        ("Authorization", "Bearer t"),
        (REQUEST_ID, "r1"),
    ]
    assert p.upstream_headers(headers) == [("Authorization", "Bearer t"), (REQUEST_ID, "r1")]


def test_json_usage_rewrite():
    body = {"usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 10}}}
    out = json.loads(p.rewrite_json_usage(json.dumps(body).encode(), 3))
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    no_details = json.loads(p.rewrite_json_usage(b'{"usage": {"prompt_tokens": 4}}', 0))
    assert no_details["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    responses = {"usage": {"input_tokens": 4, "input_tokens_details": {"cached_tokens": 4}}}
    out = json.loads(p.rewrite_json_usage(json.dumps(responses).encode(), 1))
    assert out["usage"]["input_tokens_details"] == {"cached_tokens": 1}
    assert p.rewrite_json_usage(b"not json", 1) == b"not json"
    assert p.rewrite_json_usage(b'{"choices": []}', 1) == b'{"choices": []}'
    assert p.cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 7}}}) == 7
    assert p.cached_tokens({"usage": {"prompt_tokens": 7}}) is None


def test_sse_rewrite_touches_only_the_usage_chunk_and_survives_any_split():
    token = b'data: {"choices": [{"text": " usage"}]}\n\n'  # "usage" in text, no usage key
    usage = (
        b'data: {"choices": [], "usage": {"prompt_tokens": 9, '
        b'"prompt_tokens_details": {"cached_tokens": 9}}}\n\n'
    )
    stream = token + usage + b"data: [DONE]\n\n"
    expected = (
        token
        + b'data: {"choices":[],"usage":{"prompt_tokens":9,'
        + b'"prompt_tokens_details":{"cached_tokens":2}}}\n\n'
        + b"data: [DONE]\n\n"
    )
    for size in (1, 3, 7, 64, len(stream)):
        r = p.SseUsageRewriter(2)
        out = b"".join(r.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert out + r.flush() == expected, size
    # Whole lines without usage pass through at once; only a partial line waits.
    r = p.SseUsageRewriter(2)
    assert r.feed(token + b"data: {") == token
    assert r.flush() == b"data: {"


def test_sse_rewrite_of_a_responses_api_completed_event():
    event = {"type": "response.completed", "response": {"usage": {"input_tokens": 5}}}
    line = b"event: response.completed\ndata: " + json.dumps(event).encode() + b"\n\n"
    out = p.SseUsageRewriter(4).feed(line)
    data = json.loads(out.split(b"data: ", 1)[1])
    assert data["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 4}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10.0.0.5:8000", ("10.0.0.5", 8000)),
        ("Host.Example:80", ("host.example", 80)),
        ("[FD00::1]:8000", ("fd00::1", 8000)),
        ("10.0.0.5", ("10.0.0.5", None)),
        ("fd00::1", ("fd00::1", None)),
        ("10.0.0.5:0", None),
        ("10.0.0.5:x", None),
        ("http://10.0.0.5:80", None),
        ("", None),
    ],
)
def test_parse_hostport(text, parsed):
    assert parse_hostport(text) == parsed


def test_allowlist_static_entries():
    a = Allowlist(["10.0.0.1:8000", "10.0.0.2", "[fd00::1]:9"])
    assert a.allows("10.0.0.1:8000") and not a.allows("10.0.0.1:8001")
    assert a.allows("10.0.0.2:1234")  # a bare host allows any port
    assert a.allows("[fd00::1]:9") and not a.allows("fd00::1")  # a port must be named
    assert not a.allows("10.0.0.3:8000") and not a.allows("garbage")
    assert Allowlist().describe() == "empty" and not Allowlist().allows("10.0.0.1:8000")
    with pytest.raises(ValueError, match="--allow"):
        Allowlist(["http://x"])


def test_allowlist_from_an_endpoints_file_follows_edits(tmp_path):
    f = tmp_path / "pool.yaml"
    f.write_text("- {name: p0, address: 10.0.0.1, port: 8000}\n")
    now = [0.0]
    a = Allowlist(endpoints_file=str(f), clock=lambda: now[0])
    assert a.allows("10.0.0.1:8000") and not a.allows("10.0.0.2:8000")
    f.write_text("- {name: p1, address: 10.0.0.2, port: 8000}\n")
    os.utime(f, ns=(1, 10**18))
    assert a.allows("10.0.0.1:8000")  # re-checked at most once a second
    now[0] = 2.0
    assert a.allows("10.0.0.2:8000") and not a.allows("10.0.0.1:8000")
    f.write_text("- {name: p1, address: 10.0.0.2}\n")  # broken: keep the last good list
    os.utime(f, ns=(2, 2 * 10**18))
    now[0] = 4.0
    assert a.allows("10.0.0.2:8000")


def test_a_bad_endpoints_file_is_fatal_at_start(tmp_path):
    from epp.datalayer.endpoints_file import EndpointsError

    f = tmp_path / "pool.yaml"
    f.write_text("- {name: p0, address: 10.0.0.1}\n")
    with pytest.raises(EndpointsError, match="port"):
        Allowlist(endpoints_file=str(f))
