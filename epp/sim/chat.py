"""Chat messages to prompt text, before tokenizing.

The default rendering is `epp.request.render_chat` itself, fed the same per-message text
the EPP extracts (text parts joined, other parts dropped), so the EPP and the simulator
tokenize identical strings and their block hashes agree. A unit test pins the two
together.

Optionally (`--chat-template`), a Hugging Face Jinja chat template from a
`tokenizer_config.json`, a `.jinja` file or a model directory renders the messages as
vLLM would (`epp.chat_template`, `add_generation_prompt=True`; special tokens from the
`tokenizer_config.json` beside a `.jinja` file). That needs `jinja2`, an optional
dependency (the `hf` extra); the EPP renders the same way when its prefix producer's
`tokenizer` is the model's directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epp.chat_template import ChatTemplate, TemplateRenderError, special_tokens
from epp.errors import EppError
from epp.media import PLACEHOLDER, MediaItem, chat_part_media
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
            elif _media(part, f"messages[{i}].content[{j}]") is not None:
                # vLLM's placeholder tokens are the same for every item (the item's
                # identity goes into the block hashes: `media_items`, kvcache.py).
                parts.append(PLACEHOLDER)
        return "".join(parts)
    raise ChatError(f"messages[{i}].content must be a string or a list of content parts")


def _media(part: dict[str, Any], where: str) -> MediaItem | None:
    try:
        return chat_part_media(part, where)
    except EppError as e:
        raise ChatError(e.message) from None


def media_items(messages: list[dict[str, Any]]) -> list[MediaItem]:
    """The media items of validated messages, in prompt order: each one's digest is the
    identifier vLLM hashes into the blocks its placeholder covers (vLLM hashes the
    decoded media; the simulator, which decodes nothing, the payload or the URL)."""
    items = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                item = _media(part, "content")
                if item is not None:
                    items.append(item)
    return items


def render_default(messages: Any) -> str:
    return render_chat(message_texts(messages))


def load_renderer(spec: str | None) -> Renderer:
    """The renderer for `--chat-template` (None: the EPP's rendering)."""
    if not spec:
        return render_default
    return _jinja_renderer(Path(spec))


def _jinja_renderer(path: Path) -> Renderer:
    """The EPP's own vLLM-faithful renderer (`epp.chat_template`), so the simulator and
    the EPP agree on every chat token, content parts and roles included."""
    if path.is_dir():
        path = path / "tokenizer_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"chat template not found: {path}")
    if path.suffix == ".json":
        config = json.loads(path.read_text())
        template = (
            ChatTemplate.from_model_dir(path.parent)
            if path.name == "tokenizer_config.json"
            else None
        )
        if template is None:
            raw = config.get("chat_template")
            if isinstance(raw, list):  # named templates: take "default"
                raw = next((t["template"] for t in raw if t.get("name") == "default"), None)
            if not isinstance(raw, str):
                raise ValueError(f"{path} has no chat_template")
            template = ChatTemplate(raw, special_tokens(config), str(path))
    else:
        config_path = path.parent / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template = ChatTemplate(path.read_text(), special_tokens(config), str(path))

    def render(messages: list[dict[str, Any]]) -> str:
        message_texts(messages)  # the same validation (and 400s) as the plain rendering
        try:
            return template.render({"messages": messages})
        except TemplateRenderError as e:
            raise ChatError(f"chat template: {e}") from None

    render.template = template  # type: ignore[attr-defined]  # read by epp.sim.messages
    return render
