"""A chat request's prompt text, rendered by the model's own chat template as vLLM does.

Prefix routing by token ids only holds if the EPP cuts a chat request into the very
tokens the server caches. vLLM (0.32, `vllm/renderers/hf.py` + `renderers/chat_utils.py`)
renders `/v1/chat/completions` like this, and `ChatTemplate.render` follows it step by step:

1. messages → conversation (`parse_chat_messages`): content `None` → `""`; a string or a
   list of parts; the template's *content format* decides the shape: "string" (the
   default) joins the text parts with "\\n", "openai" (the template loops over
   `message['content']`) keeps `[{"type": "text", "text": ...}]`. Assistant `tool_calls`
   (their JSON `arguments` parsed to a dict, `{}` when empty or not an object), tool
   `tool_call_id`, a string `name`, and `reasoning` are carried over. A `developer`
   message becomes `system` when the template never names "developer", all system
   messages then merged into the first (`_consolidate_system_messages`).
2. tools → `tool.model_dump()` of vLLM's pydantic models: `{"type": "function",
   "function": {"name", "description": None, "parameters": None}}`, `strict` and
   `defer_loading` only when given.
3. template kwargs = the tokenizer's special tokens (`bos_token`, `eos_token`, ... as
   strings: transformers' `special_tokens_map`), then the request's
   `chat_template_kwargs`, then `add_generation_prompt` (default true),
   `continue_final_message`, `documents`, `reasoning_effort` (and `enable_thinking` =
   effort != "none" unless the kwargs set it) — vLLM's `build_chat_params`: request
   fields win over chat_template_kwargs unless None. A server's own
   `--chat-template` / `--default-chat-template-kwargs` are not visible to the EPP: point
   `tokenizer:` at a directory holding the template the server uses.
4. render in transformers' Jinja environment (`utils/chat_template_utils.py`: sandboxed,
   trim_blocks, lstrip_blocks, loopcontrols, its own `tojson`, `raise_exception`,
   `strftime_now`), with transformers' `continue_final_message` trick (a tag appended to
   the final message, the text cut there).

The rendered text is then tokenized WITHOUT special tokens (transformers'
`apply_chat_template(tokenize=True)` passes `add_special_tokens=False`): a template that
writes `{{ bos_token }}` gets exactly one BOS, one that does not gets none.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

_SPECIAL_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# vLLM detects the "openai" content format from the template's AST: a loop over a
# message's content. The same test on the source text (for m in message['content'] /
# message.content / message["content"]) covers the templates seen in practice.
_OPENAI_FORMAT = re.compile(
    r"\{%-?\s*for\s+\w+\s+in\s+\w+\s*(?:\[\s*['\"]content['\"]\s*\]|\.content\b)"
)


class TemplateRenderError(ValueError):
    """The template could not render this request (the caller falls back)."""


class ChatTemplate:
    """A model's chat template and special tokens, from its directory or files."""

    def __init__(self, source: str, special_tokens: Mapping[str, str], name: str = "") -> None:
        try:
            from jinja2 import ext
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as e:  # pragma: no cover - depends on the optional extra
            raise RuntimeError(
                "a chat template needs the 'jinja2' package: pip install 'epp[hf]'"
            ) from e

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(
                x,
                ensure_ascii=ensure_ascii,
                indent=indent,
                separators=separators,
                sort_keys=sort_keys,
            )

        def strftime_now(fmt: str) -> str:
            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self._compiled = env.from_string(source)
        except TemplateError as e:
            raise ValueError(f"chat template {name or ''} does not compile: {e}") from None
        self.source = source
        self.name = name
        self.special_tokens = dict(special_tokens)
        self.content_format = "openai" if _OPENAI_FORMAT.search(source) else "string"
        self.knows_developer = '"developer"' in source or "'developer'" in source

    @classmethod
    def from_model_dir(cls, directory: str | Path) -> ChatTemplate | None:
        """The template of a Hugging Face model directory: `chat_template.jinja` (what
        `save_pretrained` writes today) else `tokenizer_config.json`'s `chat_template`
        (a string, or named templates of which "default" is used); None if it has none."""
        d = Path(directory)
        config = _read_json(d / "tokenizer_config.json")
        specials = special_tokens(config)
        jinja = d / "chat_template.jinja"
        if jinja.is_file():
            return cls(jinja.read_text(encoding="utf-8"), specials, str(jinja))
        template = config.get("chat_template")
        if isinstance(template, list):
            template = next(
                (
                    t.get("template")
                    for t in template
                    if isinstance(t, dict) and t.get("name") == "default"
                ),
                None,
            )
        if isinstance(template, str):
            return cls(template, specials, str(d / "tokenizer_config.json"))
        return None

    # ---- what vLLM's Messages route probes the template for ---------------------
    @functools.cached_property
    def merges_inline_system(self) -> bool:
        """vLLM's `_detect_merge_inline_system`: a template that cannot render
        [system, user, system, user] (in a bare sandbox: no special tokens, no helper
        globals) gets a Messages request's inline system messages merged into the
        leading one (`epp.anthropic.to_chat_body`)."""
        from jinja2 import ext
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
        )
        probe = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
        try:
            env.from_string(self.source).render(messages=probe, add_generation_prompt=False)
        except TemplateError:
            return True
        return False

    @functools.cached_property
    def disabled_thinking_effort(self) -> str:
        """vLLM's `_probe_disabled_thinking_effort`: the reasoning effort a Messages
        request's `thinking: {type: disabled}` becomes: "none", or "low" when the
        template fails on "none" or renders it like some effort."""
        probe = {"messages": [{"role": "user", "content": "Hi"}]}
        try:
            none = self.render({**probe, "reasoning_effort": "none"})
            for effort in ("low", "medium", "high", "xhigh", "max"):
                if self.render({**probe, "reasoning_effort": effort}) == none:
                    return "low"
        except TemplateRenderError:
            return "low"
        return "none"

    # ---- rendering ----------------------------------------------------------
    def render(self, body: Mapping[str, Any]) -> str:
        """The prompt text vLLM renders for this chat request body; TemplateRenderError
        if the template (or the body's shape) does not allow it."""
        try:
            return self._render(body)
        except TemplateRenderError:
            raise
        except Exception as e:  # Jinja errors, raise_exception(), odd shapes in the body
            raise TemplateRenderError(f"{type(e).__name__}: {e}") from None

    def _render(self, body: Mapping[str, Any]) -> str:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise TemplateRenderError("messages must be a non-empty list")
        conversation = [self._message(m) for m in messages]
        _postprocess_tool_calls(conversation)
        if not self.knows_developer and any(m["role"] == "developer" for m in conversation):
            conversation = _consolidate_system(
                [_as_system(m) if m["role"] == "developer" else m for m in conversation]
            )
        kwargs: dict[str, Any] = dict(self.special_tokens)
        user = body.get("chat_template_kwargs")
        if isinstance(user, Mapping):
            kwargs.update(user)
        extra = {
            "add_generation_prompt": body.get("add_generation_prompt", True),
            "continue_final_message": body.get("continue_final_message", False),
            "documents": body.get("documents"),
            "reasoning_effort": body.get("reasoning_effort"),
        }
        effort = body.get("reasoning_effort")
        if effort is not None and not (isinstance(user, Mapping) and "enable_thinking" in user):
            extra["enable_thinking"] = effort != "none"  # vLLM: thinking on when asked for
        kwargs.update({k: v for k, v in extra.items() if v is not None and v != "auto"})
        tools = body.get("tools")
        tool_schemas = [_tool(t) for t in tools] if isinstance(tools, list) else None
        documents = kwargs.pop("documents", None)
        add_generation_prompt = bool(kwargs.pop("add_generation_prompt", False))
        continue_final = kwargs.pop("continue_final_message", False)
        for reserved in ("messages", "tools", "chat_template", "tokenize", "return_dict"):
            kwargs.pop(reserved, None)
        if continue_final:
            return self._render_continued(
                conversation, tool_schemas, documents, add_generation_prompt, continue_final, kwargs
            )
        return self._compiled.render(
            messages=conversation,
            tools=tool_schemas,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    def _render_continued(self, chat, tools, documents, add_gen, field, kwargs) -> str:
        """transformers' continue_final_message: tag the final message, cut there."""
        if add_gen:
            raise TemplateRenderError(
                "continue_final_message and add_generation_prompt cannot both be true"
            )
        field = field if isinstance(field, str) else "content"
        if field not in self.source:  # transformers refuses the same way
            raise TemplateRenderError(f"continue_final_message: the template never uses {field!r}")
        chat = copy.deepcopy(chat)
        final = chat[-1].get(field)
        if final is None:
            raise TemplateRenderError(f"the final message has no {field!r} to continue")
        if isinstance(final, list):
            for block in reversed(final):
                if isinstance(block, dict) and "text" in block:
                    final = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise TemplateRenderError("no text to continue in the final message")
        else:
            chat[-1][field] = final + _CONTINUE_TAG
        text = self._compiled.render(
            messages=chat, tools=tools, documents=documents, add_generation_prompt=False, **kwargs
        )
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise TemplateRenderError("the template drops the final message it should continue")
        at = text.rindex(tag)
        if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return text[:at]
        return text[:at].rstrip()

    def _message(self, m: Any) -> dict[str, Any]:
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise TemplateRenderError("each message needs a string 'role'")
        role = m["role"]
        content = m.get("content")
        parts: list[Any] = []
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = content
        elif content is not None:
            raise TemplateRenderError("content must be a string or a list of parts")
        texts = [_part_text(p) for p in parts]
        texts = [t for t in texts if t is not None]
        if self.content_format == "openai":
            out: dict[str, Any] = {
                "role": role,
                "content": [{"type": "text", "text": t} for t in texts],
            }
        else:
            out = {"role": role, "content": "\n".join(texts)}
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                out["tool_calls"] = copy.deepcopy(list(calls))
            if m.get("reasoning") is not None:
                out["reasoning"] = out["reasoning_content"] = m["reasoning"]
        elif role == "tool":
            if "tool_call_id" in m:
                out["tool_call_id"] = m["tool_call_id"]
            if isinstance(out["content"], list):  # vLLM flattens text-only tool results
                out["content"] = "\n".join(p["text"] for p in out["content"])
        if isinstance(m.get("name"), str):
            out["name"] = m["name"]
        if role == "developer":
            out["tools"] = m.get("tools")
        return out


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens a template sees, as strings (a config may write
    `{"content": "<s>", ...}` objects)."""
    out: dict[str, str] = {}
    for key in _SPECIAL_KEYS:
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            out[key] = token
    return out


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _part_text(part: Any) -> str | None:
    """A part's text (a bare string counts as text); None for images and other media,
    which carry no text the EPP can render (vLLM would insert a model-specific
    placeholder: see the fallback in `epp.prompt_tokens`)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        raise TemplateRenderError("a content part must be an object")
    kind = part.get("type")
    if kind in ("text", "input_text") and isinstance(part.get("text"), str):
        return part["text"]
    raise TemplateRenderError(f"content part of type {kind!r} is not rendered by the EPP")


def _tool(tool: Any) -> dict[str, Any]:
    """vLLM's `ChatCompletionToolsParam(...).model_dump()`."""
    if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
        raise TemplateRenderError("each tool needs a 'function' object")
    f = tool["function"]
    if not isinstance(f.get("name"), str):
        raise TemplateRenderError("each tool function needs a string 'name'")
    fn: dict[str, Any] = {
        "name": f["name"],
        "description": f.get("description"),
        "parameters": f.get("parameters"),
    }
    defer = f.get("defer_loading", tool.get("defer_loading"))
    if f.get("strict") is not None:
        fn["strict"] = f["strict"]
    if defer is not None:
        fn["defer_loading"] = defer
    out: dict[str, Any] = {"type": tool.get("type", "function"), "function": fn}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


def _postprocess_tool_calls(conversation: list[dict[str, Any]]) -> None:
    """vLLM's `_postprocess_messages`: tool-call arguments become dicts."""
    for m in conversation:
        if m["role"] != "assistant" or "tool_calls" not in m:
            continue
        calls = m["tool_calls"]
        if not calls:
            m.pop("tool_calls")
            continue
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                raise TemplateRenderError("assistant tool_calls entries need a 'function'")
            args = fn.get("arguments")
            if not args:
                fn["arguments"] = {}
                continue
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    args = None
            fn["arguments"] = args if isinstance(args, dict) else {}


def _as_system(m: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `_convert_developer_to_system`: role system, its `tools` dropped."""
    out = {**m, "role": "system"}
    out.pop("tools", None)
    return out


def _consolidate_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's `_consolidate_system_messages`: every system message merged into one first."""
    texts: list[str] = []
    rest: list[dict[str, Any]] = []
    needed = False
    for i, m in enumerate(conversation):
        if m["role"] != "system":
            rest.append(m)
            continue
        if i > 0 or texts:
            needed = True
        content = m.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else p
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            texts.append(content)
    if not needed:
        return conversation
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]
