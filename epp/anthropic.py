"""Anthropic's Messages API (`POST /v1/messages`): validation and vLLM's conversion.

vLLM serves the route by converting the request into a chat-completions request and
running it through the chat path (`vllm/entrypoints/anthropic/serving.py`,
`_convert_anthropic_to_openai_request`), so the prompt it caches is the chat template's
rendering of the converted messages. `to_chat_body` makes the same conversion, step by
step, and the EPP then renders it exactly as it renders a chat request
(`epp.prompt_tokens`):

- system: the top-level `system` (a string, or text blocks, concatenated without a
  separator) becomes the leading system message; a `system`-role message in `messages`
  stays a system message in place, unless the model's template refuses a system message
  after the first (vLLM renders [system, user, system, user] to find out), when its text
  is appended to the leading one. Text starting with `x-anthropic-billing-header` (a
  per-request attribution header one agent client sends) is dropped, as vLLM drops it;
- each other message: a string content stays a string; blocks become parts: `text` →
  a text part, `image` → an `image_url` part (a base64 source as a `data:` URL),
  `thinking` → the message's `reasoning`, `tool_use` → an OpenAI tool call (its
  `input` as JSON `arguments`), `tool_result` in a user message → a `tool` message
  (its text parts joined by newlines; its images as a following user message),
  in an assistant message → a text part `Tool result: ...`; `redacted_thinking` and
  `tool_reference` add nothing. A single text part collapses to a string; a user
  message left with no content is dropped;
- tools → `{"type": "function", "function": {name, description, parameters:
  input_schema, strict, defer_loading}}`, after the `tool_addition` / `tool_removal`
  blocks of system messages are applied in order; `output_config.effort` → the
  reasoning effort, and `thinking: {type: disabled}` → "none" (or "low" for a template
  that renders "none" like some effort: vLLM probes it); `chat_template_kwargs` and
  `cache_salt` as given. `tool_choice` does not reach the template.

Validation follows vLLM's request model (`vllm/entrypoints/anthropic/protocol.py`)
and Anthropic's API reference: every refusal names the field, and is answered in
Anthropic's error shape (`epp.errors.EppError.body`). A `document` block, which
Anthropic defines, is accepted here and adds nothing to the converted prompt (vLLM's
converter has no branch for it; vLLM 0.32's request model refuses the block type, so
the server answers such a request itself).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from epp.errors import bad_request

_ROLES = ("user", "assistant", "system")
# Non-standard roles some agent clients send; vLLM maps them to user.
_ROLE_ALIASES = {"ctx": "user", "msg": "user"}
_BLOCK_TYPES = (
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
)
_TOOL_CHANGES = ("tool_addition", "tool_removal")
_TOOL_CHOICES = ("auto", "any", "tool", "none")
_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_BILLING_HEADER = "x-anthropic-billing-header"


# ---- validation -------------------------------------------------------------------
def validate(body: Mapping[str, Any]) -> None:
    """Refuse (400, naming the field) what vLLM's request model or Anthropic refuses."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise bad_request("field 'max_tokens' is missing; /v1/messages needs max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad_request(f"field 'max_tokens' must be a positive integer, got {max_tokens!r}")
    messages = body.get("messages")
    if messages is None:
        raise bad_request("field 'messages' is missing; /v1/messages needs messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("field 'messages' must be a non-empty list of messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise bad_request(f"{where} must be an object with 'role' and 'content'")
        role = m.get("role")
        role = _ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in _ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}")
        if "content" not in m:
            raise bad_request(f"{where}.content is missing")
        _content(m["content"], f"{where}.content")
        if role != "system" and isinstance(m["content"], list):
            _no_tool_changes(m["content"], f"{where}.content")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            raise bad_request("field 'system' must be a string or a list of text blocks")
        _blocks(system, "system")
        _no_tool_changes(system, "system")
    _tools(body.get("tools"))
    _thinking(body)
    _tool_choice(body.get("tool_choice"))
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise bad_request("field 'metadata' must be an object")
        uid = metadata.get("user_id")
        if uid is not None and not isinstance(uid, str):
            raise bad_request("field 'metadata.user_id' must be a string")
    stops = body.get("stop_sequences")
    if stops is not None and not (
        isinstance(stops, list) and all(isinstance(s, str) for s in stops)
    ):
        raise bad_request("field 'stop_sequences' must be a list of strings")
    for name in ("temperature", "top_p"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise bad_request(f"field '{name}' must be a number")
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise bad_request("field 'top_k' must be an integer")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise bad_request("field 'chat_template_kwargs' must be an object")


def _no_tool_changes(blocks: list[Any], where: str) -> None:
    for j, b in enumerate(blocks):
        if b["type"] in _TOOL_CHANGES:
            raise bad_request(
                f"{where}[{j}]: {b['type']} blocks are only allowed in messages with role system"
            )


def _thinking(body: Mapping[str, Any]) -> None:
    thinking = body.get("thinking")
    if thinking is not None:
        kinds = ("enabled", "disabled", "adaptive")
        if not isinstance(thinking, Mapping) or thinking.get("type") not in kinds:
            raise bad_request(f"field 'thinking.type' must be one of {', '.join(kinds)}")
        if thinking["type"] == "enabled":
            budget = thinking.get("budget_tokens")
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1024:
                raise bad_request("field 'thinking.budget_tokens' must be an integer >= 1024")
            kv = body.get("kv_transfer_params")
            prefill_leg = isinstance(kv, Mapping) and kv.get("do_remote_decode")
            if budget >= body["max_tokens"] and not prefill_leg:
                raise bad_request("field 'thinking.budget_tokens' must be less than max_tokens")
    config = body.get("output_config")
    if config is not None:
        if not isinstance(config, Mapping):
            raise bad_request("field 'output_config' must be an object")
        effort = config.get("effort")
        if effort is not None and effort not in _EFFORTS:
            raise bad_request(f"field 'output_config.effort' must be one of {', '.join(_EFFORTS)}")


def _content(content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content blocks")
    _blocks(content, where)


def _blocks(blocks: list[Any], where: str) -> None:
    for j, block in enumerate(blocks):
        _block(block, f"{where}[{j}]")


def _block(block: Any, at: str) -> None:
    if not isinstance(block, Mapping):
        raise bad_request(f"{at} must be an object with a 'type'")
    kind = block.get("type")
    if kind not in _BLOCK_TYPES:
        raise bad_request(f"{at}.type must be one of {', '.join(_BLOCK_TYPES)}, got {kind!r}")
    if kind == "text":
        _string(block, "text", at)
    elif kind in ("image", "document"):
        _source(block.get("source"), f"{at}.source", kind)
    elif kind == "tool_use":
        _string(block, "id", at)
        _string(block, "name", at)
        if not isinstance(block.get("input", {}), Mapping):
            raise bad_request(f"{at}.input must be an object")
    elif kind == "tool_result":
        _string(block, "tool_use_id", at)
        content = block.get("content")
        if content is not None and not isinstance(content, str):
            if not isinstance(content, list):
                raise bad_request(f"{at}.content must be a string or a list of blocks")
            _blocks(content, f"{at}.content")
        if block.get("is_error") is not None and not isinstance(block["is_error"], bool):
            raise bad_request(f"{at}.is_error must be a boolean")
    elif kind == "thinking":
        _string(block, "thinking", at)
    elif kind == "redacted_thinking":
        _string(block, "data", at)
    elif kind in _TOOL_CHANGES:
        tool = block.get("tool")
        ref = isinstance(tool, Mapping) and tool.get("type") == "tool_reference"
        if ref and isinstance(tool.get("name"), str):
            return
        definition = isinstance(tool, Mapping) and tool.get("type") == "tool_definition"
        if kind == "tool_addition" and definition:
            _tools([tool.get("definition")], f"{at}.tool.definition")  # type: ignore[union-attr]
            return
        allowed = "a tool_reference" + (" or a tool_definition" if kind == "tool_addition" else "")
        raise bad_request(f"{at}.tool must be {allowed}")


def _string(block: Mapping[str, Any], name: str, at: str) -> None:
    if not isinstance(block.get(name), str):
        raise bad_request(f"{at}.{name} must be a string")


def _source(source: Any, at: str, kind: str) -> None:
    if not isinstance(source, Mapping):
        raise bad_request(f"{at} must be an object with a 'type'")
    stype = source.get("type")
    if stype == "base64":
        if not isinstance(source.get("data"), str) or not source["data"]:
            raise bad_request(f"{at}.data must be a non-empty base64 string")
        if not isinstance(source.get("media_type"), str):
            raise bad_request(f"{at}.media_type must be a string")
    elif stype == "url":
        if not isinstance(source.get("url"), str) or not source["url"]:
            raise bad_request(f"{at}.url must be a non-empty string")
    elif kind == "document" and stype == "text":
        _string(source, "data", at)
    elif kind == "document" and stype == "content":
        content = source.get("content")
        if not isinstance(content, str | list):
            raise bad_request(f"{at}.content must be a string or a list of blocks")
        if isinstance(content, list):
            _blocks(content, f"{at}.content")
    else:
        allowed = "base64, url, text, content" if kind == "document" else "base64, url"
        raise bad_request(f"{at}.type must be one of {allowed}, got {stype!r}")


def _tools(tools: Any, where: str = "") -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad_request("field 'tools' must be a list of tools")
    for i, tool in enumerate(tools):
        at = where or f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise bad_request(f"{at} must be an object with 'name' and 'input_schema'")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"{at}.name must be a non-empty string")
        if not isinstance(tool.get("input_schema"), Mapping):
            raise bad_request(f"{at}.input_schema must be an object (a JSON schema)")
        desc = tool.get("description")
        if desc is not None and not isinstance(desc, str):
            raise bad_request(f"{at}.description must be a string")


def _tool_choice(choice: Any) -> None:
    if choice is None:
        return
    if not isinstance(choice, Mapping) or choice.get("type") not in _TOOL_CHOICES:
        raise bad_request(
            f"field 'tool_choice' must be an object whose type is one of {', '.join(_TOOL_CHOICES)}"
        )
    if choice["type"] == "tool" and not (isinstance(choice.get("name"), str) and choice["name"]):
        raise bad_request("field 'tool_choice.name' is required when tool_choice.type is 'tool'")


# ---- conversion (vLLM's) ------------------------------------------------------------
def to_chat_body(
    body: Mapping[str, Any], *, merge_inline_system: bool = False, disabled_effort: str = "none"
) -> dict[str, Any]:
    """The chat-completions body vLLM builds from a validated Messages body: what its
    chat template renders (only the fields that reach the rendering are kept).

    `merge_inline_system`: vLLM merges system-role messages into the leading system
    message when the model's template refuses a system message after the first
    (`merges_inline_system`); otherwise they stay in place. `disabled_effort`: the
    reasoning effort vLLM sends for `thinking: {type: disabled}` ("none", or "low" for
    a template that ignores "none")."""
    messages: list[dict[str, Any]] = []
    system = _system_text(body, merge_inline_system)
    if system:
        messages.append({"role": "system", "content": system})
    for m in body["messages"]:
        role = _ROLE_ALIASES.get(m["role"], m["role"])
        if role == "system":
            if not merge_inline_system and (text := _inline_system(m["content"])):
                messages.append({"role": "system", "content": text})
            continue
        out: dict[str, Any] = {"role": role}
        content = m["content"]
        if isinstance(content, str):
            out["content"] = content
        else:
            _convert_blocks(content, role, out, messages)
        if not (role == "user" and "content" not in out):
            messages.append(out)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    effort = (body.get("output_config") or {}).get("effort")
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") == "disabled":
        effort = disabled_effort
    if effort is not None:
        chat["reasoning_effort"] = effort
    tools = _resolve_tools(body)
    if tools is not None:
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description"),
                    "parameters": _schema(t["input_schema"]),
                    "strict": t.get("strict"),
                    "defer_loading": t.get("defer_loading"),
                },
            }
            for t in tools
        ]
    return chat


def _resolve_tools(body: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """vLLM's `_resolve_tools`: tool_addition / tool_removal blocks (in system messages)
    applied in order to `tools`, giving the tools in effect at the end."""
    tools = body.get("tools")
    changes = [
        b
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] in _TOOL_CHANGES
    ]
    if not changes:
        return tools
    by_name = {t["name"]: t for t in tools or []}
    removed: set[str] = set()
    for b in changes:
        tool = b["tool"]
        if tool["type"] == "tool_definition":
            name = tool["definition"]["name"]
            by_name[name] = tool["definition"]
        else:
            name = tool["name"]
            if name not in by_name:
                raise bad_request(
                    f"{b['type']} references tool {name!r}, which is not declared in tools"
                )
            if b["type"] == "tool_addition":
                by_name[name] = {**by_name[name], "defer_loading": None}
        if b["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [t for n, t in by_name.items() if n not in removed]


def _schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's `AnthropicTool` validator: a schema without `type` gets `"object"`."""
    out = dict(schema)
    out.setdefault("type", "object")
    return out


def _system_text(body: Mapping[str, Any], merge_inline: bool) -> str:
    parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        parts.append(system)
    elif isinstance(system, list):
        parts.extend(_text_blocks(system))
    if merge_inline:
        for m in body["messages"]:
            if m["role"] == "system" and (text := _inline_system(m["content"])):
                parts.append(text)
    return "".join(parts)


def _inline_system(content: str | list[Mapping[str, Any]]) -> str | None:
    """vLLM's `_extract_system_text`: billing-header text dropped, here for a string too."""
    if isinstance(content, str):
        return None if content.startswith(_BILLING_HEADER) else content
    return "".join(_text_blocks(content)) or None


def _text_blocks(blocks: list[Mapping[str, Any]]) -> list[str]:
    return [
        b["text"]
        for b in blocks
        if b["type"] == "text" and b["text"] and not b["text"].startswith(_BILLING_HEADER)
    ]


def image_url(source: Mapping[str, Any]) -> str:
    """vLLM's `_convert_image_source_to_url`: a URL source as is, else a data: URL."""
    if source.get("type") == "url":
        return source.get("url", "")
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _convert_blocks(
    blocks: list[Mapping[str, Any]],
    role: str,
    out: dict[str, Any],
    messages: list[dict[str, Any]],
) -> None:
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for b in blocks:
        kind = b["type"]
        if kind == "text" and b["text"]:
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": image_url(b["source"])}})
        elif kind == "thinking":
            reasoning.append(b["thinking"])
        elif kind == "tool_use":
            calls.append(
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
                }
            )
        elif kind == "tool_result":
            if role == "user":
                _user_tool_result(b, messages)
            else:
                text = str(b.get("content")) if b.get("content") else ""
                parts.append({"type": "text", "text": f"Tool result: {text}"})
    if reasoning:
        out["reasoning"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    if parts:
        single = len(parts) == 1 and parts[0]["type"] == "text"
        out["content"] = parts[0]["text"] if single else parts


def _user_tool_result(block: Mapping[str, Any], messages: list[dict[str, Any]]) -> None:
    content = block.get("content")
    text = ""
    images: list[str] = []
    refs: list[dict[str, Any]] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        for item in content:
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image":
                url = image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    refs.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    messages.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        messages.append(
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": u}} for u in images],
            }
        )
    if refs:
        messages.append({"role": "tool", "tool_call_id": call_id, "content": refs})


# ---- what the EPP reads from a request ---------------------------------------------
def tools_text(chat: Mapping[str, Any]) -> str:
    """The tool definitions as the prompt carries them (a template writes them in as
    JSON): counted in the prompt estimate, so `--max-prompt-tokens` bounds them too."""
    tools = chat.get("tools")
    return json.dumps(tools, ensure_ascii=False) if tools else ""


def document_chars(body: Mapping[str, Any]) -> int:
    """The size of the document blocks' payloads: not in the converted prompt (see the
    module doc), but counted in the prompt estimate."""
    n = 0
    for m in body["messages"]:
        content = m["content"]
        if isinstance(content, list):
            for b in content:
                if b["type"] == "document":
                    src = b["source"]
                    data = src.get("data") or src.get("url") or src.get("content")
                    n += len(data) if isinstance(data, str) else len(json.dumps(data))
    return n
