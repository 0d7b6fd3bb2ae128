"""Anthropic's Messages API: the parser on every block type, vLLM 0.32's conversion,
every malformed field (a 400 in Anthropic's shape), and the limits of the other APIs."""

from __future__ import annotations

import json

import pytest

from epp.anthropic import to_chat_body
from epp.errors import EppError
from epp.limits import BodyLimits
from epp.media import from_url
from epp.request import API_MESSAGES, API_OTHER, is_anthropic_path, new_request, parse_body

IMG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
URL_IMG = {"type": "image", "source": {"type": "url", "url": "https://x/cat.png"}}


def messages(body: dict, limits: BodyLimits | None = None, headers=None):
    raw = json.dumps({"model": "m", "max_tokens": 16, **body}).encode()
    req = new_request(headers or {}, "/v1/messages", "POST")
    return parse_body(req, raw, limits or BodyLimits())


def refused(body: dict, fragment: str, limits: BodyLimits | None = None) -> dict:
    """The 400's body as a Messages client reads it, checked to name `fragment`."""
    with pytest.raises(EppError) as e:
        messages(body, limits)
    assert e.value.status == 400
    assert fragment in e.value.message, e.value.message
    e.value.anthropic = True
    shaped = json.loads(e.value.body())
    assert shaped == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": e.value.message},
    }
    return shaped


def test_the_route_and_count_tokens_pass_through():
    assert messages({"messages": [{"role": "user", "content": "hi"}]}).api == API_MESSAGES
    assert new_request({}, "/v1/messages/count_tokens", "POST").path.endswith("count_tokens")
    from epp.request import api_for_path

    assert api_for_path("/v1/messages/count_tokens") == API_OTHER
    assert is_anthropic_path("/v1/messages/count_tokens?beta=true")
    assert is_anthropic_path("/v1/messages") and not is_anthropic_path("/v1/chat/completions")


def test_every_block_type_converts_as_vllm_does():
    body = {
        "model": "m",
        "max_tokens": 5,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
            {"type": "text", "text": "You are "},
            {"type": "text", "text": "terse."},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, IMG, URL_IMG]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "a", "signature": "s"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "thinking", "thinking": "b", "signature": "s"},
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "ls", "input": {"p": "/"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "a"},
                            {"type": "text", "text": "b"},
                            IMG,
                            {"type": "tool_reference", "tool_name": "grep"},
                        ],
                    },
                    {
                        "type": "document",
                        "source": {"type": "text", "data": "doc", "media_type": "t"},
                    },
                ],
            },
            {"role": "system", "content": "reminder"},
            {
                "role": "assistant",
                "content": [{"type": "tool_result", "tool_use_id": "t0", "content": "old"}],
            },
            {"role": "user", "content": "next"},
        ],
        "tools": [{"name": "ls", "description": "list", "input_schema": {"properties": {}}}],
        "tool_choice": {"type": "any"},
        "output_config": {"effort": "low"},
        "chat_template_kwargs": {"k": 1},
    }
    chat = to_chat_body(body)
    data_url = "data:image/png;base64,iVBO"
    assert chat["messages"] == [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": data_url}},
                {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
            ],
        },
        {
            "role": "assistant",
            "reasoning": "ab",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"p": "/"}'},
                }
            ],
            "content": "calling",
        },
        {"role": "tool", "tool_call_id": "t1", "content": "a\nb"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}}]},
        {
            "role": "tool",
            "tool_call_id": "t1",
            "content": [{"type": "tool_reference", "name": "grep"}],
        },
        # the user message held only a tool result and a document: dropped
        {"role": "system", "content": "reminder"},  # in place (the template allows it)
        {"role": "assistant", "content": "Tool result: old"},
        {"role": "user", "content": "next"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "ls",
                "description": "list",
                "parameters": {"properties": {}, "type": "object"},
                "strict": None,
                "defer_loading": None,
            },
        }
    ]
    assert chat["reasoning_effort"] == "low" and chat["chat_template_kwargs"] == {"k": 1}
    merged = to_chat_body(body, merge_inline_system=True)["messages"]
    assert merged[0] == {"role": "system", "content": "You are terse.reminder"}
    assert {"role": "system", "content": "reminder"} not in merged
    off = to_chat_body({**body, "thinking": {"type": "disabled"}}, disabled_effort="low")
    assert off["reasoning_effort"] == "low"


def test_tool_changes_in_system_messages_resolve_the_tools():
    tool = {"name": "grep", "input_schema": {"type": "object"}, "defer_loading": True}
    body = {
        "model": "m",
        "max_tokens": 5,
        "tools": [tool, {"name": "ls", "input_schema": {}}],
        "messages": [
            {
                "role": "system",
                "content": [
                    {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "grep"}},
                    {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "ls"}},
                    {
                        "type": "tool_addition",
                        "tool": {
                            "type": "tool_definition",
                            "definition": {"name": "cat", "input_schema": {}},
                        },
                    },
                ],
            },
            {"role": "user", "content": "go"},
        ],
    }
    req = messages(body)
    tools = [
        (t["function"]["name"], t["function"]["defer_loading"]) for t in req.chat_body["tools"]
    ]
    assert tools == [("grep", None), ("cat", None)]


def test_prompt_text_carries_system_tools_tool_results_and_media_markers():
    req = messages(
        {
            "system": "SYS",
            "tools": [{"name": "ls", "input_schema": {}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "see"}, IMG]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": "RESULT"}],
                },
            ],
            "metadata": {"user_id": "user-7"},
        }
    )
    marker = from_url("image", "data:image/png;base64,iVBO").marker
    assert '"name": "ls"' in req.prompt_text
    assert "<|system|>\nSYS\n" in req.prompt_text and "RESULT" in req.prompt_text
    assert f"see{marker}" in req.prompt_text and req.media_at == req.prompt_text.index(marker)
    assert req.session_key == "user-7" and req.fairness_key == "user-7"
    assert req.max_tokens == 16


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"max_tokens": None, "messages": [{"role": "user", "content": "x"}]}, "'max_tokens'"),
        ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "'max_tokens'"),
        ({"messages": []}, "'messages'"),
        ({"messages": "hi"}, "'messages'"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "content[0].text"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}]}]}, "content[0].source"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}
                ]
            },
            "content[0].source.data",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}
                ]
            },
            "content[0].source.type",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "document", "source": {"type": "x"}}]}
                ]
            },
            "source.type",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}]},
            "content[0].name",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": [1]}],
                    }
                ]
            },
            "content[0].input",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}],
                    }
                ]
            },
            "content[0].content",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "thinking"}]}]},
            "content[0].thinking",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_removal",
                                "tool": {"type": "tool_reference", "name": "x"},
                            }
                        ],
                    }
                ]
            },
            "role system",
        ),
        ({"system": 5, "messages": [{"role": "user", "content": "x"}]}, "'system'"),
        (
            {"system": [{"type": "text"}], "messages": [{"role": "user", "content": "x"}]},
            "system[0].text",
        ),
        ({"tools": {}, "messages": [{"role": "user", "content": "x"}]}, "'tools'"),
        (
            {"tools": [{"name": "x"}], "messages": [{"role": "user", "content": "x"}]},
            "input_schema",
        ),
        (
            {"tool_choice": {"type": "tool"}, "messages": [{"role": "user", "content": "x"}]},
            "tool_choice.name",
        ),
        ({"tool_choice": "auto", "messages": [{"role": "user", "content": "x"}]}, "'tool_choice'"),
        (
            {"metadata": {"user_id": 3}, "messages": [{"role": "user", "content": "x"}]},
            "metadata.user_id",
        ),
        ({"stream": "yes", "messages": [{"role": "user", "content": "x"}]}, "'stream'"),
        ({"stop_sequences": "x", "messages": [{"role": "user", "content": "x"}]}, "stop_sequences"),
        (
            {
                "thinking": {"type": "enabled", "budget_tokens": 2048},
                "messages": [{"role": "user", "content": "x"}],
            },
            "budget_tokens",
        ),
        (
            {"output_config": {"effort": "huge"}, "messages": [{"role": "user", "content": "x"}]},
            "effort",
        ),
    ],
)
def test_malformed_fields_get_a_400_naming_them_in_anthropics_shape(body, fragment):
    refused(body, fragment)


def test_the_limits_of_the_other_apis_apply():
    big = "x" * 40_000  # 10,000 tokens at 4 characters a token
    limits = BodyLimits(max_prompt_tokens=5_000, max_messages=3, max_json_depth=20)
    user = {"role": "user", "content": "hi"}
    refused({"system": big, "messages": [user]}, "max-prompt-tokens", limits)
    tool = {"name": "t", "description": big, "input_schema": {}}
    refused({"tools": [tool], "messages": [user]}, "max-prompt-tokens", limits)
    result = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": big}]}
    refused({"messages": [{"role": "user", "content": [result]}]}, "max-prompt-tokens", limits)
    doc = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": big},
    }
    refused({"messages": [{"role": "user", "content": [doc]}]}, "max-prompt-tokens", limits)
    refused({"messages": [user] * 4}, "--max-messages", limits)
    deep: dict = {}
    for _ in range(30):
        deep = {"a": deep}
    refused({"messages": [user], "metadata": deep}, "--max-json-depth", limits)
    messages({"system": "x" * 100, "messages": [user] * 3}, limits)  # within every limit


ODD = [None, 0, -1, 1.5, True, "", "x", [], {}, [1], [{}], {"type": "text"}, {"type": 3}]


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _replaced(value, path, new):
    if not path:
        return new
    out = json.loads(json.dumps(value))
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return out


def test_any_field_replaced_by_any_odd_value_is_parsed_or_refused_with_a_400():
    """Bad input never crashes: every field of a body that uses every block type, replaced
    in turn by each odd value, parses or gets a 400 naming a field (never another error)."""
    tools = [{"name": "ls", "input_schema": {"type": "object"}}]
    valid = {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "S"}],
        "tools": tools,
        "tool_choice": {"type": "tool", "name": "ls"},
        "metadata": {"user_id": "u"},
        "thinking": {"type": "disabled"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}, IMG, URL_IMG]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "tool_use", "id": "a", "name": "ls", "input": {"p": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": [IMG]},
                    {"type": "document", "source": {"type": "text", "data": "d"}},
                ],
            },
            {
                "role": "system",
                "content": [
                    {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "ls"}}
                ],
            },
        ],
    }
    messages(valid)
    checked = 0
    for path in list(_paths(valid)):
        if path == ():
            continue
        for odd in ODD:
            body = _replaced(valid, path, odd)
            req = new_request({}, "/v1/messages", "POST")
            try:
                parse_body(req, json.dumps(body).encode())
            except EppError as e:
                assert e.status == 400, (path, odd, e)
            checked += 1
    assert checked > 500


def test_a_chat_body_with_media_parts_is_parsed_or_refused_with_a_400():
    valid = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "q"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                    {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
                    {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}], "reasoning": "r"},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    chat_req = new_request({}, "/v1/chat/completions", "POST")
    assert len(parse_body(chat_req, json.dumps(valid).encode()).media) == 3
    for path in list(_paths(valid)):
        for odd in ODD if path else []:
            req = new_request({}, "/v1/chat/completions", "POST")
            try:
                parse_body(req, json.dumps(_replaced(valid, path, odd)).encode())
            except EppError as e:
                assert e.status == 400, (path, odd, e)
