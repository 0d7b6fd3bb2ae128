"""The OpenAI wire format as vLLM speaks it: request validation and response shapes.

Kept apart from the HTTP plumbing so the shapes can be checked (and reused) without a
server, and so the server module reads as control flow only.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from epp.media import PLACEHOLDER, MediaItem
from epp.sim import pd
from epp.sim.chat import ChatError, Renderer, media_items, render_default
from epp.sim.config import SimConfig
from epp.sim.tokenizer import shared_tokenizer
from epp.tokenizer import Tokenizer

if TYPE_CHECKING:
    from aiohttp import web

Kind = Literal["completion", "chat"]
# A media item's identifier and its placeholder tokens' offset and length in the prompt.
MMFeature = tuple[str, int, int]

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
    """A validated request: one entry of `prompts` (token ids) per choice to generate."""

    kind: Kind
    model: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    lora: str | None = None
    cache_salt: str | None = None
    kv_kind: pd.Kind = "none"
    kv_params: dict[str, Any] | None = None
    mm: tuple[MMFeature, ...] = ()  # media placeholders (chat requests with media)

    @property
    def prompt_tokens(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.prompts)


def parse(
    kind: Kind,
    body: Any,
    config: SimConfig,
    *,
    tokenizer: Tokenizer | None = None,
    render: Renderer = render_default,
    models: Collection[str] | None = None,
) -> InferenceRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    tok = tokenizer or shared_tokenizer(config.tokenizer)
    served = config.served_models if models is None else models
    model = body.get("model")
    if model is None:
        model = config.model  # vLLM serves the default model when none is named
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string")
    if model not in served:
        raise ApiError(404, f"The model `{model}` does not exist.")

    mm: tuple[MMFeature, ...] = ()
    if kind == "completion":
        prompts = _completion_prompts(body.get("prompt"), tok)
        max_tokens = _positive_int(body, "max_tokens")
    else:
        try:
            text = render(body.get("messages"))
        except ChatError as e:
            raise ApiError(400, str(e)) from None
        prompts = (tuple(tok.encode(text)),)
        mm = _mm_features(prompts[0], media_items(body["messages"]), tok)
        max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(
            body, "max_tokens"
        )
    vocab = getattr(tok, "vocab_size", 1 << 32)
    for ids in prompts:
        if not ids:
            raise ApiError(400, "The decoder prompt cannot be empty")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ApiError(400, f"Token id {max(ids)} is out of vocabulary")

    # Without a limit a real model stops on its own (EOS): report "stop" then.
    finish_reason = "length" if max_tokens is not None else "stop"
    max_tokens = max_tokens or config.default_max_tokens
    limit = config.model_len
    for ids in prompts:
        if len(ids) + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens."
                f" However, you requested {len(ids) + max_tokens} tokens ({len(ids)} in the"
                f" messages, {max_tokens} in the completion). Please reduce the length of the"
                " messages or completion.",
            )

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object")
    include_usage = bool(options.get("include_usage", False))
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError(400, "'cache_salt' must be a non-empty string")
    params = body.get("kv_transfer_params")
    try:
        kv_kind = pd.classify(params)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    return InferenceRequest(
        kind,
        model,
        prompts,
        max_tokens,
        finish_reason,
        stream,
        include_usage,
        lora=None if model == config.model else model,
        cache_salt=salt,
        kv_kind=kv_kind,
        kv_params=params,
        mm=mm,
    )


def _mm_features(
    ids: tuple[int, ...], items: list[MediaItem], tok: Tokenizer
) -> tuple[MMFeature, ...]:
    """(identifier, offset, length) of each media item's placeholder tokens in `ids`, as
    vLLM's `mm_features` place them (items in prompt order, placeholders left to right)."""
    if not items:
        return ()
    pattern = tuple(tok.encode(PLACEHOLDER))
    n = len(pattern)
    out: list[MMFeature] = []
    at = 0
    for item in items:
        while at + n <= len(ids) and ids[at : at + n] != pattern:
            at += 1
        if at + n > len(ids):
            break
        out.append((item.digest, at, n))
        at += n
    return tuple(out)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{key}' must be an integer")
    if value < 1:
        raise ApiError(400, f"{key} must be at least 1, got {value}.")
    return value


def _is_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _completion_prompts(prompt: Any, tok: Tokenizer) -> tuple[tuple[int, ...], ...]:
    """Token ids for each prompt: a string, token ids, or a batch of either."""
    if isinstance(prompt, str):
        return (tuple(tok.encode(prompt)),)
    if _is_ids(prompt):
        return (tuple(prompt),)
    if isinstance(prompt, list) and prompt:
        out = []
        for p in prompt:
            if isinstance(p, str):
                out.append(tuple(tok.encode(p)))
            elif _is_ids(p):
                out.append(tuple(p))
            else:
                break
        else:
            return tuple(out)
    raise ApiError(400, "'prompt' must be a string, a list of strings, or (lists of) token ids")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class ResponseBuilder:
    """Builds the bodies of one response; every chunk shares the id and timestamp.

    Streamed token chunks are the hot path with many servers in one process, so their
    JSON is a pre-rendered template with only the index, text and finish reason filled in.
    """

    def __init__(self, kind: Kind, model: str) -> None:
        self.kind = kind
        self.model = model
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
        head = json.dumps(self._head(obj))[:-1]  # without the closing brace
        if kind == "completion":
            self._chunk = head + ', "choices": [{"index": %d, "text": %s, '
        else:
            self._chunk = head + ', "choices": [{"index": %d, "delta": {"content": %s}, '
        self._chunk += '"logprobs": null, "finish_reason": %s, "stop_reason": null}]}'

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(
        self,
        texts: list[str],
        finish_reasons: list[str],
        usage_: dict[str, Any],
        kv_transfer_params: dict[str, Any] | None = None,
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
        return {
            **self._head(obj),
            "choices": choices,
            "usage": usage_,
            "kv_transfer_params": kv_transfer_params,
        }

    def chunk(
        self, index: int, text: str, first: bool, finish_reason: str | None
    ) -> dict[str, Any]:
        """One streamed token. The chat role rides on the first token's delta (not a
        separate empty chunk) so a stream has exactly one chunk per token."""
        return json.loads(self.chunk_json(index, text, first, finish_reason))

    def chunk_json(self, index: int, text: str, first: bool, finish_reason: str | None) -> str:
        if first and self.kind == "chat":
            choice = {
                "index": index,
                "delta": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
            return json.dumps({**self._head("chat.completion.chunk"), "choices": [choice]})
        reason = "null" if finish_reason is None else json.dumps(finish_reason)
        return self._chunk % (index, json.dumps(text), reason)

    # The SSE framing `OpenAIRoutes.stream` writes (epp.sim.messages has the same four).
    def sse_start(self, usage_: dict[str, Any]) -> str:
        return ""

    def sse_token(self, index: int, text: str, first: bool, finish_reason: str | None) -> str:
        return f"data: {self.chunk_json(index, text, first, finish_reason)}\n\n"

    def sse_end(self, finish_reason: str, usage_: dict[str, Any], include_usage: bool) -> str:
        usage_event = f"data: {json.dumps(self.usage_chunk(usage_))}\n\n" if include_usage else ""
        return usage_event + "data: [DONE]\n\n"

    def sse_error(self, status: int, message: str) -> str:
        return f"data: {json.dumps(error_body(status, message))}\n\ndata: [DONE]\n\n"

    def usage_chunk(self, usage_: dict[str, Any]) -> dict[str, Any]:
        obj = "text_completion" if self.kind == "completion" else "chat.completion.chunk"
        return {**self._head(obj), "choices": [], "usage": usage_}


def models_body(config: SimConfig, adapters: dict[str, str] | None = None) -> dict[str, Any]:
    """`GET /v1/models`: the base model, then every adapter (name -> path) as vLLM lists
    LoRA modules (root = the adapter's path, parent = the base model)."""
    created = int(time.time())
    entries = [(config.model, config.model, None)]
    for name, path in (adapters or {}).items():
        entries.append((name, path, config.model))
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": config.model_len,
        }
        for name, root, parent in entries
    ]
    return {"object": "list", "data": data}


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; a 400 ApiError if it is not JSON."""
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"Invalid JSON body: {e}") from None
