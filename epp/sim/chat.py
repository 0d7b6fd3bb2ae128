"""Chat messages to prompt text, before tokenizing.

The default rendering is `epp.request.render_chat` itself, fed the same per-message text
the EPP extracts (text parts joined, other parts dropped), so the EPP and the simulator
tokenize identical strings and their block hashes agree. A unit test pins the two
together.

Optionally (`--chat-template`), a Hugging Face Jinja chat template from a
`tokenizer_config.json` or a `.jinja` file renders the messages as `transformers` would
(`add_generation_prompt=True`). That needs `jinja2`, an optional dependency (the `hf`
extra); the EPP then sees other token ids unless it renders the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epp.request import render_chat

Renderer = Callable[[list[dict[str, Any]]], str]


class ChatError(ValueError):
    """A malformed `messages` list (answered 400)."""


def message_texts(messages: Any) -> list[dict[str, str]]:
    """`[{"role", "text"}]` from OpenAI messages, validated as the EPP validates them."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("'messages' must be a non-empty list")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ChatError(f"messages[{i}] must be an object with a string 'role'")
        if not message["role"]:
            raise ChatError(f"messages[{i}].role must be a non-empty string")
        out.append({"role": message["role"], "text": _content_text(message.get("content"), i)})
    return out


def _content_text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ChatError(f"messages[{i}].content[{j}] must be an object with a 'type'")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise ChatError(f"messages[{i}].content[{j}].text must be a string")
                parts.append(part["text"])
            # Other parts (images, audio) carry no text; neither the EPP nor the sim reads them.
        return "".join(parts)
    raise ChatError(f"messages[{i}].content must be a string or a list of content parts")


def render_default(messages: Any) -> str:
    return render_chat(message_texts(messages))


def load_renderer(spec: str | None) -> Renderer:
    """The renderer for `--chat-template` (None: the EPP's rendering)."""
    if not spec:
        return render_default
    return _jinja_renderer(Path(spec))


def _jinja_renderer(path: Path) -> Renderer:
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise RuntimeError("a Jinja chat template needs the 'jinja2' package") from e
    if path.is_dir():
        path = path / "tokenizer_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"chat template not found: {path}")
    specials: dict[str, str] = {}
    if path.suffix == ".json":
        config = json.loads(path.read_text())
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise ValueError(f"{path} has no chat_template")
        for key in ("bos_token", "eos_token"):
            token = config.get(key)
            specials[key] = token.get("content", "") if isinstance(token, dict) else token or ""
    else:
        template = path.read_text()

    def raise_exception(message: str) -> None:
        raise ChatError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)

    def render(messages: list[dict[str, Any]]) -> str:
        plain = [{"role": m["role"], "content": m["text"]} for m in message_texts(messages)]
        return compiled.render(messages=plain, add_generation_prompt=True, **specials)

    return render
