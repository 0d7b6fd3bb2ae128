"""OpenAI body parsing, including the inputs a client can get wrong."""

import json

import pytest

from epp.errors import EppError
from epp.headers import FAIRNESS_ID, MODEL_REWRITE, OBJECTIVE, REQUEST_ID
from epp.media import from_url
from epp.request import (
    API_CHAT,
    API_COMPLETIONS,
    API_EMBEDDINGS,
    new_request,
    parse_body,
)


def parse(body, path="/v1/completions", headers=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_body(new_request(headers or {}, path, "POST"), raw)


def refused(body, path="/v1/completions") -> EppError:
    with pytest.raises(EppError) as e:
        parse(body, path)
    assert e.value.status == 400
    return e.value


def test_completion_with_string_prompt():
    r = parse({"model": "m", "prompt": "abcdefgh", "max_tokens": 7, "stream": True})
    assert (r.api, r.model, r.target_model, r.prompt_text) == (
        API_COMPLETIONS,
        "m",
        "m",
        "abcdefgh",
    )
    assert r.max_tokens == 7 and r.stream is True
    assert r.prompt_tokens_estimate == 2


def test_completion_with_list_prompt_and_token_ids():
    assert parse({"model": "m", "prompt": ["a", "b"]}).prompt_text == "a b"
    assert parse({"model": "m", "prompt": [1, 2, 3]}).prompt_tokens_estimate == 3
    ids = parse({"model": "m", "prompt": [1, 2, 3]})
    assert (ids.prompt_token_ids, ids.prompt_text) == ([1, 2, 3], "")
    batch = parse({"model": "m", "prompt": [[1, 2], [3]]})
    assert (batch.prompt_token_ids, batch.prompt_tokens_estimate) == ([], 3)
    assert parse({"model": "m", "prompt": "text"}).prompt_token_ids is None


def test_chat_with_string_and_content_parts():
    r = parse(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi "},
                        {"type": "image_url", "image_url": {"url": "x"}},
                        {"type": "text", "text": "there"},
                    ],
                },
            ],
            "max_completion_tokens": 5,
        },
        "/v1/chat/completions",
    )
    assert r.api == API_CHAT
    # The image enters the text at its place, keyed by a digest of its URL (epp.media).
    marker = from_url("image", "x").marker
    assert r.prompt_text == f"<|system|>\nbe brief\n<|user|>\nhi {marker}there\n"
    assert r.media == (from_url("image", "x"),)
    assert r.media_at == r.prompt_text.index(marker)
    assert r.max_tokens == 5


def test_embeddings_input():
    r = parse({"model": "m", "input": ["x", "y"]}, "/v1/embeddings")
    assert r.api == API_EMBEDDINGS and r.prompt_text == "x y"


def test_headers_are_carried():
    r = parse(
        {"model": "m", "prompt": "p"},
        headers={
            REQUEST_ID: "rid-1",
            OBJECTIVE: "critical",
            FAIRNESS_ID: "tenant-a",
            MODEL_REWRITE: "m-v2",
        },
    )
    assert r.request_id == "rid-1"
    assert (r.objective, r.fairness_id, r.target_model) == ("critical", "tenant-a", "m-v2")


def test_request_id_is_generated_when_absent():
    a, b = parse({"model": "m", "prompt": "p"}), parse({"model": "m", "prompt": "p"})
    assert a.request_id and a.request_id != b.request_id


def test_model_rewrite_produces_new_body_with_unknown_fields_kept():
    r = parse(
        {"model": "m", "prompt": "p", "foo": {"bar": 1}},
        headers={MODEL_REWRITE: "n"},
    )
    body = json.loads(r.body_for_upstream())
    assert body == {"model": "n", "prompt": "p", "foo": {"bar": 1}}
    assert parse({"model": "m", "prompt": "p"}).body_for_upstream() is None


def test_unknown_fields_pass():
    assert parse({"model": "m", "prompt": "p", "whatever": [1, 2], "logprobs": 3}).model == "m"


@pytest.mark.parametrize(
    ("body", "path", "fragment"),
    [
        (b"", "/v1/completions", "body is empty"),
        (b"   ", "/v1/completions", "body is empty"),
        (b"\xff\xfe{}", "/v1/completions", "not valid UTF-8"),
        (b"{not json", "/v1/completions", "not valid JSON"),
        (b"[1, 2]", "/v1/completions", "must be a JSON object, got a JSON array"),
        (b'"text"', "/v1/completions", "got a JSON string"),
        (b'{"prompt": "x"}', "/v1/completions", "'model' is missing"),
        (b'{"model": 3, "prompt": "x"}', "/v1/completions", "'model' must be a non-empty string"),
        (b'{"model": ""}', "/v1/completions", "'model' must be a non-empty string"),
        (b'{"model": "m"}', "/v1/completions", "'prompt' is missing"),
        (b'{"model": "m", "prompt": {"a": 1}}', "/v1/completions", "'prompt' must be"),
        (b'{"model": "m"}', "/v1/chat/completions", "'messages' is missing"),
        (b'{"model": "m", "messages": []}', "/v1/chat/completions", "non-empty list"),
        (
            b'{"model": "m", "messages": ["hi"]}',
            "/v1/chat/completions",
            "messages[0] must be an object",
        ),
        (
            b'{"model": "m", "messages": [{"content": "x"}]}',
            "/v1/chat/completions",
            "messages[0].role",
        ),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
            "/v1/chat/completions",
            "messages[0].content",
        ),
        (
            b'{"model": "m", "prompt": "p", "max_tokens": -1}',
            "/v1/completions",
            "'max_tokens' must be a non-negative",
        ),
        (
            b'{"model": "m", "prompt": "p", "max_tokens": "9"}',
            "/v1/completions",
            "'max_tokens' must be",
        ),
        (
            b'{"model": "m", "prompt": "p", "stream": "yes"}',
            "/v1/completions",
            "'stream' must be a boolean",
        ),
        (b'{"model": "m"}', "/v1/embeddings", "'input' is missing"),
    ],
)
def test_bad_bodies_get_400_naming_the_problem(body, path, fragment):
    err = refused(body, path)
    assert fragment in err.message
    payload = json.loads(err.body())
    assert payload["error"]["type"] == "invalid_request_error"
    assert fragment in payload["error"]["message"]


def test_huge_prompt_parses():
    prompt = "word " * 400_000  # 2 MB
    r = parse({"model": "m", "prompt": prompt})
    assert r.prompt_tokens_estimate == len(prompt) // 4
