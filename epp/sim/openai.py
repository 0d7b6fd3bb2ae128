"""The OpenAI wire format as vLLM speaks it: request validation and response shapes.

Kept apart from the HTTP plumbing so the shapes can be checked (and reused) without a
server, and so the server module reads as control flow only.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from epp.sim.config import SimConfig
from epp.sim.tokenizer import count_tokens

Kind = Literal["completion", "chat"]

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error answered as vLLM does: HTTP status plus `{"error": {...}}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message)


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


@dataclass(frozen=True)
class InferenceRequest:
    """A validated request: one entry of `prompt_tokens` per choice to generate."""

    kind: Kind
    model: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool


def parse(kind: Kind, body: Any, config: SimConfig) -> InferenceRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if model is None:
        model = config.model  # vLLM serves the default model when none is named
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string")
    if model not in config.served_models:
        raise ApiError(404, f"The model `{model}` does not exist.")

    if kind == "completion":
        prompts = _completion_prompts(body.get("prompt"))
        max_tokens = _positive_int(body, "max_tokens")
    else:
        prompts = (count_tokens(render_chat(body.get("messages"))),)
        max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(
            body, "max_tokens"
        )

    # Without a limit a real model stops on its own (EOS): report "stop" then.
    finish_reason = "length" if max_tokens is not None else "stop"
    max_tokens = max_tokens or config.default_max_tokens
    for n in prompts:
        if n + max_tokens > config.kv_capacity_tokens:
            raise ApiError(
                400,
                f"This model's maximum context length is {config.kv_capacity_tokens} tokens."
                f" However, you requested {n + max_tokens} tokens ({n} in the messages,"
                f" {max_tokens} in the completion). Please reduce the length of the"
                " messages or completion.",
            )

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object")
    include_usage = bool(options.get("include_usage", False))
    return InferenceRequest(kind, model, prompts, max_tokens, finish_reason, stream, include_usage)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{key}' must be an integer")
    if value < 1:
        raise ApiError(400, f"{key} must be at least 1, got {value}.")
    return value


def _completion_prompts(prompt: Any) -> tuple[int, ...]:
    """Token counts for each prompt: a string, token ids, or a batch of either."""
    if isinstance(prompt, str):
        return (count_tokens(prompt),)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return (len(prompt),)
        counts = []
        for p in prompt:
            if isinstance(p, str):
                counts.append(count_tokens(p))
            elif isinstance(p, list) and p and all(isinstance(t, int) for t in p):
                counts.append(len(p))
            else:
                break
        else:
            return tuple(counts)
    raise ApiError(400, "'prompt' must be a string, a list of strings, or (lists of) token ids")


def render_chat(messages: Any) -> str:
    """Messages flattened through a minimal chat template, so role markers and the
    generation prompt cost tokens as they do with a real template."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list")
    parts = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, "each message must be an object with a string 'role'")
        parts.append(f"<|{message['role']}|>\n{_content_text(message.get('content'))}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ApiError(400, "each content part must be an object with a 'type'")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise ApiError(400, "a text content part needs a string 'text'")
                texts.append(part["text"])
            # Other parts (images, audio) carry no text; the sim ignores them.
        return "\n".join(texts)
    raise ApiError(400, "message 'content' must be a string or a list of content parts")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


class ResponseBuilder:
    """Builds the bodies of one response; every chunk shares the id and timestamp."""

    def __init__(self, kind: Kind, model: str) -> None:
        self.kind = kind
        self.model = model
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(
        self, texts: list[str], finish_reasons: list[str], usage_: dict[str, Any]
    ) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True)):
            if self.kind == "completion":
                choice = {"index": i, "text": text}
            else:
                choice = {"index": i, "message": {"role": "assistant", "content": text}}
            choice.update(logprobs=None, finish_reason=reason, stop_reason=None)
            choices.append(choice)
        obj = "text_completion" if self.kind == "completion" else "chat.completion"
        return {**self._head(obj), "choices": choices, "usage": usage_}

    def chunk(
        self, index: int, text: str, first: bool, finish_reason: str | None
    ) -> dict[str, Any]:
        """One streamed token. The chat role rides on the first token's delta (not a
        separate empty chunk) so a stream has exactly one chunk per token."""
        if self.kind == "completion":
            choice: dict[str, Any] = {"index": index, "text": text}
            obj = "text_completion"
        else:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": index, "delta": delta}
            obj = "chat.completion.chunk"
        choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
        return {**self._head(obj), "choices": [choice]}

    def usage_chunk(self, usage_: dict[str, Any]) -> dict[str, Any]:
        obj = "text_completion" if self.kind == "completion" else "chat.completion.chunk"
        return {**self._head(obj), "choices": [], "usage": usage_}


def models_body(config: SimConfig) -> dict[str, Any]:
    created = int(time.time())
    data = []
    for name in config.served_models:
        is_base = name == config.model
        data.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": name if is_base else f"/loras/{name}",
                "parent": None if is_base else config.model,
                "max_model_len": config.kv_capacity_tokens,
            }
        )
    return {"object": "list", "data": data}
